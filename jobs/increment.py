"""The Spark application of one checkpoint attempt (submitted by the pipeline DAG):

    spark-submit jobs/increment.py --pipeline NAME --checkpoint-id N --attempt T --settings FILE

It reads the configuration its attempt was started with and the checkpoint's frozen
ranges from the ledger, writes staging and pre-commits (`exactly_once.increment.execute_attempt`,
which records a failure and whether a retry may help on the attempt). The pipeline
database and the Kafka client config come from FILE, which the submitting task writes
from its Airflow connections (`exactly_once.job_settings`). Exit status:
0 pre-committed, 3 fenced (a newer attempt owns the checkpoint), 1 failed; the task
that submitted it reads the same verdicts from the ledger. `--report FILE` also writes
what the attempt did (records, rows per sink, seconds per phase) to FILE as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path

from pyspark.sql import SparkSession

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))  # the library, beside jobs/
import psycopg2  # noqa: E402

from exactly_once.errors import Fenced  # noqa: E402
from exactly_once.increment import execute_attempt  # noqa: E402
from exactly_once.job_settings import JobSettings  # noqa: E402
from exactly_once.protocol import Ledger  # noqa: E402

FENCED = 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--checkpoint-id", type=int, required=True)
    parser.add_argument("--attempt", type=int, required=True, help="the attempt's fencing token")
    parser.add_argument("--settings", type=Path, required=True,
                        help="the pipeline database and Kafka client config, from the submitting task")
    parser.add_argument("--report", type=Path, help="write the attempt's report here as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    settings = JobSettings.take(args.settings)
    ledger = Ledger.of_attempt(args.pipeline, args.checkpoint_id, args.attempt,
                               lambda: psycopg2.connect(settings.db_url))
    spark = SparkSession.builder.appName(f"{args.pipeline} checkpoint {args.checkpoint_id}/{args.attempt}") \
        .getOrCreate()
    try:
        report = execute_attempt(spark, ledger, args.checkpoint_id, args.attempt, settings.kafka,
                                 settings.db_url)
    except Fenced as fenced:
        print(f"fenced: {fenced}", file=sys.stderr)
        return FENCED
    finally:
        spark.stop()
    if args.report:
        args.report.write_text(json.dumps(asdict(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
