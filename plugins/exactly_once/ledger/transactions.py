"""The ledger's transactions on the pipeline database: each on a connection of its own, or,
while connections are kept, on one the same caller opened before and left idle. A plan ran
a dozen short transactions, each paying for a connection of its own: about 30 ms each over
TLS on a 2-core machine, a third of the plan (issue 63)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg2


class Transactions:
    def __init__(self, connect: Callable[[], object]):
        self._connect = connect
        self._idle: list | None = None  # the idle connections while kept; None when not keeping

    @contextmanager
    def transaction(self) -> Iterator[object]:
        """A cursor in a transaction of its own, committed when the block ends, rolled back
        if it raises. A transaction inside another gets a connection of its own."""
        idle = self._idle
        conn = _alive(idle) or self._connect()
        ended = False
        try:
            with conn, conn.cursor() as cur:
                yield cur
            ended = True
        finally:
            # Only a connection whose transaction committed is kept: one that raised may be broken.
            if ended and idle is not None and idle is self._idle and not conn.closed:
                idle.append(conn)
            else:
                conn.close()

    @contextmanager
    def kept(self) -> Iterator[None]:
        """Inside, a transaction takes an idle connection if there is one that still answers;
        all are closed after. One thread's: the idle connections are not locked."""
        if self._idle is not None:  # an outer block keeps them
            yield
            return
        self._idle = []
        try:
            yield
        finally:
            idle, self._idle = self._idle, None
            for conn in idle:
                conn.close()


def _alive(idle: list | None):
    """An idle connection that answers (its transaction begun), or None: a server restarted, or
    a pooler's idle timeout, while it waited would otherwise fail the transaction taking it
    (a recovery's commit counts such a failure towards a stall) where a new one would not."""
    while idle:
        conn = idle.pop()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
            return conn
        except psycopg2.Error:
            conn.close()
    return None
