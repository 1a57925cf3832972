"""Smoke job for the local stack: reads a bounded Kafka range with read_committed
and records how many records it saw in PostgreSQL, through JDBC.

    spark-submit exactly_once_stack/smoke/job.py --topic T --ranges '{"0": [0, 10]}' --run-id R

The database comes from PIPELINE_DB_URL (a libpq URI), never from code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins"))  # the library, in the project root
from exactly_once.db import jdbc_options  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topic", required=True)
    parser.add_argument("--ranges", required=True, help='{"partition": [from, to)} as JSON')
    parser.add_argument("--run-id", required=True)
    args = parser.parse_args()
    ranges = json.loads(args.ranges)

    spark = SparkSession.builder.appName(f"stack_smoke {args.run_id}").getOrCreate()
    records = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", os.environ["KAFKA_BOOTSTRAP_SERVERS"])
        .option("kafka.isolation.level", "read_committed")
        .option("failOnDataLoss", "true")
        .option("assign", json.dumps({args.topic: [int(p) for p in ranges]}))
        .option("startingOffsets", json.dumps({args.topic: {p: r[0] for p, r in ranges.items()}}))
        .option("endingOffsets", json.dumps({args.topic: {p: r[1] for p, r in ranges.items()}}))
        .load()
    )
    seen = records.count()
    row = spark.createDataFrame([(args.run_id, args.topic, seen)], "run_id string, topic string, records long")
    (row.write.format("jdbc").options(**jdbc_options(os.environ["PIPELINE_DB_URL"]))
        .option("dbtable", "stack_smoke_counts").mode("append").save())
    print(f"stack_smoke: {seen} committed records in {ranges} of {args.topic}")
    spark.stop()


if __name__ == "__main__":
    main()
