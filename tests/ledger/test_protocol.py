"""The commit protocol against real PostgreSQL and Kafka: one test per promise of
docs/promises.md (1-7; 8 is the Spark job's, its dead-letter half is here too), then
the races and faults the ledger must survive. Every test ends on the oracle:
the final tables equal what the committed Kafka records say, to the row."""

from __future__ import annotations

import threading
from contextlib import closing
from datetime import datetime, timedelta, timezone

import psycopg2
import psycopg2.errors
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from exactly_once.ledger.checkpoints import Outcome
from exactly_once.ledger.invariants import violations
from exactly_once.ledger.migrate import migrate
from exactly_once.ledger.lost_offsets import DataLossError
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.refusals import Fenced, NotPreCommitted, NotRunnable, StagedDataChanged
from exactly_once.ledger.registration import SinkTableError
from exactly_once.ledger.tables import DEAD_LETTERS, qualified, staging_table
from exactly_once.sqlfiles import SQL_DIR
from exactly_once_stack.postgres import connect_admin
from tests.kafka_records import produce_transactions
from tests.ledger.harness import Pipeline, committed_ranges, order, query, workload


@pytest.fixture
def pipeline(ledger_db, kafka_servers, topic) -> Pipeline:
    return Pipeline(ledger_db, kafka_servers, topic)


def state(pipeline: Pipeline, checkpoint_id: int) -> str:
    return pipeline.ledger.checkpoint(checkpoint_id).state


def assert_contiguous_from_start(pipeline: Pipeline) -> None:
    """Committed ranges and gaps tile each partition from where the pipeline started to its frontier."""
    starts = {(t, p): (s, f) for t, p, s, f in query(
        pipeline.db_url, "SELECT topic, partition, start_offset, frontier FROM exactly_once.partitions "
                         "WHERE pipeline = %s", pipeline.config.name)}
    pieces = query(pipeline.db_url, "SELECT topic, partition, from_offset, to_offset FROM exactly_once.committed_ranges "
                                    "WHERE pipeline = %s UNION ALL SELECT topic, partition, from_offset, to_offset "
                                    "FROM exactly_once.gaps WHERE pipeline = %s", pipeline.config.name,
                   pipeline.config.name)
    for (topic, partition), (start, frontier) in starts.items():
        ranges = sorted((a, b) for t, p, a, b in pieces if (t, p) == (topic, partition))
        covered = start
        for a, b in ranges:
            assert a == covered, f"{topic}[{partition}]: after {covered} the next committed range starts at {a}"
            covered = b
        assert covered == frontier, f"{topic}[{partition}]: committed up to {covered}, planned up to {frontier}"


# -- the promises -------------------------------------------------------------------------


def test_promise_1_every_committed_record_counts_once_and_aborted_ones_never(pipeline):
    pipeline.produce(workload(0))
    pipeline.run_once()
    pipeline.produce(workload(1000))
    pipeline.run_once()
    pipeline.run_once()  # nothing new: an empty checkpoint, committed without an attempt

    pipeline.assert_exact()
    expected = pipeline.expected().tables
    assert len(expected["events"]) == 28 and len(expected[DEAD_LETTERS]) == 4
    assert 10_000 not in {row["n"] for row in pipeline.actual()["events"]}  # every aborted record has n = 10000


def test_promise_2_the_database_refuses_an_offset_committed_twice_and_ranges_are_contiguous(pipeline):
    pipeline.produce(workload(0))
    first = pipeline.run_once()
    pipeline.produce(workload(1000))
    pipeline.run_once()
    assert_contiguous_from_start(pipeline)

    topic, partition, start, end = committed_ranges(pipeline.db_url, pipeline.config.name)[0]
    with pytest.raises(psycopg2.errors.ExclusionViolation):
        query(pipeline.db_url, "INSERT INTO exactly_once.committed_ranges (pipeline, topic, partition, from_offset, "
                               "to_offset, checkpoint_id) VALUES (%s, %s, %s, %s, %s, %s)",
              pipeline.config.name, topic, partition, end - 1, end + 5, first)
    pipeline.assert_exact()


