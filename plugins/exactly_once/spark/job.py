"""The Spark application of one checkpoint attempt, whatever runs it: `jobs/increment.py`
under spark-submit (local, a standalone master, YARN, Kubernetes), or the Airflow task
itself as a Spark Connect client (`exactly_once.spark.runners`). Both give it the same
arguments:

    --pipeline NAME --checkpoint-id N --attempt T --settings FILE [--report FILE]

It reads the configuration its attempt was started with and the checkpoint's frozen
ranges from the ledger, writes staging and pre-commits (`exactly_once.spark.increment.execute_attempt`,
which records a failure and whether a retry may help on the attempt). The pipeline
database and the Kafka client config come from FILE, which the submitting task writes
from its Airflow connections (`exactly_once.spark.settings`). Exit status: 0 pre-committed,
3 fenced (a newer attempt owns the checkpoint), 1 failed; the task that started it reads
the same verdicts from the ledger. `--report FILE` also writes what the attempt did
(records, rows per sink, seconds per phase) to FILE as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import psycopg2
from pyspark.sql import SparkSession

from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.refusals import Fenced
from exactly_once.spark.increment import execute_attempt
from exactly_once.spark.settings import JobSettings

FENCED = 3


def arguments_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="increment", description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--checkpoint-id", type=int, required=True)
    parser.add_argument("--attempt", type=int, required=True, help="the attempt's fencing token")
    parser.add_argument("--settings", type=Path, required=True,
                        help="the pipeline database and Kafka client config, from the submitting task")
    parser.add_argument("--report", type=Path, help="write the attempt's report here as JSON")
    return parser


def run(arguments: list[str], session: Callable[[str], SparkSession]) -> int:
    """Runs the attempt in `session(application name)`, stopped at the end; the exit status."""
    args = arguments_parser().parse_args(arguments)
    settings = JobSettings.take(args.settings)
    ledger = Ledger.of_attempt(args.pipeline, args.checkpoint_id, args.attempt,
                               lambda: psycopg2.connect(settings.db_url))
    spark = session(f"{args.pipeline} checkpoint {args.checkpoint_id}/{args.attempt}")
    try:
        report = execute_attempt(spark, ledger, args.checkpoint_id, args.attempt, settings.kafka, settings.db_url,
                                 settings.schema_registry)
    except Fenced as fenced:
        print(f"fenced: {fenced}", file=sys.stderr)
        return FENCED
    finally:
        spark.stop()
    if args.report:
        args.report.write_text(json.dumps(asdict(report)))
    return 0


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(sys.argv[1:], lambda name: SparkSession.builder.appName(name).getOrCreate())
