"""What the exactly-once increment job is measured against: Spark applications over the
same records as a checkpoint, each writing its timing to a JSON report.

    spark-submit tests/benchmarks/peers.py kafka-read RANGES --report FILE
    spark-submit tests/benchmarks/peers.py at-least-once RANGES --pipeline P --topic T --schema S --report FILE
    spark-submit tests/benchmarks/peers.py streaming-copy RANGES --pipeline P --topic T --schema S \
        --checkpoint-dir DIR --report FILE

RANGES is the checkpoint's ranges as JSON, [[topic, partition, start, end], …].

- kafka-read: the ranges through Spark's Kafka source into the `noop` sink: the read's floor.
- at-least-once: the increment job without the protocol: the same parse, transform and
  sink preparation (exactly_once.spark.increment), written with the same COPY writer straight
  into the final tables of the demo pipeline's copy in schema S, and bad records into
  S.dead_letters. No ledger, no staging, no counts, no pre-commit or commit: a rerun would
  count records twice.
- streaming-copy: Structured Streaming, Trigger.AvailableNow + foreachBatch from the ranges'
  start offsets (all the topic holds), each batch written as the at-least-once job writes
  its records (the same frames, the same COPY writer), so that the comparison measures the
  protocol, not the writer nor the Spark work.

Structured Streaming as its users write it (Spark's JDBC writer, no row checks, no dead
letters), the benchmark's `streaming` peer, is tests/benchmarks/user_streaming.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import psycopg2
from psycopg2 import sql
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from exactly_once.catalog import ColumnType, column_types
from exactly_once.config import PipelineConfig
from exactly_once.db import jdbc_options
from exactly_once.kafka_client import KafkaClient
from exactly_once.kafka_columns import KAFKA_TOMBSTONE
from exactly_once.ledger.planning import OffsetRange
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.tables import DEAD_LETTERS
from exactly_once.spark.copy_writer import write_copy
from exactly_once.spark.frames import attempt_frames, parse
from exactly_once.spark.increment import KAFKA_COLUMNS, kafka_source_options, read_ranges
from exactly_once_demo.pipeline import config as demo_config

Writer = Callable[[DataFrame, str, list[ColumnType]], None]  # appends a frame to a table of these columns


def write_with_copy(frame: DataFrame, table: str, columns: list[ColumnType]) -> None:
    """The increment job's COPY writer (exactly_once.spark.staging)."""
    write_copy(frame, table, jdbc_options(os.environ["PIPELINE_DB_URL"]), {c.name: c.base for c in columns})


def write_final(records: DataFrame, config: PipelineConfig, schema: str,
                columns: dict[str, list[ColumnType]], write: Writer) -> None:
    """Parses the records once (cached, as the increment job does), checks them as it does,
    and writes every sink's rows into its final table; `columns` has the dead letters' too."""
    parsed = parse(records, config).persist(StorageLevel.MEMORY_AND_DISK)
    frames = attempt_frames(parsed, config, columns)
    try:
        for name, frame in frames.staging(any_refused=frames.refused.count() > 0).items():
            table = f"{schema}.dead_letters" if name == DEAD_LETTERS else config.sink(name).table
            # An upsert sink's rows carry staging's tombstone mark, which no final table has
            # (the demo has no tombstones: it is always false).
            write(frame.drop(KAFKA_TOMBSTONE), table, columns[name])
    finally:
        frames.release()
        parsed.unpersist()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peer", choices=["kafka-read", "at-least-once", "streaming-copy"])
    parser.add_argument("ranges", type=lambda text: tuple(OffsetRange(*r) for r in json.loads(text)))
    parser.add_argument("--pipeline", help="the pipeline name the dead letters carry")
    parser.add_argument("--topic")
    parser.add_argument("--schema", help="schema of the final tables this peer writes")
    parser.add_argument("--checkpoint-dir", help="streaming: the query's checkpoint location (new)")
    parser.add_argument("--report", type=Path, required=True)
    args = parser.parse_args()

    spark = SparkSession.builder.appName(f"benchmark peer {args.peer}").getOrCreate()
    report = {}
    try:
        servers = KafkaClient.at(os.environ["KAFKA_BOOTSTRAP_SERVERS"])  # the local stack (LOCAL_CLIENTS)
        if args.peer != "kafka-read":
            config = demo_config(args.pipeline, args.topic, args.schema)
            # the catalog only: no ledger rows
            columns = Ledger(config, lambda: psycopg2.connect(os.environ["PIPELINE_DB_URL"])).final_columns()
            with closing(psycopg2.connect(os.environ["PIPELINE_DB_URL"])) as conn, conn.cursor() as cur:
                columns[DEAD_LETTERS] = column_types(cur, sql.Identifier(args.schema, "dead_letters"))
            write = write_with_copy
        started = time.perf_counter()
        if args.peer == "kafka-read":
            read_ranges(spark, servers, args.ranges).write.format("noop").mode("overwrite").save()
        elif args.peer == "at-least-once":
            write_final(read_ranges(spark, servers, args.ranges), config, args.schema, columns, write)
        else:
            batches = []

            def each_batch(batch: DataFrame, batch_id: int) -> None:
                batches.append(batch_id)
                write_final(batch, config, args.schema, columns, write)

            options = kafka_source_options(servers, args.ranges)
            del options["endingOffsets"]  # a stream has no end: AvailableNow stops at what is there
            query = (spark.readStream.format("kafka").options(**options).load().select(*KAFKA_COLUMNS)
                     .writeStream.trigger(availableNow=True).option("checkpointLocation", args.checkpoint_dir)
                     .foreachBatch(each_batch).start())
            query.awaitTermination()
            report["batches"] = len(batches)
        report["seconds"] = time.perf_counter() - started
    finally:
        spark.stop()
    args.report.write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
