"""What a record-isolation probe of a few records costs after a failing one, with the
transform's Python UDF Arrow-optimized (PySpark 4.2's default) and not: a task that raises
loses its Python worker, and the next probe's tasks get fresh ones, which prepare what the
UDF's evaluation needs (pyarrow, for an Arrow-optimized one). In one warm
application (local[2]) over 900,000 cached rows in 6 partitions, each round probes (into the
noop sink) a part holding a row the UDF raises on, then a passing part, then another
passing part, for both kinds of UDF in turn; prints medians and every round. Once with
the warm daemon a local job of the pipeline gets (`exactly_once.spark.warm_daemon`: pandas
and pyarrow imported before it forks a worker), then once with PySpark's daemon, each in an
application of its own. Figures, not tests.

    ./dev setup && PYTHONPATH=plugins .venv/bin/python -m tests.benchmarks.udf_workers
"""

from __future__ import annotations

import os
import statistics
import time

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from exactly_once.spark.warm_daemon import DAEMON_MODULE
from exactly_once.spark.warm_daemon import MODULE as WARM
from exactly_once_stack.settings import SPARK_MASTER, process_environment

ROWS, PARTITIONS, ROUNDS = 900_000, 6, 8
RAISES = "raise-"


def price(order_id, qty):  # no type hints: they would make it a pandas UDF
    if order_id.startswith(RAISES):
        raise ValueError(f"cannot price order {order_id}")
    return qty * 2


def seconds(frame: DataFrame) -> float:
    began = time.perf_counter()
    try:
        frame.write.format("noop").mode("overwrite").save()
    except Exception:  # the failing probe: its time is what is measured
        pass
    return time.perf_counter() - began


def main() -> None:
    os.environ.update(process_environment())
    for daemon in (WARM, "pyspark.daemon"):  # the warm one first: what warms the JVM favours the other
        measure(daemon)


def measure(daemon: str) -> None:
    spark = (SparkSession.builder.master(SPARK_MASTER).appName("udf workers benchmark")
             .config(DAEMON_MODULE, daemon).getOrCreate())
    try:
        rows = spark.range(0, ROWS, 1, PARTITIONS).select(
            F.col("id").alias("offset"),
            F.when(F.col("id") == 5, F.lit(f"{RAISES}5")).otherwise(F.format_string("o-%d", "id")).alias("order_id"),
            (F.col("id") % 7).alias("qty")).persist(StorageLevel.MEMORY_AND_DISK)
        rows.count()
        udfs = {"Arrow-optimized (PySpark 4.2's default)": F.udf(price, "long", useArrow=True),
                "pickled rows (useArrow=False)": F.udf(price, "long", useArrow=False)}

        def probe(udf, first: int) -> DataFrame:
            return rows.where(F.col("offset").between(first, first + 10)).select(udf("order_id", "qty"))

        figures = {name: {"failing": [], "passing, after a failing one": [], "passing, after a passing one": []}
                   for name in udfs}
        for round_ in range(ROUNDS):
            for name, udf in udfs.items():
                figures[name]["failing"].append(seconds(probe(udf, 0)))
                figures[name]["passing, after a failing one"].append(seconds(probe(udf, 20_000 + round_ * 100)))
                figures[name]["passing, after a passing one"].append(seconds(probe(udf, 40_000 + round_ * 100)))
        print(f"\n{ROWS:,} cached rows in {PARTITIONS} partitions, Spark {SPARK_MASTER}, {os.cpu_count()} cores, "
              f"Python workers from {daemon}; probes of 11 rows into the noop sink; medians of {ROUNDS} rounds "
              "[each round]\n")
        print("| the UDF | probe | seconds |\n|---|---|---:|")
        for name, probes in figures.items():
            for probe_kind, values in probes.items():
                print(f"| {name} | {probe_kind} | {statistics.median(values):.2f} "
                      f"[{', '.join(f'{v:.2f}' for v in values)}] |")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
