"""The status report, rendered: pure text from what status.py reads (a `PipelineStatus`):
stalls and refusals first, each with its way out, then the last commit, lag, open
checkpoints, gaps, kafka sinks' backlog and the checkpoint history; and the plain `table`
the report, the demo and the fault matrix print.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from exactly_once.dead_letter_budget import BREACH
from exactly_once.ledger import run_refusals
from exactly_once.ledger.planning import describe_ranges, replaced
from exactly_once.ledger.run_refusals import Refusal
from exactly_once.publishing.progress import OutboxMismatch

if TYPE_CHECKING:  # only their attributes are read: status.py, which prints the report, reads them
    from exactly_once.operate.status import Backlog, CheckpointSummary, PartitionLag, PipelineStatus, Stall


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
        elif refusal.error.startswith(f"{OutboxMismatch.__name__}:"):
            way_out = ("the database does not hold what Kafka's progress names (restored from a backup?): compare "
                       "the topic with the outbox and skip what the topic holds, then publish again (the docs' "
                       "Restore from a backup page, \"Kafka sinks after a restore\")")
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
