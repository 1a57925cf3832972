"""What the Spark job asks of the ledger's rows beyond reading them, through the two
functions of sql/migrations/0011_roles_by_duty.sql (the job role may not write final tables,
nor delete staging rows): a promotion on trial, and deleting its own staged rows. Each
asks for the attempt's token, which the attempt's task hands its job; `write` prepares the
trial's statements when the attempt starts, with the commit role's rights.
"""

from __future__ import annotations

from exactly_once.ledger.checkpoints import Checkpoint
from exactly_once.ledger.rows import LedgerRows
from exactly_once.sqlstates import DatabaseRefusal


def write(rows: LedgerRows, checkpoint: Checkpoint) -> None:
    """The promotions the checkpoint's running attempt may try, bound to its rows and its
    probes' (tagged with the attempt's negative); earlier attempts' go."""
    rows.run("forget_trial_promotions", checkpoint_id=checkpoint.id)
    for tag in (checkpoint.attempt, -checkpoint.attempt):
        params = {"checkpoint_id": checkpoint.id, "attempt": tag, "slot": checkpoint.slot}
        statements = ((sink.name, statement) for sink in rows.config.sinks
                      for statement in rows.promotion(sink, checkpoint.replays is not None))
        for position, (sink, statement) in enumerate(statements):
            rows.run("insert_trial_promotion", checkpoint_id=checkpoint.id, tag=tag, position=position, sink=sink,
                     promotion=rows.cur.mogrify(statement, params).decode())


def token(rows: LedgerRows, checkpoint_id: int, attempt: int) -> str:
    """The attempt's token (the ledger's owner alone may derive it)."""
    rows.run("attempt_token", checkpoint_id=checkpoint_id, attempt=attempt)
    return rows.cur.fetchone()[0]


def promote(rows: LedgerRows, checkpoint_id: int, tag: int, sinks: list[str], token: str
            ) -> tuple[str, DatabaseRefusal] | None:
    """The rows tagged `tag` promoted into these sinks' tables in turn and rolled back, with
    the rights of the ledger's owner: the first sink that refuses them with the database's
    error, or None."""
    rows.run("trial_promote", checkpoint_id=checkpoint_id, tag=tag, sinks=sinks, token=token)
    refused = rows.cur.fetchone()
    return None if refused is None else (refused[0], DatabaseRefusal(refused[1], refused[2]))


def discard(rows: LedgerRows, checkpoint_id: int, tag: int, token: str) -> None:
    """The running attempt's rows tagged `tag` (its own or its probes'), from every staging table."""
    for table in rows.staging.values():
        rows.run("discard_staged", staging=table.as_string(rows.cur), checkpoint_id=checkpoint_id, tag=tag,
                 token=token)
