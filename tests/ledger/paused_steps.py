"""The ledger's operations as the stateful property test (tests/ledger/test_protocol_machine.py)
runs them: each in a worker thread, which can pause at a fault point inside its
transaction, holding its locks, until a later step resumes or crashes it.

An operation that waits for a lock held by a paused one would hang the test: `Steps.settle`
watches PostgreSQL's lock graph (`pg_blocking_pids`) while it waits, and resumes the paused
operation that blocks it (what a real scheduler would eventually do: the stuck task's
transaction ends one way or the other). A deadlock between the two is PostgreSQL's to break.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg2
import psycopg2.errors

_local = threading.local()  # the operation the current worker thread runs


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
