"""Reprocessing (promise 10): a committed checkpoint replayed over its frozen ranges with
the ledger's configuration. The replay is a checkpoint of its own (`Checkpoint.replays`)
that goes through the protocol's steps like any other; its commit (`Ledger.commit`)
replaces the replayed checkpoint's contribution to every sink (exactly_once.sinks). This
module begins one and reads what it did."""

from __future__ import annotations

from exactly_once.ledger.checkpoints import Begun, State
from exactly_once.ledger.lost_offsets import was_reset
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.refusals import NotReprocessable
from exactly_once.ledger.registration import final_columns
from exactly_once.ledger.retention import refuse_beyond_horizon
from exactly_once.ledger.rows import LedgerRows
from exactly_once.sinks import keeps_contributions


def reprocess(ledger: Ledger, checkpoint_id: int, dag_run_id: str) -> Begun:
    """Begins a reprocessing of a committed checkpoint (or of the one a reprocessing
    replays), requested by `dag_run_id`; returns the checkpoint's open reprocessing if there
    is one (a retry, or another request's: it takes it over). `NotReprocessable` if the
    checkpoint is not committed, is beyond the reprocess horizon (exactly_once.ledger.retention),
    or keyed sinks lack the contributions of checkpoints committed before they were kept."""
    ledger.refuse_if_stalled(dag_run_id)
    ledger.register()
    recovery = ledger.recover()
    with ledger.rows() as rows:
        rows.lock()
        checkpoint = rows.checkpoint(checkpoint_id)
        if checkpoint.replays is not None:
            checkpoint = rows.checkpoint(checkpoint.replays)
        if checkpoint.state is not State.COMMITTED:
            raise NotReprocessable(f"checkpoint {checkpoint.id} is {checkpoint.state.value}: only a committed "
                                   "checkpoint is reprocessed (an open one commits first)")
        gone = sorted({f"{r.topic}[{r.partition}]" for r in checkpoint.ranges if was_reset(r.topic)})
        if gone:
            raise NotReprocessable(f"checkpoint {checkpoint.id} read {', '.join(gone)}, a partition an operator reset "
                                   "since (reset-partition: its topic deleted and created again, or another "
                                   "cluster's): the records it read are in no log any more, so it cannot be read again")
        _refuse_unretractable(ledger.config)
        rows.run("open_reprocessing", checkpoint_id=checkpoint.id)
        found = rows.cur.fetchone()
        if found is not None:  # begun inside the horizon: no fold takes the checkpoint while it is open
            return Begun(rows.checkpoint(found[0]), recovery, new=False)
        refuse_beyond_horizon(ledger, rows.cur, checkpoint.id)
        _refuse_inexact(rows)
        now = ledger.now()
        rows.run("insert_reprocessing", checkpoint_id=checkpoint.id, dag_run_id=dag_run_id,
                 lease_until=now + ledger.config.lease, now=now)
        return Begun(rows.checkpoint(rows.cur.fetchone()[0]), recovery, new=True)


def _refuse_unretractable(config) -> None:
    """A kafka sink's records cannot be taken back: it is reprocessed only where it says its
    records are published again (`on_reprocess: republish`)."""
    refusing = [f"{s.name} (topic {s.topic})" for s in config.sinks if s.mode == "kafka" and s.on_reprocess == "refuse"]
    if refusing:
        raise NotReprocessable(f"pipeline {config.name!r}: kafka sink(s) {', '.join(refusing)} cannot take back the "
                               "records Kafka has; set `on_reprocess: republish` to publish the new records too, "
                               "each with the header exactly_once.replaces naming the checkpoint they replace")


def _refuse_inexact(rows: LedgerRows) -> None:
    """What keeps a keyed sink from being recomputed exactly: a key column that takes NULL
    (no NULL equals another, so its rows could be found neither to take back nor to
    recompute), or checkpoints whose contributions were not kept."""
    config = rows.config
    keyed = [s for s in config.sinks if keeps_contributions(s)]
    columns = final_columns(rows)
    nullable = [f"{s.name}.{c.name}" for s in keyed for c in columns[s.name] if c.name in s.keys and not c.not_null]
    if nullable:
        raise NotReprocessable(f"pipeline {config.name!r}: key column(s) {nullable} take NULL, whose rows a "
                               "reprocessing cannot find again; make them NOT NULL to reprocess")
    keyed = [s.name for s in keyed]
    if not keyed:
        return
    rows.run("contributions_not_kept", pipeline=config.name)
    missing = [checkpoint_id for checkpoint_id, in rows.cur.fetchall()]
    if missing:
        raise NotReprocessable(
            f"pipeline {config.name!r}: checkpoint(s) {', '.join(map(str, missing[:10]))} were committed before "
            f"each checkpoint's contribution was kept, so the keys of sinks {keyed} cannot be recomputed exactly; "
            "only the pipeline's append sinks could be, and they are not reprocessed apart")


def latest_processing(ledger: Ledger, checkpoint_id: int) -> tuple[int, str | None]:
    """(checkpoint, configuration version) of the commit whose rows the sinks hold for the
    checkpoint's ranges: its own, or its latest reprocessing's."""
    with ledger.rows() as rows:
        rows.run("latest_processing", checkpoint_id=checkpoint_id)
        return rows.cur.fetchone()


def replaced(ledger: Ledger, checkpoint_id: int) -> dict | None:
    """What a reprocessing's commit replaced: per sink, rows taken back (old) and put in (new)."""
    with ledger.rows() as rows:
        rows.run("replaced", checkpoint_id=checkpoint_id, pipeline=ledger.config.name)
        found = rows.cur.fetchone()
        return found and found[0]
