"""Refusals that leave no checkpoint behind, kept where stalls are seen (issue 60, item 8):
a run's begin refused before it planned (a configuration refused at load, a preflight
problem, the planner's refusal, such as partitions added under an upsert sink ordered by
offset), and a kafka sink's publishing refused (an output record Kafka keeps refusing, a
topic gone, an ACL). Each is one row per (pipeline, kind) of `exactly_once.refusals`
(migration 0021): `begin`, or `publish:<sink>`, with when it was first and last refused,
how often in a row, whether a retry may help, and its last error (bounded, without values:
`errors.error_text`). A begin that succeeds clears `begin`; a publish of the sink that
passes clears its `publish:<sink>`. Status, the pipelines view and the metrics read them
(`loud`: refused for a reason no retry fixes, or `REPEATS` times in a row).

Recording never hides the failure it records: a ledger that cannot be written (the
database down, the migration not applied yet) is logged and the failure raised as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import datetime

from exactly_once.errors import error_text, is_retryable
from exactly_once.sqlfiles import named

log = logging.getLogger(__name__)
BEGIN = "begin"
PUBLISH = "publish:"
REPEATS = 3  # refusals in a row that make a retryable one loud (stall_after's default)


def publishing(sink: str) -> str:
    return f"{PUBLISH}{sink}"


@dataclass(frozen=True)
class OutputRow:
    """The outbox row Kafka refused, and where it was going."""

    checkpoint_id: int
    position: int
    epoch: str
    topic: str

    def __str__(self) -> str:
        return f"checkpoint {self.checkpoint_id} row {self.position} (epoch {self.epoch})"


@dataclass(frozen=True)
class Refusal:
    pipeline: str
    kind: str                 # 'begin', or 'publish:<sink>'
    first_at: datetime
    last_at: datetime
    count: int                # refused in a row
    retryable: bool
    error: str
    topic: str | None = None  # publishing: the sink's topic
    checkpoint_id: int | None = None  # publishing: the outbox row Kafka refused, if one row is at fault
    position: int | None = None

    @property
    def sink(self) -> str | None:
        return self.kind.removeprefix(PUBLISH) if self.kind.startswith(PUBLISH) else None

    @property
    def loud(self) -> bool:
        """No run (or no publish) goes on by itself: refused for a reason no retry fixes, or again and again."""
        return not self.retryable or self.count >= REPEATS


def record(connect: Callable, pipeline: str, kind: str, error: BaseException | str, retryable: bool | None = None,
           row: OutputRow | None = None, topic: str | None = None) -> None:
    """One more refusal of `kind`, in a transaction of its own."""
    text = error_text(error if isinstance(error, str) else f"{type(error).__name__}: {error}")
    retry = is_retryable(error) if retryable is None and not isinstance(error, str) else bool(retryable)
    try:
        with closing(connect()) as conn, conn, conn.cursor() as cur:
            cur.execute(named("refusals.sql")["record"], {
                "pipeline": pipeline, "kind": kind, "retryable": retry, "error": text,
                "topic": row.topic if row is not None else topic,
                "checkpoint_id": None if row is None else row.checkpoint_id,
                "position": None if row is None else row.position})
    except Exception as unrecorded:  # noqa: BLE001 - the refusal itself is raised by the caller
        log.warning("pipeline %s: refusal %s not recorded (%s): %s", pipeline, kind, unrecorded, text)


def clear(connect: Callable, pipeline: str, kind: str) -> None:
    try:
        with closing(connect()) as conn, conn, conn.cursor() as cur:
            cur.execute(named("refusals.sql")["clear"], {"pipeline": pipeline, "kind": kind})
    except Exception as uncleared:  # noqa: BLE001 - a step that succeeded stays a success
        log.warning("pipeline %s: refusal %s not cleared: %s", pipeline, kind, uncleared)


@contextmanager
def recording(connect: Callable, pipeline: str, kind: str,
              unless: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """A step whose failure is recorded as a refusal of `kind` (but for `unless`: failures
    already loud elsewhere, such as a stall), and whose success clears it."""
    try:
        yield
    except Exception as error:
        if not isinstance(error, unless):
            record(connect, pipeline, kind, error)
        raise
    clear(connect, pipeline, kind)


def outboxes_over(connect: Callable, pipeline: str, bound: int) -> list[tuple[str, int]]:
    """(sink, records) of the pipeline's kafka sinks whose outbox holds more than `bound`
    records not published."""
    with closing(connect()) as conn, conn, conn.cursor() as cur:
        cur.execute(named("refusals.sql")["outbox_over"], {"pipeline": pipeline, "bound": bound})
        return cur.fetchall()


def read(cur, pipeline: str) -> tuple[Refusal, ...]:
    """The pipeline's refusals, begin first, then by kind."""
    cur.execute(named("refusals.sql")["refusals"], {"pipeline": pipeline})
    return tuple(Refusal(pipeline, *row) for row in cur.fetchall())
