"""What the ledger and Kafka say about pipelines, read-only: stalled checkpoints first,
the last commit, lag per partition, open checkpoints, gaps, the checkpoint history, and
which checkpoints hold an interval's offsets (the log of a backfill over intervals
already taken). This module reads them into a `PipelineStatus` and is the command;
status_report.py renders it.

    python -m exactly_once.operate.status [--pipeline NAME] [--history N]

reads the ledger through the Airflow connection pipeline_db_read (the read role) when it is
defined, else pipeline_db, and Kafka through kafka_default. Exits 2 while a pipeline shown is
stalled, so monitoring can call it.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timedelta

from exactly_once import connections
from exactly_once.ledger import run_refusals
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.planning import OffsetRange, replaced
from exactly_once.ledger.run_refusals import Refusal
from exactly_once.operate.status_report import render
from exactly_once.publishing import publisher
from exactly_once.sqlfiles import named

Q = named("status.sql")


@dataclass(frozen=True)
class CheckpointSummary:
    id: int
    dag_run_id: str
    interval_start: datetime | None
    interval_end: datetime | None
    state: str
    records: int | None
    ranges: tuple[OffsetRange, ...]    # the non-empty ones
    until_precommit: timedelta | None  # created → pre-committed: planning, Spark, staging writes
    until_commit: timedelta | None     # pre-committed (or created) → committed
    attempts: int
    replays: int | None = None         # a reprocessing: the checkpoint it replays
    config_version: str | None = None  # of its latest attempt

    @property
    def what(self) -> str:
        """Its state, and what it replays."""
        return self.state if self.replays is None else f"{self.state}, reprocesses {self.replays}"


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    committed_end: int   # the next offset no commit has covered
    last_stable: int     # Kafka's read_committed end
    recorded_id: str | None = None  # the id of the topic the ledger's offsets are of (KIP-516)
    topic_id: str | None = None     # the topic's id in Kafka now

    @property
    def lag(self) -> int:
        """Offsets not committed yet. Transaction markers and aborted records take offsets too,
        so a caught-up partition fed by transactions can show 1: the last commit marker."""
        return max(0, self.last_stable - self.committed_end)

    @property
    def went_back(self) -> bool:
        """The log ends before offsets already committed, or is another topic's (its id is not
        the one recorded: the topic created again, another cluster): the planner refuses to go
        on (lost_offsets.OffsetsWentBack)."""
        return self.last_stable < self.committed_end or replaced(self.recorded_id, self.topic_id)


@dataclass(frozen=True)
class LastCommit:
    id: int
    dag_run_id: str
    interval_end: datetime | None
    committed_at: datetime
    records: int


@dataclass(frozen=True)
class Gap:
    range: OffsetRange
    checkpoint_id: int
    recorded_at: datetime


@dataclass(frozen=True)
class Stall:
    checkpoint_id: int
    dag_run_id: str
    ranges: tuple[OffsetRange, ...]
    failed_attempts: int
    since: datetime | None
    last_error: str
    at_commit: bool = False  # stalled at commit, its pre-commit kept


@dataclass(frozen=True)
class Backlog:
    """A kafka sink's committed rows that Kafka does not have yet (exactly_once.publishing)."""

    sink: str
    records: int
    first_checkpoint: int
    published_through: int | None  # the last checkpoint published
    published_at: datetime | None
    held_behind: int | None  # the checkpoint, before some of them in frontier order, they wait for
    held_reason: str | None = None  # why, when not "open, planned before" (publishing.progress.Hold)


@dataclass(frozen=True)
class PipelineStatus:
    name: str
    stalls: tuple[Stall, ...]
    last_commit: LastCommit | None
    lag: tuple[PartitionLag, ...]
    open: tuple[CheckpointSummary, ...]
    gaps: tuple[Gap, ...]
    history: tuple[CheckpointSummary, ...]
    backlog: tuple[Backlog, ...] = ()
    refusals: tuple[Refusal, ...] = ()  # runs refused at begin, kafka sinks' publishing refused

    @property
    def stopped(self) -> bool:
        """No run goes on (or a kafka sink's publishing does not): a checkpoint is stalled, a
        partition's offsets went backwards, or runs or publishing are refused again and again
        or for a reason no retry fixes."""
        return bool(self.stalls) or any(p.went_back for p in self.lag) or any(r.loud for r in self.refusals)


def ledger_reader():
    """Connections that read the ledger (this command, the pipelines view): through
    `pipeline_db_read` when it is defined, else `pipeline_db`."""
    return connections.defined_connector(connections.PIPELINE_DB_READ) or connections.connector()


