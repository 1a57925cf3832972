"""Where the increment job's "read + parse, cached" phase goes: in one warm Spark application
(local[2], the stack's connector jars), over N demo orders produced to a topic of their own
(transactions of 50,000, every 7th aborted), the job's own read of all of them
(`read_ranges`: read_committed, headers, tasks of at most 250,000 offsets), each step added
in turn, every variant run twice in rotation; prints seconds and the driver's heap limit.
Figures, not tests.

    ./dev setup && PYTHONPATH=plugins .venv/bin/python -m tests.benchmarks.read_phases 5000000

Starts the local stack if it is not running and stops what it started.
"""

from __future__ import annotations

import os
import sys
import time

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from exactly_once_stack import lifecycle
from exactly_once_stack.settings import SPARK_MASTER, process_environment

ROUNDS = 2


def main(orders: int) -> None:
    started = lifecycle.up()
    os.environ.update(process_environment())
    from exactly_once.kafka_client import KafkaClient
    from exactly_once.ledger.kafka_offsets import KafkaOffsets
    from exactly_once.ledger.planning import OffsetRange
    from exactly_once.spark.frames import parse
    from exactly_once.spark.increment import kafka_source_options, read_ranges
    from exactly_once_demo.pipeline import config as demo_config
    from exactly_once_demo.produce import produce
    from tests.benchmarks import copies
    from tests.benchmarks.throughput import PER_TRANSACTION

    servers = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    topic = f"bench_read_{orders}"
    config = demo_config(topic, topic, topic)
    kafka = KafkaClient.at(servers)
    spark = SparkSession.builder.master(SPARK_MASTER).appName("read phases benchmark").getOrCreate()
    try:
        copies.delete_topic(servers, topic)
        produce(servers, orders, seed=orders, topic=topic, per_transaction=PER_TRANSACTION)
        with KafkaOffsets(kafka) as offsets:
            ranges = tuple(OffsetRange(topic, p, 0, offsets.offsets(topic, p, None, None).last_stable)
                           for p in offsets.partitions(topic))

        def read() -> DataFrame:
            return read_ranges(spark, kafka, ranges)

        def without_headers() -> DataFrame:
            options = {**kafka_source_options(kafka, ranges), "includeHeaders": "false"}
            return spark.read.format("kafka").options(**options).load()

        def cached(level: StorageLevel) -> float:
            frame = parse(read(), config).persist(level)
            began = time.perf_counter()
            frame.count()
            seconds = time.perf_counter() - began
            frame.unpersist(blocking=True)
            return seconds

        def noop(frame: DataFrame) -> float:
            began = time.perf_counter()
            frame.write.format("noop").mode("overwrite").save()
            return time.perf_counter() - began

        variants = {
            "read, no headers → noop": lambda: noop(without_headers()),
            "read (the job's) → noop": lambda: noop(read()),
            "read → parse → noop": lambda: noop(parse(read(), config)),
            "read → parse → cache MEMORY_AND_DISK → count (the job's)": lambda: cached(StorageLevel.MEMORY_AND_DISK),
            "read → parse → cache DISK_ONLY → count": lambda: cached(StorageLevel.DISK_ONLY),
        }
        noop(read())  # the application's first query warms the JVM
        seconds = {name: [] for name in variants}
        for round_ in range(ROUNDS):
            for name, run in variants.items():
                seconds[name].append(run())
                print(f"round {round_ + 1}: {name}: {seconds[name][-1]:.2f} s", flush=True)
        heap = spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory()
        print(f"\n{orders:,} orders, {sum(r.end for r in ranges):,} offsets; Spark {SPARK_MASTER}, driver heap limit "
              f"{heap / 2**20:,.0f} MiB; {os.cpu_count()} cores\n")
        print("| one warm application | " + " | ".join(f"round {i + 1}" for i in range(ROUNDS)) + " |")
        print("|---|" + "---:|" * ROUNDS)
        for name, values in seconds.items():
            print(f"| {name} | " + " | ".join(f"{v:.2f} s" for v in values) + " |")
    finally:
        spark.stop()
        copies.delete_topic(servers, topic)
        lifecycle.down(started)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5_000_000)
