"""Run by the PREVIOUS release's code (tests/upgrade/test_upgrade.py puts its checkout first on
the path): on a ledger that release migrated, a pipeline per state with one checkpoint left
open in that state, as an upgrade would find them. Prints a line `left JSON` per pipeline, then
`ready`; the `live` pipeline's increment task is still running its job, which waits for a
line on standard input (today's code has migrated meanwhile) before it stages its rows and
its task pre-commits them. Only names the previous release has are used here.

    python tests/upgrade/leave_open.py DB_URL BOOTSTRAP_SERVERS
"""

from __future__ import annotations

import base64
import json
import sys
import threading
import uuid
from contextlib import closing

import psycopg2
from psycopg2 import sql

from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.migrate import migrate
from exactly_once.ledger.tables import staging_table
from exactly_once.orchestration import tasks
from tests.kafka_records import create_topic
from tests.ledger.harness import Pipeline, order, workload


def mostly_undecodable() -> list:
    good = [(i % 3, b"k", order(i, "k", i)) for i in range(5)]
    return [(True, good + [(i % 3, b"k", b"\x00not json %d" % i) for i in range(35)])]


def refused(expected: str, step, *arguments) -> None:
    """A step of the release's run path that must fail with the release's error `expected`
    (by name: the release's own class)."""
    try:
        step(*arguments)
    except Exception as error:
        assert type(error).__name__ == expected, error
    else:
        raise AssertionError(f"{step.__name__} did not fail with {expected}")


class Left:
    def __init__(self, db_url: str, servers: str):
        self.db_url, self.servers = db_url, servers

    def pipeline(self, state: str, **config) -> Pipeline:
        topic = f"upgrade_{state}_{uuid.uuid4().hex[:8]}"
        create_topic(self.servers, topic, 3)
        pipeline = Pipeline(self.db_url, self.servers, topic, **config)
        pipeline.produce(workload(0))
        return pipeline

    def say(self, state: str, pipeline: Pipeline, checkpoint_id: int) -> None:
        produced = [{"partition": p.partition, "offset": p.offset, "committed": p.committed,
                     "timestamp": p.timestamp, "key": None if p.key is None else base64.b64encode(p.key).decode(),
                     "value": base64.b64encode(p.value).decode()} for p in pipeline.produced]
        print("left " + json.dumps({"state": state, "topic": pipeline.topic, "checkpoint_id": checkpoint_id,
                          "config": pipeline.config.model_dump(mode="json"), "produced": produced}), flush=True)


def main(db_url: str, servers: str) -> None:
    with closing(psycopg2.connect(db_url)) as conn:
        migrate(conn)  # the previous release's schema
    left = Left(db_url, servers)

    planned = left.pipeline("planned")
    planned.run_once()  # committed before it: its contributions are kept
    planned.produce(workload(1000))
    left.say("planned", planned, planned.begin("open").checkpoint.id)

    running = left.pipeline("running")  # an attempt whose job died with the upgrade, its rows staged
    checkpoint = running.ledger.start_attempt(running.begin("open").checkpoint.id)
    running.driver.write_staging(checkpoint.id, checkpoint.attempt, running.driver.read(checkpoint.ranges))
    left.say("running", running, checkpoint.id)

    precommitted = left.pipeline("precommitted")
    checkpoint_id = precommitted.begin("open").checkpoint.id
    precommitted.driver.run(checkpoint_id)
    left.say("precommitted", precommitted, checkpoint_id)

    sent_back = left.pipeline("sent_back")  # its staged rows changed after pre-commit: planned again
    checkpoint_id = sent_back.begin("open").checkpoint.id
    sent_back.driver.run(checkpoint_id)
    events = staging_table(sent_back.config, "events")
    with closing(psycopg2.connect(db_url)) as conn, conn, conn.cursor() as cur:
        cur.execute(sql.SQL("ALTER TABLE {t} DISABLE TRIGGER USER; DELETE FROM {t} WHERE checkpoint_id = %s "
                            "AND kafka_offset = (SELECT min(kafka_offset) FROM {t} WHERE checkpoint_id = %s); "
                            "ALTER TABLE {t} ENABLE TRIGGER USER").format(t=events), (checkpoint_id, checkpoint_id))
    refused("StagedDataChanged", tasks.commit_checkpoint, sent_back.ledger, checkpoint_id, 1)
    left.say("sent_back", sent_back, checkpoint_id)

    budget = left.pipeline("stalled_at_commit")  # stalled on its dead-letter budget, its pre-commit kept
    budget.produce(mostly_undecodable())
    checkpoint_id = budget.begin("open").checkpoint.id
    budget.driver.run(checkpoint_id)
    refused("Stalled", tasks.commit_checkpoint, budget.ledger, checkpoint_id, 1)
    left.say("stalled_at_commit", budget, checkpoint_id)

    stalled = left.pipeline("stalled", stall_after=1)  # its attempt failed in a way no retry fixes

    def fails(arguments: list[str]):
        raise RuntimeError("disk full")

    checkpoint_id = stalled.begin("open").checkpoint.id
    refused("Stalled", tasks.run_increment, stalled.ledger, checkpoint_id, fails)
    left.say("stalled", stalled, checkpoint_id)

    reprocessing = left.pipeline("reprocessing")  # a reprocessing pre-committed, not yet committed
    reprocessing.run_once()
    with KafkaOffsets(KafkaClient.at(servers)) as kafka:
        begun = tasks.begin_checkpoint(reprocessing.ledger, kafka, "run1", None, None, reprocess=True)
    reprocessing.driver.run(begun.checkpoint.id)
    left.say("reprocessing", reprocessing, begun.checkpoint.id)

    live = left.pipeline("live")  # its task runs its job across the upgrade
    checkpoint_id = live.begin("open").checkpoint.id
    go = threading.Event()

    def job(arguments: list[str]):
        go.wait()
        return live.driver.execute(arguments)

    task = threading.Thread(target=tasks.run_increment, args=(live.ledger, checkpoint_id, job))
    task.start()
    left.say("live", live, checkpoint_id)
    print("ready", flush=True)
    sys.stdin.readline()
    go.set()
    task.join()
    print("live pre-committed", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
