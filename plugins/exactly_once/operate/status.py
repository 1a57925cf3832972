"""What the ledger and Kafka say about pipelines, read-only: stalled checkpoints first,
the last commit, lag per partition, open checkpoints, gaps, the checkpoint history, and
which checkpoints hold an interval's offsets (the log of a backfill over intervals
already taken).

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
from exactly_once.dead_letter_budget import BREACH
from exactly_once.ledger import run_refusals
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.planning import OffsetRange, describe_ranges, replaced
from exactly_once.ledger.run_refusals import Refusal
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


# -- rendering: pure ------------------------------------------------------------------

def table(headers: list[str], rows: list[list]) -> str:
    cells = [headers] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _when(t: datetime | None) -> str:
    return "" if t is None else t.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def duration(d: timedelta | None) -> str:
    return "" if d is None else f"{d.total_seconds():.1f} s"


def render_checkpoints(checkpoints: tuple[CheckpointSummary, ...]) -> str:
    return table(["id", "interval", "ranges", "records", "state", "attempts", "config", "to pre-commit",
                  "to commit"],
                 [[c.id, f"{_when(c.interval_start)} → {_when(c.interval_end)}", describe_ranges(c.ranges),
                   c.records or 0, c.what, c.attempts, c.config_version or "", duration(c.until_precommit),
                   duration(c.until_commit)]
                  for c in checkpoints])


def render_stall(pipeline: str, stall: Stall) -> str:
    retry = f"`python -m exactly_once.operate.stalls retry {stall.checkpoint_id}`"
    if stall.last_error.startswith(BREACH):  # dead-lettering more records would only add to them
        way_out = (f"look at its dead letters, then clear its commit task to commit it as it is; or fix the "
                   f"pipeline (its schema, its transform) and run {retry}")
    else:
        way_out = (f"fix the cause, then clear its {'commit' if stall.at_commit else 'increment'} task or run "
                   f"{retry}; or dead-letter the records at fault: `python -m exactly_once.operate.stalls "
                   f"dead-letter {pipeline} 'TOPIC[PARTITION]@FROM..TO' --reason WHY`")
    return (f"STALLED: checkpoint {stall.checkpoint_id} (DAG run {stall.dag_run_id}) since {_when(stall.since)}, "
            f"after {stall.failed_attempts} failed attempt(s); ranges {', '.join(r.label for r in stall.ranges)}\n"
            f"  last error: {stall.last_error}\n"
            f"  way out: {way_out}")


def render_refusal(pipeline: str, refusal: Refusal) -> str:
    """A refusal of the pipeline's runs or of a sink's publishing: STALLED once it is loud."""
    since = (f"since {_when(refusal.first_at)}, {refusal.count} time(s), last at {_when(refusal.last_at)}"
             + ("" if refusal.loud else f"; a retry may pass: loud after {run_refusals.REPEATS} in a row"))
    if refusal.sink is None:
        what = f"runs refused at begin {since}; no checkpoint is planned"
        way_out = ("fix the cause (the configuration, a table, a topic, a connection); the next begin that "
                   "succeeds clears this")
    else:
        what = f"publishing of kafka sink {refusal.sink} (topic {refusal.topic}) refused {since}"
        if refusal.checkpoint_id is not None:
            what += (f"; Kafka refuses checkpoint {refusal.checkpoint_id} row {refusal.position}, and the sink's "
                     "later rows wait behind it (runs go on while its outbox is within its bound)")
            way_out = ("fix the cause (e.g. raise the topic's max.message.bytes) and publish again (`python -m "
                       f"exactly_once publish {pipeline}`, or the next run), or move the row to the outbox's dead "
                       f"letters: `python -m exactly_once.operate.stalls dead-letter-output {pipeline} "
                       f"{refusal.sink} --reason WHY`")
        else:
            way_out = ("fix the cause (the topic, the publisher's rights) and publish again (`python -m exactly_once "
                       f"publish {pipeline}`, or the next run)")
    return (f"{'STALLED' if refusal.loud else 'REFUSED'}: {what}\n"
            f"  last error: {refusal.error}\n"
            f"  way out: {way_out}")


def render_went_back(pipeline: str, lag: PartitionLag) -> str:
    created_again = (f" of another topic: its id was {lag.recorded_id}, now {lag.topic_id} (created again)"
                     if replaced(lag.recorded_id, lag.topic_id) else "")
    return (f"STALLED: {lag.topic}[{lag.partition}]: offsets went backwards: committed up to {lag.committed_end}, "
            f"but the log ends at {lag.last_stable}{created_again}\n"
            f"  way out: `python -m exactly_once.operate.stalls reset-partition {pipeline} '{lag.topic}[{lag.partition}]' "
            "--to OFFSET --reason WHY`")


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


def held_behind(b: Backlog) -> str:
    return "" if b.held_behind is None else f"checkpoint {b.held_behind} ({b.held_reason or 'open, planned before'})"


def render_backlog(backlog: tuple[Backlog, ...]) -> str:
    return "kafka sinks' records committed, not yet published:\n" + table(
        ["sink", "records", "from checkpoint", "published through", "published", "held behind"],
        [[b.sink, b.records, b.first_checkpoint, b.published_through, _when(b.published_at),
          held_behind(b)] for b in backlog])


def render(status: PipelineStatus) -> str:
    last = status.last_commit
    parts = [f"pipeline {status.name}" + (" — STALLED" if status.stopped else ""),
             *(render_stall(status.name, stall) for stall in status.stalls),
             *(render_went_back(status.name, p) for p in status.lag if p.went_back),
             *(render_refusal(status.name, r) for r in status.refusals),
             "last committed checkpoint: " + ("none" if last is None else
                                              f"{last.id} ({last.records} records, interval end "
                                              f"{_when(last.interval_end)}, committed {_when(last.committed_at)})"),
             "lag per partition (offsets):",
             table(["topic", "partition", "committed up to", "last stable", "lag"],
                   [[p.topic, p.partition, p.committed_end, p.last_stable, p.lag] for p in status.lag]),
             "open checkpoints: " + ("none" if not status.open else ""),
             *([render_checkpoints(status.open)] if status.open else []),
             "gaps (offsets lost to retention): " + ("none" if not status.gaps else ""),
             *([table(["topic", "partition", "offsets", "checkpoint", "recorded"],
                      [[g.range.topic, g.range.partition, f"{g.range.start}..{g.range.end}", g.checkpoint_id,
                        _when(g.recorded_at)] for g in status.gaps])] if status.gaps else []),
             *([render_backlog(status.backlog)] if status.backlog else []),
             f"checkpoint history (latest {len(status.history)}):",
             render_checkpoints(status.history)]
    return "\n".join(parts)


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
