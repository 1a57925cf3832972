"""The commit against real PostgreSQL and Kafka when it cannot promote for a reason that is
no record's (issue 36, items 1, 3, 7): it stalls loudly keeping its pre-commit, with a way
out that commits it; what it counts is what it promotes; it merges by the configuration
version its attempt ran with. Every test ends on the oracle."""

from __future__ import annotations

import threading
from contextlib import closing

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import pytest

from exactly_once.config import load_config
from exactly_once.ledger.checkpoints import Outcome, State
from exactly_once.ledger.invariants import violations
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.refusals import Stalled
from exactly_once.ledger.tables import qualified, staging_table
from exactly_once.operate import stalls
from exactly_once.operate.status import read_status
from exactly_once.orchestration import tasks
from exactly_once.orchestration.outcomes import TaskOutcome, after_error
from tests.ledger.harness import Pipeline, query, workload


@pytest.fixture
def pipeline(ledger_db, kafka_servers, topic) -> Pipeline:
    return Pipeline(ledger_db, kafka_servers, topic)


def precommitted(pipeline: Pipeline, first: int = 0) -> int:
    pipeline.produce(workload(first))
    checkpoint_id = pipeline.begin().checkpoint.id
    pipeline.driver.run(checkpoint_id)
    return checkpoint_id


def assert_exact(pipeline: Pipeline) -> None:
    pipeline.assert_exact()
    with closing(psycopg2.connect(pipeline.db_url)) as conn:
        assert violations(conn, pipeline.config) == []


@pytest.mark.parametrize("way_out", ["a cleared commit task", "stalls retry"])
def test_a_commit_refused_for_no_records_fault_stalls_at_once_keeping_its_pre_commit(pipeline, way_out):
    checkpoint_id = precommitted(pipeline)
    events = pipeline.config.sink("events").table
    query(pipeline.db_url, f"ALTER TABLE {events} RENAME COLUMN n TO amount")  # a deploy renamed a column

    with pytest.raises(Stalled, match=rf"checkpoint {checkpoint_id} .*its commit keeps failing.*42703") as stalled:
        tasks.commit_checkpoint(pipeline.ledger, checkpoint_id, 1)
    assert after_error(stalled.value) is TaskOutcome.FAIL  # no retry loops on it
    checkpoint = pipeline.ledger.checkpoint(checkpoint_id)
    assert checkpoint.state is State.STALLED and checkpoint.awaits_commit  # the pre-commit is kept
    with pytest.raises(Stalled, match=rf"checkpoint {checkpoint_id} "):
        pipeline.begin("a later run")  # every later run fails naming it
    with closing(psycopg2.connect(pipeline.db_url)) as conn:
        [stall] = read_status(conn, None, pipeline.config.name).stalls  # status and the view: STALLED
        assert stall.checkpoint_id == checkpoint_id and "42703" in stall.last_error
        assert violations(conn, pipeline.config) == []  # its staging rows are not left behind: they are kept

    query(pipeline.db_url, f"ALTER TABLE {events} RENAME COLUMN amount TO n")  # the operator fixes the cause
    if way_out == "a cleared commit task":
        assert tasks.run_increment(pipeline.ledger, checkpoint_id, pipeline.driver.execute) is None  # nothing to run
        assert tasks.commit_checkpoint(pipeline.ledger, checkpoint_id, 2, pipeline.ledger.now()) is Outcome.COMMITTED
        action = "resume"
    else:
        assert stalls.retry(pipeline.ledger, checkpoint_id) == (checkpoint_id,)
        pipeline.run_once()  # its ranges, exactly, in the next run
        action = "retry"
    assert query(pipeline.db_url, "SELECT action FROM exactly_once.operator_actions WHERE checkpoint_id = %s",
                 checkpoint_id) == [(action,)]
    assert_exact(pipeline)