def retention_pipeline(ledger_db, kafka_servers, topic, allow_data_loss: bool) -> Pipeline:
    """Three offsets of partition 0 committed, then retention deletes offsets below 6."""
    pipeline = Pipeline(ledger_db, kafka_servers, topic, max_records_per_run=3, allow_data_loss=allow_data_loss)
    pipeline.produce([(True, [(0, b"k", order(i, "apple", i)) for i in range(10)])])
    pipeline.run_once()
    admin = AdminClient({"bootstrap.servers": kafka_servers})
    [future] = admin.delete_records([TopicPartition(topic, 0, 6)]).values()
    assert future.result(timeout=30).low_watermark == 6
    return pipeline


def test_promise_2_records_deleted_by_retention_stop_the_pipeline_naming_partition_and_offsets(
        ledger_db, kafka_servers, topic):
    pipeline = retention_pipeline(ledger_db, kafka_servers, topic, allow_data_loss=False)
    with pytest.raises(DataLossError, match=rf"{topic}\[0\]: offsets 3\.\.5 \(3 records\) were deleted"):
        pipeline.begin()
    assert query(ledger_db, "SELECT count(*) FROM exactly_once.checkpoints WHERE pipeline = %s",
                 pipeline.config.name) == [(1,)]  # the failed plan left nothing behind


def test_promise_2_allowed_data_loss_records_the_gap(ledger_db, kafka_servers, topic):
    pipeline = retention_pipeline(ledger_db, kafka_servers, topic, allow_data_loss=True)
    pipeline.run_once()
    pipeline.run_once()
    assert query(ledger_db, "SELECT topic, partition, from_offset, to_offset FROM exactly_once.gaps "
                            "WHERE pipeline = %s", pipeline.config.name) == [(topic, 0, 3, 6)]
    assert_contiguous_from_start(pipeline)
    assert sorted(row["kafka_offset"] for row in pipeline.actual()["events"]) == [0, 1, 2, 6, 7, 8, 9]


def test_promise_3_a_concurrent_reader_never_sees_half_a_checkpoint(ledger_db, kafka_servers, topic):
    seen, done = [], threading.Event()
    pipeline = Pipeline(ledger_db, kafka_servers, topic)

    def read_snapshots():
        with closing(psycopg2.connect(ledger_db)) as conn:
            conn.set_session(isolation_level="REPEATABLE READ")
            while not done.is_set():
                with conn, conn.cursor() as cur:
                    cur.execute(f"SELECT (SELECT count(*) FROM {pipeline.config.name}.events), "
                                f"(SELECT count(*) FROM {pipeline.config.name}.totals), "
                                "(SELECT coalesce(sum(to_offset - from_offset), 0) FROM exactly_once.committed_ranges "
                                "WHERE pipeline = %s)", (pipeline.config.name,))
                    seen.append(cur.fetchone())

    pipeline.produce(workload(0))
    first = pipeline.begin().checkpoint
    pipeline.driver.run(first.id)
    reader = threading.Thread(target=read_snapshots)
    reader.start()
    try:
        pipeline.ledger.commit(first.id)
        pipeline.produce(workload(1000))
        second = pipeline.ledger.checkpoint(pipeline.run_once())
    finally:
        done.set()
        reader.join()
    offsets = [sum(r.size for r in c.ranges) for c in (first, second)]
    whole_checkpoints = {(0, 0, 0), (14, 4, offsets[0]), (28, 4, sum(offsets))}
    assert set(seen) <= whole_checkpoints and len(set(seen)) >= 2, set(seen)
    pipeline.assert_exact()


def test_promise_3_a_commit_that_fails_before_commit_leaves_nothing_visible(ledger_db, kafka_servers, topic):
    def fail(point):
        if point == "commit.before_commit":
            raise RuntimeError("crash inside the commit transaction")

    pipeline = Pipeline(ledger_db, kafka_servers, topic, fault=fail)
    pipeline.produce(workload(0))
    checkpoint = pipeline.begin().checkpoint
    pipeline.driver.run(checkpoint.id)
    with pytest.raises(RuntimeError, match="crash inside"):
        pipeline.ledger.commit(checkpoint.id)
    assert all(not rows for rows in pipeline.actual().values())
    assert committed_ranges(ledger_db, pipeline.config.name) == []
    assert state(pipeline, checkpoint.id) == "precommitted"


