"""Support for the ledger's stateful property test (tests/ledger/test_protocol_machine.py):
a topic read once, a clock the test moves, ledger operations run in worker threads that
can pause at a fault point inside their transaction, and the checks made after each step.

An operation that waits for a lock held by a paused one would hang the test: `Steps.settle`
watches PostgreSQL's lock graph (`pg_blocking_pids`) while it waits, and resumes the paused
operation that blocks it (what a real scheduler would eventually do: the stuck task's
transaction ends one way or the other). A deadlock between the two is PostgreSQL's to break.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import closing
from datetime import datetime, timedelta, timezone

import psycopg2
import psycopg2.errors

from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.checkpoints import Outcome
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.planning import OffsetRange, PartitionOffsets
from exactly_once.operate import stalls
from exactly_once.orchestration import tasks
from tests import oracle
from tests.ledger.harness import Driver, row_of
from tests.oracle import Record

_local = threading.local()  # the operation the current worker thread runs


class Clock:
    """The ledger's clock: the test moves it (a second per step, a lease's length to expire one)."""

    def __init__(self):
        self.at = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.at

    def advance(self, by: timedelta) -> None:
        self.at += by


class Topic:
    """The module's topic as Kafka answers planning (it never changes after it was produced)
    and every committed record in it, read once: records are immutable, so slicing them by
    offset is what a read of a checkpoint's ranges returns."""

    def __init__(self, servers: str, name: str):
        self.name = name
        with KafkaOffsets(KafkaClient.at(servers)) as kafka:
            self._offsets = {p: kafka.offsets(name, p, None, None) for p in kafka.partitions(name)}
        whole = tuple(OffsetRange(name, p, o.log_start, o.last_stable) for p, o in self._offsets.items())
        self.records = Driver(None, servers, None)._read(whole)

    # -- exactly_once.ledger.planning.OffsetSource ------------------------------------------

    def partitions(self, topic: str) -> list[int]:
        return sorted(self._offsets)

    def offsets(self, topic: str, partition: int, interval_start, interval_end, start_time=None) -> PartitionOffsets:
        assert (topic, interval_start, interval_end, start_time) == (self.name, None, None, None)
        return self._offsets[partition]

    def within(self, ranges) -> list[Record]:
        return [r for r in self.records if oracle.in_ranges(r, ranges)]


class SlicingDriver(Driver):
    """The harness's driver (it writes staging rows as the job does), reading from `Topic`."""

    def __init__(self, ledger, topic: Topic, servers: str, db_url: str):
        super().__init__(ledger, servers, db_url)
        self.topic = topic

    def read(self, ranges) -> list[Record]:
        return self.topic.within(ranges)

    def report(self, records: list[Record]) -> dict[str, int]:
        """The rows per staging table the job counts as it writes `records` once."""
        expected = oracle.expected(self.ledger.config, records, row_of)
        return {name: len(rows) for name, rows in expected.tables.items()}


class Crashed(Exception):
    """An operation abandoned at a fault point (its connection was terminated first)."""


class Operation(threading.Thread):
    """One ledger operation in a worker thread; with `pause_at`, it stops at that fault point
    (inside its transaction, holding its locks) until `resume` or `crash`."""

    def __init__(self, name: str, work: Callable[[], object], allowed: tuple[type[BaseException], ...] = (),
                 pause_at: str | None = None):
        super().__init__(name=name, daemon=True)
        self.work, self.allowed, self.pause_at = work, allowed, pause_at
        self.connections: list[tuple] = []  # (connection, its backend's pid)
        self.stopped = threading.Event()  # paused at its point, or done
        self.done = threading.Event()
        self._go = threading.Event()
        self.crashing = False
        self.result = self.error = None

    def __repr__(self) -> str:
        return f"<{self.name}{' paused at ' + self.pause_at if self.paused else ''}>"

    @property
    def paused(self) -> bool:
        return self.stopped.is_set() and not self.done.is_set()

    def run(self) -> None:
        _local.operation = self
        try:
            self.result = self.work()
        except BaseException as error:  # noqa: BLE001 - judged by the step that waits for it
            self.error = error
        finally:
            self.done.set()
            self.stopped.set()

    def at_fault_point(self, point: str) -> None:
        if point != self.pause_at or self.stopped.is_set():
            return
        self.stopped.set()
        self._go.wait()
        if self.crashing:
            raise Crashed(point)

    def resume(self, crash: bool = False) -> None:
        self.crashing = crash
        self.stopped.clear()
        self._go.set()

    def outcome(self):
        """Its result; its error if the step did not allow it (or a deadlock PostgreSQL broke)."""
        if self.error is not None and not self.crashing:
            if not isinstance(self.error, (*self.allowed, psycopg2.errors.DeadlockDetected)):
                raise self.error
        return self.result


def fault_hook(point: str) -> None:
    """The ledger's `fault`: the calling operation's pause point, if it is this one."""
    operation = getattr(_local, "operation", None)
    if operation is not None:
        operation.at_fault_point(point)