def test_a_commit_that_keeps_timing_out_retries_then_stalls_and_commits_once_the_cause_is_gone(
        ledger_db, kafka_servers, topic):
    pipeline = Pipeline(ledger_db, kafka_servers, topic,
                        connect=lambda: psycopg2.connect(ledger_db, options="-c statement_timeout=1500"))
    checkpoint_id = precommitted(pipeline)
    with closing(psycopg2.connect(ledger_db)) as maintenance, maintenance.cursor() as cur:
        cur.execute(f"LOCK TABLE {pipeline.config.sink('totals').table} IN ACCESS EXCLUSIVE MODE")  # held
        for failures in (1, 2):  # a timeout may pass: retried, counted
            with pytest.raises(psycopg2.errors.QueryCanceled) as timed_out:
                tasks.commit_checkpoint(pipeline.ledger, checkpoint_id, failures)
            assert after_error(timed_out.value) is TaskOutcome.RETRY
            checkpoint = pipeline.ledger.checkpoint(checkpoint_id)
            assert (checkpoint.state, checkpoint.commit_failures) == (State.PRECOMMITTED, failures)
        with pytest.raises(Stalled, match="57014"):  # stall_after (3) failures of one cause
            tasks.commit_checkpoint(pipeline.ledger, checkpoint_id, 3)
        maintenance.rollback()
    cleared = pipeline.ledger.now()  # a cleared task's try
    assert tasks.commit_checkpoint(pipeline.ledger, checkpoint_id, 4, cleared) is Outcome.COMMITTED
    assert_exact(pipeline)


class _BeforeTheCommitLock(psycopg2.extensions.cursor):
    """Calls `hook` (once) just before the commit takes its commit lock: after the commit
    counted the staged rows, before it promotes them."""

    hook = None

    def execute(self, query, vars=None):
        hook, cls = _BeforeTheCommitLock.hook, _BeforeTheCommitLock
        if hook is not None and "pg_advisory_xact_lock_shared" in str(query):
            cls.hook = None
            hook()
        return super().execute(query, vars)


def test_a_late_insert_of_the_pre_committed_attempt_is_never_promoted(ledger_db, kafka_servers, topic):
    """An executor declared lost but alive writes its rows again between the commit's count
    and its promotion: the aggregate would count them twice."""
    pipeline = Pipeline(ledger_db, kafka_servers, topic,
                        connect=lambda: psycopg2.connect(ledger_db, cursor_factory=_BeforeTheCommitLock))
    checkpoint_id = precommitted(pipeline)
    attempt = pipeline.ledger.checkpoint(checkpoint_id).precommitted_attempt
    totals = qualified(staging_table(pipeline.config, "totals"))
    outcome = {}

    def late_insert() -> None:
        try:
            query(ledger_db, f"INSERT INTO {totals} SELECT * FROM {totals} WHERE checkpoint_id = %s AND attempt = %s",
                  checkpoint_id, attempt)
            outcome["late insert"] = "committed"
        except psycopg2.Error as refused:
            outcome["late insert"] = refused.pgerror

    writer = threading.Thread(target=late_insert)
    _BeforeTheCommitLock.hook = lambda: (writer.start(), writer.join(timeout=3))
    assert pipeline.ledger.commit(checkpoint_id) is Outcome.COMMITTED
    writer.join(timeout=30)
    assert "is pre-committed; its rows are frozen" in outcome["late insert"]
    assert_exact(pipeline)


def test_staging_is_insert_only_and_a_pre_committed_attempts_rows_cannot_be_deleted(pipeline):
    checkpoint_id = precommitted(pipeline)
    staged = {name: qualified(staging_table(pipeline.config, name)) for name in ("events", "totals")}
    for statement in (f"UPDATE {staged['totals']} SET total = total + 1",
                      f"DELETE FROM {staged['events']} WHERE checkpoint_id = %s",
                      f"INSERT INTO {staged['events']} SELECT * FROM {staged['events']} WHERE checkpoint_id = %s"):
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            query(pipeline.db_url, statement, checkpoint_id)
    assert pipeline.ledger.commit(checkpoint_id) is Outcome.COMMITTED
    with pytest.raises(psycopg2.errors.InsufficientPrivilege, match="insert-only"):
        query(pipeline.db_url, f"UPDATE {staged['totals']} SET total = total + 1")
    assert_exact(pipeline)


def test_a_pre_committed_checkpoint_merges_by_the_configuration_its_attempt_ran_with(pipeline):
    pipeline.run_once()
    pipeline.produce(workload(0))
    pipeline.run_once()
    checkpoint_id = precommitted(pipeline, first=1000)
    # A deploy changes the aggregate's measure (sum -> max) while the checkpoint waits for its commit.
    changed = pipeline.config.model_dump(mode="json")
    changed["sinks"][2]["measures"]["total"] = "max"
    deployed = Ledger(load_config(changed), pipeline.ledger.connect)

    assert deployed.commit(checkpoint_id) is Outcome.COMMITTED  # by its attempt's version: sums
    assert_exact(pipeline)
