"""A committed checkpoint's staging clean-up (exactly_once.ledger.clean_up): a staging table
holding only its rows, which nobody is using, is truncated; rows of another checkpoint are
kept (it deletes the committed one's), and a table in use is not waited for. Each ends on
the oracle and the ledger's invariants."""

from __future__ import annotations

import threading
from contextlib import closing

import psycopg2
import pytest

from exactly_once.ledger.checkpoints import Outcome
from exactly_once.ledger.invariants import violations
from exactly_once.ledger.tables import qualified, staging_table
from tests.ledger.harness import Pipeline, query, workload


@pytest.fixture
def pipeline(ledger_db, kafka_servers, topic) -> Pipeline:
    return Pipeline(ledger_db, kafka_servers, topic)


def sink_staging(pipeline: Pipeline) -> list[str]:
    """The pipeline's own staging tables (the dead letters' is shared by every pipeline)."""
    return [qualified(staging_table(pipeline.config, sink.name)) for sink in pipeline.config.sinks]


def files(pipeline: Pipeline) -> dict[str, int]:
    """Each staging table's file (a TRUNCATE gives it a new one)."""
    return {table: query(pipeline.db_url, "SELECT relfilenode FROM pg_class WHERE oid = %s::regclass", table)[0][0]
            for table in sink_staging(pipeline)}


def staged_rows(pipeline: Pipeline, checkpoint_id: int) -> int:
    return sum(query(pipeline.db_url, f"SELECT count(*) FROM {table} WHERE checkpoint_id = %s", checkpoint_id)[0][0]
               for table in sink_staging(pipeline))


def assert_clean(pipeline: Pipeline) -> None:
    pipeline.assert_exact()
    with closing(psycopg2.connect(pipeline.db_url)) as conn:
        assert violations(conn, pipeline.config) == []


def test_a_committed_checkpoint_alone_in_its_staging_tables_truncates_them(pipeline):
    pipeline.produce(workload(0))
    checkpoint = pipeline.begin().checkpoint
    pipeline.driver.run(checkpoint.id)
    before = files(pipeline)
    assert staged_rows(pipeline, checkpoint.id) > 0

    assert pipeline.ledger.commit(checkpoint.id) is Outcome.COMMITTED
    after = files(pipeline)
    assert all(after[table] != before[table] for table in before), (before, after)
    assert all(query(pipeline.db_url, f"SELECT count(*) FROM {table}")[0][0] == 0 for table in before)
    assert_clean(pipeline)


def test_another_checkpoints_staged_rows_are_kept_and_the_committed_ones_deleted(pipeline):
    pipeline.produce(workload(0))
    first = pipeline.begin().checkpoint
    pipeline.produce(workload(1000))
    second = pipeline.begin().checkpoint  # planned beside the first (a begin commits what is pre-committed)
    pipeline.driver.run(first.id)
    pipeline.driver.run(second.id)  # pre-committed, its rows frozen beside the first's
    waiting = staged_rows(pipeline, second.id)
    before = files(pipeline)

    assert pipeline.ledger.commit(first.id) is Outcome.COMMITTED
    assert files(pipeline) == before  # deleted, not truncated
    assert staged_rows(pipeline, first.id) == 0 and staged_rows(pipeline, second.id) == waiting > 0

    assert pipeline.ledger.commit(second.id) is Outcome.COMMITTED
    assert all(after != before[table] for table, after in files(pipeline).items())  # alone now: truncated
    assert_clean(pipeline)


def test_a_staging_table_in_use_is_not_waited_for(pipeline):
    pipeline.produce(workload(0))
    checkpoint = pipeline.begin().checkpoint
    pipeline.driver.run(checkpoint.id)
    before = files(pipeline)
    reader = psycopg2.connect(pipeline.db_url)
    committed = []
    try:
        with reader.cursor() as cur:  # an open transaction holding a lock on one staging table
            cur.execute(f"SELECT count(*) FROM {sink_staging(pipeline)[0]}")
        commit = threading.Thread(target=lambda: committed.append(pipeline.ledger.commit(checkpoint.id)))
        commit.start()
        commit.join(timeout=60)
        assert committed == [Outcome.COMMITTED], "the commit waited for the reader's lock"
        assert staged_rows(pipeline, checkpoint.id) == 0
        assert files(pipeline)[sink_staging(pipeline)[0]] == before[sink_staging(pipeline)[0]]  # deleted
    finally:
        reader.rollback()
        reader.close()
    assert_clean(pipeline)