def test_promise_4_commit_twice_is_already_committed_and_changes_nothing(pipeline):
    pipeline.produce(workload(0))
    checkpoint_id = pipeline.run_once()
    before = pipeline.actual(), committed_ranges(pipeline.db_url, pipeline.config.name)
    assert pipeline.ledger.commit(checkpoint_id) is Outcome.ALREADY_COMMITTED
    assert (pipeline.actual(), committed_ranges(pipeline.db_url, pipeline.config.name)) == before
    pipeline.assert_exact()


def test_promise_5_a_zombie_attempt_can_change_nothing(pipeline):
    pipeline.produce(workload(0))
    checkpoint = pipeline.begin().checkpoint
    zombie = pipeline.ledger.start_attempt(checkpoint.id)
    records = pipeline.driver.read(checkpoint.ranges)
    zombie_rows = pipeline.driver.write_staging(checkpoint.id, zombie.attempt, records)

    committable = pipeline.driver.run(checkpoint.id)  # a newer attempt fences the zombie off
    assert committable.attempt == zombie.attempt + 1
    # The zombie wakes up: writes its staging again and tries to pre-commit, late.
    pipeline.driver.write_staging(checkpoint.id, zombie.attempt, records)
    with pytest.raises(Fenced, match=f"attempt {zombie.attempt} of checkpoint {checkpoint.id} is fenced"):
        pipeline.ledger.pre_commit(checkpoint.id, zombie.attempt, zombie_rows, records=len(records))
    assert pipeline.ledger.commit(checkpoint.id) is Outcome.COMMITTED
    pipeline.assert_exact()
    with pytest.raises(NotRunnable, match="already committed"):
        pipeline.ledger.start_attempt(checkpoint.id)

    # Still later, after the commit cleared staging, it writes once more: the next run's
    # recovery deletes exactly those rows, which no commit could ever promote.
    pipeline.driver.write_staging(checkpoint.id, zombie.attempt, records)
    assert pipeline.ledger.recover().stale_staging_rows == sum(zombie_rows.values())
    pipeline.assert_exact()
    with closing(psycopg2.connect(pipeline.db_url)) as conn:
        assert violations(conn, pipeline.config) == []


def test_promise_6_a_pre_committed_checkpoint_is_never_aborted_and_the_next_run_commits_it(pipeline):
    pipeline.produce(workload(0))
    checkpoint = pipeline.begin().checkpoint
    pipeline.driver.run(checkpoint.id)
    # The commit task never ran (its retries ran out); an operator tries to abort.
    assert pipeline.ledger.abort(checkpoint.id, "operator") is Outcome.UNCHANGED
    assert state(pipeline, checkpoint.id) == "precommitted"
    with pytest.raises(NotRunnable, match="pre-committed"):
        pipeline.ledger.start_attempt(checkpoint.id)

    pipeline.produce(workload(1000))
    begun = pipeline.begin()
    assert begun.recovery.committed == (checkpoint.id,)
    assert state(pipeline, checkpoint.id) == "committed"
    pipeline.driver.run(begun.checkpoint.id)
    pipeline.ledger.commit(begun.checkpoint.id)
    pipeline.assert_exact()


def test_promise_7_a_retried_or_replayed_checkpoint_reads_exactly_the_same_records(pipeline):
    pipeline.produce(workload(0))
    before_retry = {(p.partition, p.offset) for p in pipeline.produced if p.committed}
    begun = pipeline.begin("run-a")
    pipeline.produce(workload(1000))  # arrives between the first try and the retry
    retried = pipeline.begin("run-a")
    assert not retried.new and retried.checkpoint.ranges == begun.checkpoint.ranges

    first = pipeline.ledger.start_attempt(begun.checkpoint.id)
    read_first = pipeline.driver.read(first.ranges)
    assert pipeline.ledger.abort_attempt(begun.checkpoint.id, first.attempt, "executor lost") is Outcome.ABORTED
    assert state(pipeline, begun.checkpoint.id) == "planned"
    second = pipeline.ledger.start_attempt(begun.checkpoint.id)
    assert pipeline.driver.read(second.ranges) == read_first
    assert {(r.partition, r.offset) for r in read_first} == before_retry

    pipeline.ledger.pre_commit(begun.checkpoint.id, second.attempt,
                               pipeline.driver.write_staging(begun.checkpoint.id, second.attempt, read_first),
                               records=len(read_first))
    pipeline.ledger.commit(begun.checkpoint.id)
    pipeline.run_once()
    pipeline.assert_exact()


