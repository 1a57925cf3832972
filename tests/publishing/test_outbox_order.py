"""Kafka output in the order of the source offsets after an aborted checkpoint (promise 11,
frontier-ordered; issue 60, item 7). Checkpoint A plans offsets 0–3 of a partition and its
lease expires; B, planned after A over 3–6, commits; recovery aborts A; C plans 0–3 again
and commits. B's records must not reach Kafka before C's: on a compacted topic the value of
the key's highest offset must be the last one, as Java's read_committed consumer reads it."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import psycopg2
import pytest

from exactly_once.ledger.checkpoints import State
from exactly_once.ledger.protocol import Ledger
from exactly_once.publishing.transactions import CHECKPOINT_HEADER
from tests.kafka_records import java_committed_records
from tests.publishing.outbox_pipeline import OutboxPipeline
from tests.publishing.test_publishing import backlog

KEY = "K"


def orders_of_key(first: int, n: int) -> list[tuple[int, bytes, bytes]]:
    """n orders of sku K in source partition 0, their qty counting up with their offsets."""
    return [(0, f"k{i}".encode(), json.dumps({"id": f"o{i}", "sku": KEY, "qty": i}).encode())
            for i in range(first, first + n)]


def live_ranges(pipeline: OutboxPipeline, checkpoint_id: int) -> list[tuple[int, int, int]]:
    return [(r.partition, r.start, r.end) for r in pipeline.ledger.checkpoint(checkpoint_id).ranges if r.end > r.start]


@pytest.fixture
def pipeline(ledger_db, kafka_servers, topic) -> OutboxPipeline:
    built = OutboxPipeline(ledger_db, kafka_servers, topic)
    now = [datetime.now(timezone.utc)]
    built.clock = now
    built.ledger = Ledger(built.config, lambda: psycopg2.connect(ledger_db), clock=lambda: now[0])
    return built


def test_a_range_planned_again_after_an_abort_is_published_before_the_offsets_after_it(spark, pipeline):
    pipeline.produce(orders_of_key(0, 3))
    aborted = pipeline.begin()  # 0–3 of partition 0; its run dies
    pipeline.produce(orders_of_key(3, 3))
    later = pipeline.begin()  # 3–6, planned while the first is open
    pipeline.increment(spark, later)
    pipeline.commit(later)

    pipeline.clock[0] += pipeline.config.lease + timedelta(minutes=1)
    assert aborted in pipeline.ledger.recover().aborted
    assert pipeline.ledger.checkpoint(aborted).state is State.ABORTED
    waiting = [p.records for p in pipeline.publish()]
    print("published after the abort:", waiting)
    held = backlog(pipeline).get("events")

    again = pipeline.begin()  # plans the released 0–3 again
    assert again not in (aborted, later)
    assert live_ranges(pipeline, again) == live_ranges(pipeline, aborted)
    waiting.append([p.records for p in pipeline.publish()])
    pipeline.increment(spark, again)
    pipeline.commit(again)
    waiting.append([p.records for p in pipeline.publish()])

    seen = [(headers, json.loads(value)) for _, headers, key, value in
            java_committed_records(pipeline.servers, pipeline.events_topic) if key == KEY]
    print("Java read_committed consumer, key K:",
          [(h, v["kafka_offset"], v["qty"]) for h, v in seen])
    offsets = [v["kafka_offset"] for _, v in seen]
    assert offsets == sorted(offsets) and len(offsets) == 6, offsets
    assert seen[-1][1]["qty"] == 5  # the last value of the key: its highest offset's
    # Offsets 0–3, below the later checkpoint's, released and not committed: it waited for
    # them, also while they were planned again; the status named what it waited for.
    assert waiting == [0, 0, [0, 0], [6, 2]], waiting
    assert held is not None and held[:3] == (3, later, None) and held[3] is not None, held
    assert [f"{CHECKPOINT_HEADER}:{c}" for c in (again,) * 3 + (later,) * 3] == [h for h, _ in seen]

    totals = [(headers, json.loads(value)) for _, headers, key, value in
              java_committed_records(pipeline.servers, pipeline.totals_topic) if key == KEY]
    assert [h for h, _ in totals] == [f"{CHECKPOINT_HEADER}:{again}", f"{CHECKPOINT_HEADER}:{later}"], totals
    pipeline.assert_exact()
