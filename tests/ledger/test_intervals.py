"""A run owns its data interval (README, "Which records a run takes"), against the real
broker and ledger, through the run path, with interval boundaries set between batches: backfill runs planned in any order each take
exactly the records stamped in their interval; the records no interval claimed (before
the first interval, of an interval that never ran, of a transaction still open when its
interval's run planned) are taken once, by the next run that is not a backfill."""

from __future__ import annotations

from contextlib import closing
from datetime import datetime

import psycopg2
import pytest

from exactly_once.ledger.invariants import violations
from exactly_once.ledger.planning import Reach
from tests.kafka_records import OpenTransaction, Produced, moment_after_the_last_marker, wait_until_stable
from tests.ledger.harness import KEYS, Pipeline, order


def orders(n: int, first: int) -> list[tuple]:
    return [(j % 3, KEYS[j % 4].encode(), order(first + j, KEYS[j % 4], j)) for j in range(n)]


def held(pipeline: Pipeline, checkpoint_id: int) -> list[Produced]:
    """The committed records the checkpoint's frozen ranges hold."""
    ranges = pipeline.ledger.checkpoint(checkpoint_id).ranges
    return [p for p in pipeline.produced if p.committed
            and any(r.partition == p.partition and r.start <= p.offset < r.end for r in ranges)]


def in_interval(produced: list[Produced], start: datetime, end: datetime) -> list[Produced]:
    """The committed records stamped in [start, end)."""
    first, last = (int(moment.timestamp() * 1000) for moment in (start, end))
    return [p for p in produced if p.committed and first <= p.timestamp < last]


def assert_ledger_holds(pipeline: Pipeline) -> None:
    pipeline.assert_exact()
    with closing(psycopg2.connect(pipeline.db_url)) as conn:
        assert violations(conn, pipeline.config) == []


@pytest.fixture
def pipeline(ledger_db, kafka_servers, topic) -> Pipeline:
    return Pipeline(ledger_db, kafka_servers, topic)


def test_backfill_runs_in_any_order_take_their_intervals_and_the_next_scheduled_run_the_rest(pipeline):
    pipeline.produce([(True, orders(4, 0))])  # before the first interval that ever runs
    boundary = [moment_after_the_last_marker()]  # interval i is [boundary[i], boundary[i + 1])
    for i in range(5):
        pipeline.produce([(True, orders(9, 100 * (i + 1))), (False, orders(2, 900))])
        boundary.append(moment_after_the_last_marker())
    taken = {}
    for i in (3, 0, 4, 2, 1):  # as a backfill's runs may begin
        taken[i] = pipeline.run_once(boundary[i], boundary[i + 1], Reach.INTERVAL)
    for i, checkpoint_id in taken.items():
        assert held(pipeline, checkpoint_id) == in_interval(pipeline.produced, boundary[i], boundary[i + 1])
        assert len(held(pipeline, checkpoint_id)) == 9, f"interval {i}"
    with closing(psycopg2.connect(pipeline.db_url)) as conn:  # the unclaimed records lie past the frontier
        assert violations(conn, pipeline.config) == []
    # A backfill run over an interval already held takes nothing.
    assert held(pipeline, pipeline.run_once(boundary[2], boundary[3], Reach.INTERVAL)) == []
    # The records before the first interval: the next run that is not a backfill takes them.
    scheduled = pipeline.run_once(boundary[5], moment_after_the_last_marker(), Reach.BACKLOG)
    assert held(pipeline, scheduled) == pipeline.produced[:4]
    assert_ledger_holds(pipeline)


def test_a_transaction_open_across_an_intervals_end_is_taken_once_by_the_next_run_that_is_not_a_backfill(
        pipeline, kafka_servers, topic):
    boundary = [moment_after_the_last_marker()]
    pipeline.produce([(True, orders(6, 0))])
    late = OpenTransaction(kafka_servers, topic)
    late.produce(orders(3, 100))  # stamped in interval 0, still open when its run plans
    boundary.append(moment_after_the_last_marker())
    with OpenTransaction(kafka_servers, topic) as next_interval:  # not stable either until the late one ends
        next_interval.produce(orders(6, 200))
        pipeline.produced += next_interval.end(commit=True)
    boundary.append(moment_after_the_last_marker())
    first = pipeline.run_once(boundary[0], boundary[1], Reach.BACKLOG)
    assert held(pipeline, first) == pipeline.produced[:6]  # only what was stable
    late_records = late.end(commit=True)
    pipeline.produced += late_records
    wait_until_stable(kafka_servers, topic, pipeline.produced)
    # A backfill of the next interval takes that interval's records, not the late ones.
    backfill = pipeline.run_once(boundary[1], boundary[2], Reach.INTERVAL)
    assert held(pipeline, backfill) == in_interval(pipeline.produced, boundary[1], boundary[2])
    assert len(held(pipeline, backfill)) == 6
    scheduled = pipeline.run_once(boundary[2], moment_after_the_last_marker(), Reach.BACKLOG)
    assert held(pipeline, scheduled) == late_records and len(late_records) == 3
    assert_ledger_holds(pipeline)