# -- races, faults, recovery ----------------------------------------------------------------


def test_planners_racing_get_disjoint_contiguous_ranges(pipeline):
    pipeline.produce(workload(0))
    planners, barrier, begun, errors = 4, threading.Barrier(4), [], []

    def plan(i: int):
        try:
            barrier.wait()
            begun.append(pipeline.begin(f"race-{i}").checkpoint)
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=plan, args=(i,)) for i in range(planners)]
    threads.append(threading.Thread(target=pipeline.produce, args=(workload(2000, rounds=1),)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors

    pieces = sorted((r.topic, r.partition, r.start, r.end) for cp in begun for r in cp.ranges if r.size)
    for partition in range(3):
        covered = 0
        for _, _, start, end in (p for p in pieces if p[1] == partition):
            assert start == covered, f"partition {partition}: {pieces}"
            covered = end
    for checkpoint in sorted(begun, key=lambda c: c.id):
        if not checkpoint.is_empty:
            pipeline.driver.run(checkpoint.id)
            pipeline.ledger.commit(checkpoint.id)
    pipeline.run_once()
    assert_contiguous_from_start(pipeline)
    pipeline.assert_exact()


def test_checkpoints_committed_in_reverse_order_give_the_same_tables(ledger_db, kafka_servers, topic):
    in_order = Pipeline(ledger_db, kafka_servers, topic)
    reverse = Pipeline(ledger_db, kafka_servers, topic)
    checkpoints = {in_order: [], reverse: []}
    # Parallel runs: all three begin before any pre-commits (a later begin would
    # recover, i.e. commit, the pre-committed ones in order).
    for first in (0, 1000, 2000):
        records = produce_transactions(kafka_servers, topic, workload(first))
        for p in (in_order, reverse):
            p.produced += records
            checkpoints[p].append(p.begin().checkpoint.id)
    for p in (in_order, reverse):
        for checkpoint_id in checkpoints[p]:
            p.driver.run(checkpoint_id)
    for checkpoint_id in checkpoints[in_order]:
        in_order.ledger.commit(checkpoint_id)
    for checkpoint_id in reversed(checkpoints[reverse]):
        assert reverse.ledger.commit(checkpoint_id) is Outcome.COMMITTED
    assert reverse.actual() == in_order.actual()
    reverse.assert_exact()
    assert_contiguous_from_start(reverse)


def test_commit_connection_killed_before_commit_shows_nothing_and_a_retry_commits(ledger_db, kafka_servers, topic):
    connections, armed = [], [True]

    def connect():
        connections.append(psycopg2.connect(ledger_db))
        return connections[-1]

    def kill_commit_connection(point):
        if point == "commit.before_commit" and armed and armed.pop():
            query(ledger_db, "SELECT pg_terminate_backend(%s)", connections[-1].get_backend_pid())

    pipeline = Pipeline(ledger_db, kafka_servers, topic, connect=connect, fault=kill_commit_connection)
    pipeline.produce(workload(0))
    checkpoint = pipeline.begin().checkpoint
    pipeline.driver.run(checkpoint.id)
    with pytest.raises(psycopg2.Error):
        pipeline.ledger.commit(checkpoint.id)
    assert all(not rows for rows in pipeline.actual().values())
    assert state(pipeline, checkpoint.id) == "precommitted"

    # The fault fired once: the retry runs on a healthy connection.
    assert pipeline.ledger.commit(checkpoint.id) is Outcome.COMMITTED
    pipeline.assert_exact()


def test_staging_rows_deleted_after_pre_commit_are_refused_and_the_checkpoint_runs_again(pipeline):
    pipeline.produce(workload(0))
    checkpoint = pipeline.begin().checkpoint
    committable = pipeline.driver.run(checkpoint.id)
    events = qualified(staging_table(pipeline.config, "events"))
    delete = f"DELETE FROM {events} WHERE ctid IN (SELECT ctid FROM {events} LIMIT 2)"
    with pytest.raises(psycopg2.errors.InsufficientPrivilege, match="rows are frozen"):
        query(pipeline.db_url, delete)  # the database refuses it
    # The table's owner can switch that off; the commit's count still sees the change.
    query(pipeline.db_url, f"ALTER TABLE {events} DISABLE TRIGGER frozen_deletes; {delete}; "
                           f"ALTER TABLE {events} ENABLE TRIGGER frozen_deletes")
    with pytest.raises(StagedDataChanged, match=rf"checkpoint {checkpoint.id} not committed: staged rows changed"):
        pipeline.ledger.commit(checkpoint.id)
    after = pipeline.ledger.checkpoint(checkpoint.id)
    assert after.state == "planned" and "events" in after.reason
    assert all(not rows for rows in pipeline.actual().values())
    with pytest.raises(NotPreCommitted):
        pipeline.ledger.commit(checkpoint.id)

    again = pipeline.driver.run(checkpoint.id)
    assert again.attempt == committable.attempt + 1 and again.ranges == committable.ranges
    assert pipeline.ledger.commit(checkpoint.id) is Outcome.COMMITTED
    pipeline.assert_exact()


@pytest.mark.parametrize("after", ["a retried commit", "the next recovery"])
def test_a_crash_between_a_commit_and_its_staging_clean_up_leaves_the_rows_to_be_deleted(
        ledger_db, kafka_servers, topic, after):
    def crash(point: str) -> None:
        if point == "commit.before_clean_up":
            raise RuntimeError("crashed after the commit transaction")

    pipeline = Pipeline(ledger_db, kafka_servers, topic, fault=crash)
    pipeline.produce(workload(0))
    checkpoint = pipeline.begin().checkpoint
    committable = pipeline.driver.run(checkpoint.id)
    with pytest.raises(RuntimeError, match="crashed after the commit transaction"):
        pipeline.ledger.commit(checkpoint.id)
    assert state(pipeline, checkpoint.id) == "committed"
    pipeline.assert_exact()
    with closing(psycopg2.connect(ledger_db)) as conn:
        assert any(v.startswith("staging_left_behind") for v in violations(conn, pipeline.config))
    # A committed checkpoint's rows are no commit's to promote: either deletes them.
    staged = sum(s.rows for s in committable.staged.values())
    if after == "a retried commit":
        assert pipeline.ledger.commit(checkpoint.id) is Outcome.ALREADY_COMMITTED
        assert pipeline.ledger.recover().stale_staging_rows == 0
    else:
        assert pipeline.ledger.recover().stale_staging_rows == staged > 0
    with closing(psycopg2.connect(ledger_db)) as conn:
        assert violations(conn, pipeline.config) == []
    pipeline.assert_exact()


def test_an_abandoned_checkpoint_is_taken_over_after_its_lease_exactly(ledger_db, kafka_servers, topic):
    now = [datetime(2026, 1, 1, tzinfo=timezone.utc)]
    pipeline = Pipeline(ledger_db, kafka_servers, topic, clock=lambda: now[0], lease="PT10M")
    pipeline.produce(workload(0))
    abandoned = pipeline.begin().checkpoint
    zombie = pipeline.ledger.start_attempt(abandoned.id)  # its worker dies; the DAG run's retries run out
    pipeline.produce(workload(1000))

    now[0] += timedelta(minutes=5)
    assert pipeline.begin().recovery.aborted == ()  # still within its lease: planned beside it
    now[0] += timedelta(minutes=6)
    takeover = pipeline.begin()
    assert takeover.recovery.aborted == (abandoned.id,)
    assert state(pipeline, abandoned.id) == "aborted"
    assert takeover.checkpoint.ranges == abandoned.ranges  # re-planned exactly: no hole, no double
    with pytest.raises(NotRunnable, match="aborted"):
        pipeline.ledger.start_attempt(abandoned.id)
    with pytest.raises(Fenced):
        pipeline.ledger.pre_commit(abandoned.id, zombie.attempt, {"events": 0, "latest": 0, "totals": 0,
                                                                   "_dead_letters": 0}, records=0)

    for checkpoint_id in (takeover.checkpoint.id, takeover.checkpoint.id - 1):
        pipeline.driver.run(checkpoint_id)
        pipeline.ledger.commit(checkpoint_id)
    pipeline.run_once()
    assert_contiguous_from_start(pipeline)
    pipeline.assert_exact()


def test_a_pipeline_with_nothing_to_read_commits_an_empty_checkpoint_without_an_attempt(pipeline):
    begun = pipeline.begin()
    assert begun.checkpoint.is_empty and begun.checkpoint.state == "committed" and begun.checkpoint.attempt == 0


def test_sink_tables_that_cannot_merge_in_any_order_are_refused_by_name(ledger_db, kafka_servers, topic):
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    query(ledger_db, f"ALTER TABLE {pipeline.config.name}.latest DROP CONSTRAINT latest_pkey")
    with pytest.raises(SinkTableError, match=r"sink 'latest': table .*latest: has no unique index or constraint on exactly \['k'\]"):
        pipeline.ledger.register()
    query(ledger_db, f"DROP TABLE {pipeline.config.name}.latest")
    with pytest.raises(SinkTableError, match=rf"sink 'latest': table {pipeline.config.name}.latest: does not exist"):
        pipeline.ledger.register()


def test_every_migration_applies_to_a_new_database_in_one_transaction(ledger_db):
    """As on a first deploy: what one migration adds (an enum value, say) is not yet
    committed when the next one runs."""
    admin = connect_admin()
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute("DROP DATABASE IF EXISTS migrations_from_nothing")
            cur.execute("CREATE DATABASE migrations_from_nothing")
        with closing(connect_admin("migrations_from_nothing")) as conn:
            assert migrate(conn) == [path.stem for path in sorted((SQL_DIR / "migrations").glob("*.sql"))]
    finally:
        with admin.cursor() as cur:
            cur.execute("DROP DATABASE IF EXISTS migrations_from_nothing")
        admin.close()


def test_migrations_apply_once(ledger_db):
    with closing(psycopg2.connect(ledger_db)) as conn:
        assert migrate(conn) == []
    assert query(ledger_db, "SELECT version FROM exactly_once.schema_migrations ORDER BY version") == [
        (path.stem,) for path in sorted((SQL_DIR / "migrations").glob("*.sql"))]
    assert len(list((SQL_DIR / "migrations").glob("*.sql"))) >= 4


def test_the_spark_job_reads_the_configuration_back_as_registered_field_order_included(ledger_db, kafka_servers,
                                                                                        topic):
    schema = {"order_id": "string", "sku": "string", "qty": "int", "ts": "timestamp"}  # not sorted in any way
    pipeline = Pipeline(ledger_db, kafka_servers, topic, source={"topics": [topic], "value_schema": schema})
    pipeline.ledger.register()
    registered = Ledger.of_registered(pipeline.config.name, pipeline.ledger.connect).config
    assert registered == pipeline.config
    assert list(registered.source.value_schema) == list(schema)
    # What the job reads: the configuration its attempt was started with.
    pipeline.produce(workload(0))
    checkpoint = pipeline.begin().checkpoint
    attempt = pipeline.ledger.start_attempt(checkpoint.id).attempt
    run_with = Ledger.of_attempt(pipeline.config.name, checkpoint.id, attempt, pipeline.ledger.connect).config
    assert run_with == pipeline.config
    assert list(run_with.source.value_schema) == list(schema)


def test_a_begin_runs_no_ddl_that_would_wait_for_a_staging_write_in_flight(ledger_db, kafka_servers, topic):
    pipeline = Pipeline(ledger_db, kafka_servers, topic,
                        connect=lambda: psycopg2.connect(ledger_db, options="-c lock_timeout=2000"))
    pipeline.produce(workload(0))
    pipeline.run_once()
    with closing(psycopg2.connect(ledger_db)) as writer, writer.cursor() as cur:
        for name in ("events", "totals"):  # what an attempt's INSERTs hold until its Spark tasks commit
            cur.execute(f"LOCK TABLE {qualified(staging_table(pipeline.config, name))} IN ROW EXCLUSIVE MODE")
        pipeline.produce(workload(1000))
        assert pipeline.begin().new  # planned without waiting for the writer (lock_timeout 2 s)
        writer.rollback()