def pipelines(conn) -> list[str]:
    """The registered pipelines, and those whose first runs were refused before registration."""
    with conn.cursor() as cur:
        cur.execute(Q["pipelines_and_refused" if has_refusals(conn) else "pipelines"])
        return [name for name, in cur.fetchall()]


def has_refusals(conn) -> bool:
    """Whether the ledger records refusals (migration 0021): status may read a ledger not migrated yet."""
    with conn.cursor() as cur:
        cur.execute("SELECT pg_catalog.to_regclass('exactly_once.refusals') IS NOT NULL")
        return cur.fetchone()[0]


def read_status(conn, kafka: KafkaOffsets | None, pipeline: str, history: int = 10) -> PipelineStatus:
    """The pipeline's status; its lag only when Kafka is given to ask."""
    where = {"pipeline": pipeline}
    with conn.cursor() as cur:
        cur.execute(Q["last_committed"], where)
        last = cur.fetchone()
        cur.execute(Q["committed_ends"], where)
        ends = cur.fetchall()
        cur.execute(Q["gaps"], where)
        gaps = tuple(Gap(OffsetRange(t, p, a, b), cp, at) for t, p, a, b, cp, at in cur.fetchall())
        cur.execute(Q["stalled"], where)
        stalls = tuple(Stall(cp, run, tuple(OffsetRange(*r) for r in ranges), failed, since, error, at_commit)
                       for cp, run, ranges, failed, since, error, at_commit in cur.fetchall())
        cur.execute(Q["outbox_backlog"], where)
        backlog = tuple(_backlog(cur, pipeline, *row) for row in cur.fetchall())
        refusals = run_refusals.read(cur, pipeline) if has_refusals(conn) else ()
    lag = () if kafka is None else tuple(PartitionLag(t, p, end, now.last_stable, recorded_id, now.topic_id)
                                         for t, p, end, recorded_id in ends
                                         for now in [kafka.offsets(t, p, None, None)])
    return PipelineStatus(pipeline, stalls, None if last is None else LastCommit(*last), lag,
                          _checkpoints(conn, pipeline, open_only=True, limit=None), gaps,
                          _checkpoints(conn, pipeline, open_only=False, limit=history), backlog, refusals)


def _checkpoints(conn, pipeline: str, open_only: bool, limit: int | None) -> tuple[CheckpointSummary, ...]:
    with conn.cursor() as cur:
        cur.execute(Q["checkpoints"], {"pipeline": pipeline, "open_only": open_only, "limit": limit})
        rows = cur.fetchall()
    return tuple(CheckpointSummary(cp, run, start, end, state, records, tuple(OffsetRange(*r) for r in ranges),
                                   until_precommit, until_commit, attempts, replays, version)
                 for cp, run, start, end, state, records, ranges, until_precommit, until_commit, attempts, replays,
                 version in rows)


def _backlog(cur, pipeline: str, sink: str, records: int, first: int, published_through: int | None,
             published_at: datetime | None, last: int) -> Backlog:
    """A sink's backlog, and what holds some of its rows back: the pipeline's first work not
    committed in frontier order (publishing: outbox.sql, held_behind), if it comes before them."""
    hold = publisher.held_behind(cur, pipeline, sink)
    if hold is None or hold.order >= (last, last):
        return Backlog(sink, records, first, published_through, published_at, None)
    reason = ("aborted, its offsets not planned again" if hold.checkpoint_id is None else
              None if hold.checkpoint_id == hold.rank else f"open, plans again offsets of checkpoint {hold.rank}")
    return Backlog(sink, records, first, published_through, published_at, hold.checkpoint_id or hold.rank, reason)


STALLED = 2  # the exit status while a pipeline is stalled


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m exactly_once.operate.status", description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", help="one pipeline (default: every registered one)")
    parser.add_argument("--history", type=int, default=10, help="checkpoints of the history to show")
    args = parser.parse_args()
    connect = connections.for_command_line(ledger_reader)
    kafka_client = connections.for_command_line(connections.kafka_client)
    with closing(connect()) as conn, KafkaOffsets(kafka_client) as kafka:
        names = pipelines(conn)
        if args.pipeline is not None and args.pipeline not in names:
            raise SystemExit(f"pipeline {args.pipeline!r} is not registered in the ledger (registered: "
                             f"{', '.join(names) or 'none'})")
        statuses = [read_status(conn, kafka, name, args.history) for name in ([args.pipeline] if args.pipeline
                                                                            else names)]
    for status in sorted(statuses, key=lambda s: not s.stopped):  # stalled pipelines first
        print(render(status) + "\n")
    return STALLED if any(s.stopped for s in statuses) else 0


if __name__ == "__main__":
    sys.exit(main())