class Steps:
    """Runs operations one at a time, keeping the paused ones; resumes one that blocks a step."""

    HANG = 60  # seconds a step may wait with no paused operation to blame

    def __init__(self, db_url: str):
        self.db_url = db_url
        self.paused: list[Operation] = []
        self.monitor = psycopg2.connect(db_url)
        self.monitor.autocommit = True

    def connect(self):
        """The ledger's connections, remembered by the operation that opens them."""
        conn = psycopg2.connect(self.db_url)
        operation = getattr(_local, "operation", None)
        if operation is not None:
            operation.connections.append((conn, conn.get_backend_pid()))
        return conn

    def run(self, name: str, work: Callable[[], object], allowed=(), pause_at: str | None = None):
        """Runs `work` to its end (its outcome) or, with `pause_at`, until it pauses there (None)."""
        operation = Operation(name, work, allowed, pause_at)
        operation.start()
        self.settle(operation)
        if operation.paused:
            self.paused.append(operation)
            return None
        return operation.outcome()

    def resume(self, operation: Operation, crash: bool = False):
        """Lets a paused operation go on, or crashes it: its connections are terminated (the
        transaction rolls back, as when its worker dies), then it is abandoned."""
        self.paused.remove(operation)
        if crash:
            with self.monitor.cursor() as cur:
                for conn, pid in operation.connections:
                    if not conn.closed:
                        cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
        operation.resume(crash)
        self.settle(operation)
        return operation.outcome()

    def settle(self, operation: Operation) -> None:
        deadline = time.monotonic() + self.HANG
        while not operation.stopped.wait(0.01):
            blocker = self._blocking()
            if blocker is not None:
                self.resume(blocker)
                deadline = time.monotonic() + self.HANG
            assert time.monotonic() < deadline, f"{operation} hangs, and no paused operation holds it"

    def _blocking(self) -> Operation | None:
        """The paused operation some backend waits for, if any."""
        pids = {pid: op for op in self.paused for conn, pid in op.connections if not conn.closed}
        if not pids:
            return None
        with self.monitor.cursor() as cur:
            cur.execute("SELECT DISTINCT unnest(pg_blocking_pids(pid)) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND wait_event_type = 'Lock'")
            blockers = [pid for pid, in cur.fetchall() if pid in pids]
        return pids[blockers[0]] if blockers else None

    def close(self) -> None:
        for operation in list(self.paused):
            self.resume(operation, crash=True)
        self.monitor.close()


def counts(staged) -> dict[str, int]:
    """Row counts per staging table, from a Committable's `staged` or the ledger's JSON."""
    return {name: s["rows"] if isinstance(s, dict) else s.rows for name, s in (staged or {}).items()}


def checkpoint_ranges(conn, checkpoint_id: int) -> list[OffsetRange]:
    """The ranges a checkpoint reads (a reprocessing: those of the checkpoint it replays)."""
    with conn.cursor() as cur:
        cur.execute("SELECT topic, partition, from_offset, to_offset FROM exactly_once.checkpoint_ranges "
                    "WHERE checkpoint_id = coalesce((SELECT replays FROM exactly_once.checkpoints WHERE id = %s), %s)",
                    (checkpoint_id, checkpoint_id))
        found = cur.fetchall()
    conn.rollback()
    return [OffsetRange(*r) for r in found]


def committed_records(topic: Topic, db_url: str, pipeline: str) -> list[Record]:
    """The committed Kafka records inside the pipeline's committed ranges."""
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT topic, partition, from_offset, to_offset FROM exactly_once.committed_ranges "
                    "WHERE pipeline = %s", (pipeline,))
        ranges = [OffsetRange(*r) for r in cur.fetchall()]
    return topic.within(ranges)


def quiesce(pipeline, clock: Clock, rounds: int = 40) -> None:
    """Drives the pipeline through the run path until nothing is left: what is pre-committed
    or stalled at commit is committed, other stalls are retried by an operator, open
    checkpoints are run by their (cleared) increment and commit tasks, and new runs begin
    until one finds nothing to read; then every committed record counts exactly once."""
    ledger, driver = pipeline.ledger, pipeline.driver
    with KafkaOffsets(KafkaClient.at(pipeline.servers)) as kafka:
        for n in range(rounds):
            for checkpoint_id, state, precommitted in _open(pipeline):
                if state == "stalled" and precommitted is None:
                    stalls.retry(ledger, checkpoint_id)
                    continue
                if state in ("planned", "running"):
                    tasks.run_increment(ledger, checkpoint_id, driver.execute)
                assert tasks.commit_checkpoint(ledger, checkpoint_id, 1) is Outcome.COMMITTED
            clock.advance(timedelta(seconds=1))
            begun = tasks.begin_checkpoint(ledger, kafka, f"quiescence{n}", None, None)
            if begun.checkpoint.is_empty and not _open(pipeline):
                break
        else:
            raise AssertionError(f"the pipeline did not come to rest in {rounds} runs: {_open(pipeline)}")
    pipeline.assert_exact()


def _open(pipeline) -> list[tuple]:
    with closing(psycopg2.connect(pipeline.db_url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, state::text, precommitted_attempt FROM exactly_once.checkpoints "
                    "WHERE pipeline = %s AND state NOT IN ('committed', 'aborted') ORDER BY id",
                    (pipeline.config.name,))
        return cur.fetchall()
