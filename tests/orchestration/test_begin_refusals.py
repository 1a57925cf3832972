"""Issue 60, item 8(a), against real Kafka and PostgreSQL: a begin refused before any
checkpoint exists (partitions added to the topic of a pipeline whose upsert sink is ordered
by offset: every run fails naming `order_by`) is as loud as a stall — status exits 2 naming
it, the metric the alert rules watch is 1 — and the first begin that succeeds afterwards
clears it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from contextlib import closing
from datetime import datetime, timezone

import psycopg2
import pytest

from exactly_once.config import load_config
from exactly_once.errors import ConfigError
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.protocol import Ledger
from exactly_once.operate import metrics
from exactly_once.orchestration import tasks
from tests.kafka_records import create_topic
from tests.shared.test_upsert_order import FINAL_TABLE, add_partitions, config_data, produce


def cli(module: str, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *arguments], env=os.environ, capture_output=True,
                          text=True, timeout=120)


def begin(ledger: Ledger, servers: str, run_id: str):
    with KafkaOffsets(KafkaClient.at(servers)) as kafka:
        return tasks.begin_checkpoint(ledger, kafka, run_id, None, None)


def stalled_gauge(db_url: str, pipeline: str) -> float:
    with closing(psycopg2.connect(db_url)) as conn:
        samples = metrics.read_samples(conn, None, datetime.now(timezone.utc), only=[pipeline])
    return next(s.value for s in samples if s.name == "exactly_once_stalled")


def test_a_begin_refused_before_any_checkpoint_is_loud_until_a_begin_succeeds(ledger_db, kafka_servers):
    topic = f"t_refused_{uuid.uuid4().hex[:8]}"
    create_topic(kafka_servers, topic, partitions=1)
    name = f"p{uuid.uuid4().hex[:10]}"
    with closing(psycopg2.connect(ledger_db)) as conn, conn, conn.cursor() as cur:
        cur.execute(FINAL_TABLE.format(schema=name))
    by_offset = Ledger(load_config(config_data(name, [topic])), lambda: psycopg2.connect(ledger_db))
    produce(kafka_servers, topic, [(0, "apple", 1, 1)])
    assert not begin(by_offset, kafka_servers, "before").checkpoint.is_empty
    assert cli("exactly_once.operate.status", "--pipeline", name).returncode == 0

    add_partitions(kafka_servers, topic, 2)
    produce(kafka_servers, topic, [(1, "apple", 2, 2)])
    for run in ("after-1", "after-2"):  # every run fails naming order_by, before planning anything
        with pytest.raises(ConfigError, match="order_by"):
            begin(by_offset, kafka_servers, run)
    status = cli("exactly_once.operate.status", "--pipeline", name)
    print(status.stdout, status.stderr)
    assert status.returncode == 2, status.stdout + status.stderr
    refused = status.stdout.split("STALLED: ")[1]
    assert refused.startswith("runs refused at begin") and "order_by" in refused and "2 time(s)" in refused
    assert stalled_gauge(ledger_db, name) == 1

    # The configuration fixed (an order column): the next begin plans, and the refusal is gone.
    ordered = Ledger(load_config(config_data(name, [topic], order_by="at")), lambda: psycopg2.connect(ledger_db))
    assert not begin(ordered, kafka_servers, "fixed").checkpoint.is_empty
    assert cli("exactly_once.operate.status", "--pipeline", name).returncode == 0
    assert stalled_gauge(ledger_db, name) == 0
