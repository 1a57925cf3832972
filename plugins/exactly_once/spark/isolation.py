"""Record isolation: when writing a checkpoint's rows fails because of what some record
holds — a transform that raises on it, a value of a type the row checks do not know, a
CHECK constraint, a trigger, a foreign key of a final table — find those records by
bisection over the checkpoint's offsets, so that they go to the dead letters with the
error's own message and the rest commits (promise 8).

Which failures a record can cause is told by their SQLSTATE (exactly_once.sqlstates):
anything else (a lost connection, a killed executor) is not narrowed, as a bisection over
an outage would dead-letter every record.

The bisection itself is pure: `narrow` asks a probe about parts of the ranges; the probe
repeats the `Step` of the write that failed (exactly_once.spark.staging).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from exactly_once.errors import Permanent
from exactly_once.ledger.planning import OffsetRange

MAX_ISOLATED = 20
MAX_PROBES = 400

Probe = Callable[[Sequence[OffsetRange]], "str | None"]  # why the records of these ranges fail, or None


@dataclass(frozen=True)
class Step:
    """A step of an attempt's write, which a probe repeats on a part of the records: the
    transform and the row checks (no table), a table's COPY, or a sink's trial promotion."""

    table: str | None = None  # a sink's name, or the dead letters'
    trial: bool = False


ROWS = Step()


class NotIsolated(Permanent):
    """A failure no set of single records reproduces, or too many records fail."""


def size(ranges: Sequence[OffsetRange]) -> int:
    return sum(r.size for r in ranges)


def halves(ranges: Sequence[OffsetRange]) -> tuple[list[OffsetRange], list[OffsetRange]]:
    """The offsets split into two parts of (nearly) equal count, ranges kept in order."""
    wanted, first, second = size(ranges) // 2, [], []
    for r in ranges:
        taken = size(first)
        if taken >= wanted:
            second.append(r)
        elif taken + r.size <= wanted:
            first.append(r)
        else:
            cut = r.start + wanted - taken
            first.append(OffsetRange(r.topic, r.partition, r.start, cut))
            second.append(OffsetRange(r.topic, r.partition, cut, r.end))
    return first, second


def narrow(failing: Sequence[OffsetRange], probe: Probe, max_isolated: int = MAX_ISOLATED,
           max_probes: int = MAX_PROBES) -> dict[OffsetRange, str]:
    """The single offsets (one-offset ranges) whose records fail on their own, with why,
    found by bisecting `failing` (known to fail as a whole). When a failing part's first half
    passes, its second half is not probed but split at once: if single records fail, one is
    there. Each record's probe is on its own, so a failure that needs two records together
    (two rows of one checkpoint breaking a unique constraint) finds none of them: the caller
    says so. `NotIsolated` beyond the limits."""
    found: dict[OffsetRange, str] = {}
    probes = 0

    def ask(part: list[OffsetRange]) -> str | None:
        nonlocal probes
        probes += 1
        if probes > max_probes:
            raise NotIsolated(f"records not isolated within {max_probes} probes; found so far: " + describe(found))
        return probe(part)

    def failed(part: list[OffsetRange], why: str) -> None:
        if size(part) > 1:
            visit(part)
            return
        found[part[0]] = why
        if len(found) > max_isolated:
            raise NotIsolated(f"more than {max_isolated} records fail on their own, so the cause is not in a "
                              "few records: " + describe(found))

    def visit(part: list[OffsetRange]) -> None:
        first, second = ([r for r in half if r.size] for half in halves(part))
        why = ask(first) if first else None  # a checkpoint of one offset has no first half
        if why is not None:
            failed(first, why)
        elif size(second) > 1:  # the part failed and its first half passes
            visit(second)
            return
        why = ask(second)
        if why is not None:
            failed(second, why)

    visit([r for r in failing if r.size])
    return found


def describe(found: dict[OffsetRange, str], limit: int = 5) -> str:
    shown = "; ".join(f"{r.topic}[{r.partition}]@{r.start}: {why}" for r, why in list(found.items())[:limit])
    return shown + (f" (and {len(found) - limit} more)" if len(found) > limit else "")
