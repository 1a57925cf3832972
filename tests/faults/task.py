"""One try of one task of a pipeline run, as a process of its own (as an Airflow
worker runs it), doing exactly the work of the DAG's task (`exactly_once.orchestration.tasks`):

    python -m tests.faults.task begin --pipeline P --run-id R --interval-end ISO [--reprocess]
    python -m tests.faults.task increment --pipeline P --checkpoint-id N
    python -m tests.faults.task commit --pipeline P --checkpoint-id N --try T
    python -m tests.faults.task publish --pipeline P [--transaction-timeout-ms MS] [--batch-rows N]

The last line of stdout is the task's result as JSON; on failure (exit status 1) it
is `{"error": ..., "outcome": "retry" | "fail"}`, what `exactly_once.orchestration.outcomes` tells the
DAG to do, so the runner retries exactly what Airflow would. Faults come from
EXACTLY_ONCE_FAULTS in the environment, set per try by the runner.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from datetime import datetime

import psycopg2

from exactly_once.connections import PIPELINE_DB_JOB, SPARK, pipeline_db_url
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.protocol import Ledger
from exactly_once.orchestration.outcomes import TaskOutcome, after_begin, after_error
from exactly_once.orchestration.tasks import begin_checkpoint, commit_checkpoint, publish_outbox, run_increment
from exactly_once.spark.runners import job_runner
from exactly_once.spark.settings import JobSettings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=["begin", "increment", "commit", "publish"])
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--run-id")
    parser.add_argument("--interval-end", type=datetime.fromisoformat)
    parser.add_argument("--checkpoint-id", type=int)
    parser.add_argument("--try", dest="try_number", type=int, default=1)
    parser.add_argument("--reprocess", action="store_true", help="the run's `reprocess` parameter")
    parser.add_argument("--transaction-timeout-ms", type=int, help="the publisher's (default: the Publisher's)")
    parser.add_argument("--batch-rows", type=int, help="records per Kafka transaction of the publisher (default: "
                                                       "the Publisher's)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    try:
        result = run(args)
    except Exception as error:
        logging.exception("task %s failed", args.task)
        print(json.dumps({"error": str(error), "outcome": after_error(error).value}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


def run(args: argparse.Namespace) -> dict:
    # The local stack's plaintext Kafka listener and its database as the commit role (LOCAL_CLIENTS),
    # as a worker's connections; the job gets the job role's (pipeline_db_job), as IncrementOperator does.
    settings = JobSettings(pipeline_db_url(PIPELINE_DB_JOB), KafkaClient.at(os.environ["KAFKA_BOOTSTRAP_SERVERS"]))
    ledger = Ledger.of_registered(args.pipeline, lambda: psycopg2.connect(os.environ["PIPELINE_DB_URL"]))
    if args.task == "begin":
        with KafkaOffsets(settings.kafka) as kafka:
            # What an earlier run left unpublished is published first, before planning, as the DAG's begin does.
            begun = begin_checkpoint(ledger, kafka, args.run_id, None, args.interval_end, reprocess=args.reprocess,
                                     publish_with=settings.kafka)
        return {"checkpoint": begun.checkpoint.id, "state": begun.checkpoint.state.value,
                "empty": after_begin(begun) is TaskOutcome.SKIP}
    if args.task == "increment":
        # What IncrementOperator does, on the Spark connection of the environment (AIRFLOW_CONN_SPARK_DEFAULT).
        runner = job_runner(SPARK, f"{args.pipeline} increment", ledger.config, settings)
        return {"attempt": run_increment(ledger, args.checkpoint_id, runner)}
    if args.task == "publish":
        options = {"transaction_timeout_ms": args.transaction_timeout_ms, "batch_rows": args.batch_rows}
        published = publish_outbox(ledger, settings.kafka, **{k: v for k, v in options.items() if v is not None})
        return {"published": {sink.sink: {"records": sink.records, "transactions": sink.transactions}
                              for sink in published}}
    return {"outcome": commit_checkpoint(ledger, args.checkpoint_id, args.try_number).value}


if __name__ == "__main__":
    sys.exit(main())
