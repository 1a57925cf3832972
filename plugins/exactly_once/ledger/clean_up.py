"""A committed checkpoint's staging rows, cleared after its commit transaction.

A staging table that holds only the checkpoint's rows, and that no transaction is using
(no job writing, no commit or probe reading), is truncated: its space is free at once,
where a DELETE reads every row through the frozen-rows trigger and leaves them dead for
vacuum to reclaim (6.9 s for 4.3 M rows, docs/internals/performance.md). Any other table
(another checkpoint's rows in it, a lock on it) gets the DELETE, without waiting for a
lock. Each table is cleared in a transaction of its own, so the truncation's lock is held
for that table's statement only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import psycopg2
from psycopg2 import errors, sql

from exactly_once.config import PipelineConfig
from exactly_once.ledger.tables import staging_tables
from exactly_once.sqlfiles import named

if TYPE_CHECKING:
    from exactly_once.ledger.access import LedgerAccess

log = logging.getLogger(__name__)
Q = named("ledger.sql")


def clean_up(ledger: LedgerAccess, checkpoint_id: int, config: PipelineConfig) -> None:
    """Deletes a committed checkpoint's staging rows (those of `config`'s sinks). The
    checkpoint is committed whatever happens here, so a failure is logged, not raised:
    a retried commit or the next recovery deletes the rows."""
    try:
        with ledger.rows() as rows:  # one connection, a transaction per table
            for table in staging_tables(config).values():
                if not _truncated(rows.cur, table, checkpoint_id):
                    rows.cur.execute(sql.SQL(Q["delete_staging"]).format(staging=table),
                                     {"checkpoint_id": checkpoint_id, "attempt": None})
                rows.cur.connection.commit()  # which releases the truncation's lock
    except psycopg2.Error as error:
        log.warning("checkpoint %s is committed; its staging clean-up failed and is left to a retry or the "
                    "next recovery: %s", checkpoint_id, error)


def _truncated(cur, table: sql.Identifier, checkpoint_id: int) -> bool:
    """Truncates the table if it holds only the checkpoint's rows and nobody holds a lock on
    it (then no uncommitted rows of another attempt can be in it either); else False, the
    transaction as it was."""
    cur.execute("SAVEPOINT truncation")
    try:
        cur.execute(sql.SQL(Q["lock_staging_now"]).format(staging=table))
    except errors.LockNotAvailable:
        cur.execute("ROLLBACK TO SAVEPOINT truncation")
        return False
    cur.execute(sql.SQL(Q["staged_by_others"]).format(staging=table), {"checkpoint_id": checkpoint_id})
    if cur.fetchone()[0]:
        cur.execute("ROLLBACK TO SAVEPOINT truncation")  # and its lock: the DELETE needs no more
        return False
    cur.execute(sql.SQL(Q["truncate_staging"]).format(staging=table))
    return True
