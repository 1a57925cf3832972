"""`python -m exactly_once reprocess DAG_FILE_OR_PIPELINE CHECKPOINT_ID`: one committed
checkpoint reprocessed from the command line with the configuration of a DAG file as
deployed (or as last registered), through the run path of a pipeline run's tasks — begin
the reprocessing, one attempt of the Spark job on the `spark_default` connection
(exactly_once.spark.runners), commit, publish (kafka sinks) — and what the commit replaced, per sink."""

from __future__ import annotations

import getpass
import json
from contextlib import closing
from datetime import datetime, timezone

from exactly_once import connections
from exactly_once.config import PipelineConfig
from exactly_once.errors import PipelineError
from exactly_once.ledger import replays
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.rows import pipeline_of
from exactly_once.orchestration import tasks
from exactly_once.spark.runners import job_runner, job_settings


def reprocess(configs: list[PipelineConfig], checkpoint_id: int) -> int:
    """Exit status 0 once the reprocessing committed; 1 with the error otherwise."""
    connect = connections.for_command_line(connections.connector)
    with closing(connect()) as conn, conn.cursor() as cur:
        pipeline = pipeline_of(cur, checkpoint_id)
    [config] = [c for c in configs if c.name == pipeline] or [None]
    if config is None:
        print(f"checkpoint {checkpoint_id} is of pipeline {pipeline!r}, which the target does not hold "
              f"({', '.join(c.name for c in configs)})")
        return 1
    ledger = Ledger(config, connect)
    requested_by = f"cli {getpass.getuser()} {datetime.now(timezone.utc).isoformat(timespec='seconds')}"
    runner = connections.for_command_line(lambda: job_runner(  # the connections first: nothing begun if unusable
        connections.SPARK, f"{config.name} reprocess", config,
        job_settings(config)))
    try:
        reprocessing = tasks.reprocess_checkpoint(ledger, checkpoint_id, requested_by).checkpoint.id
        tasks.run_increment(ledger, reprocessing, runner)
        tasks.commit_checkpoint(ledger, reprocessing, 1)
        tasks.publish_outbox(ledger, connections.kafka_client())  # a kafka sink's new records
    except PipelineError as failed:
        print(f"checkpoint {checkpoint_id} not reprocessed: {failed}")
        return 1
    print(f"checkpoint {checkpoint_id} reprocessed by checkpoint {reprocessing}; rows per sink (old: taken back, "
          f"new: put in): {json.dumps(replays.replaced(ledger, reprocessing))}")
    return 0

