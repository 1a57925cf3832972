"""Record isolation: when writing a checkpoint's rows fails because of what some record
holds — a transform that raises on it, a value of a type the row checks do not know, a
CHECK constraint, a trigger, a foreign key of a final table — find those records, so that
they go to the dead letters with the error's own message and the rest commits (promise 8).

Where the step that failed runs each record's rows in the Spark task its record is in (the
transform and row checks; an append sink's COPY), the records are found by the failing
tasks: the part is spread over k pieces, each in a Spark task of its own. For the transform
and row checks, every task runs to its end, and each piece whose task failed is searched
next, from the last row its task gave (`exactly_once.spark.sweeps`): a few Spark jobs for the
first record each failing piece holds, what follows it left to the next round of the write. For
a COPY, the job stops at the first task that fails, which names the piece to search next
(`locate_failing`): about log_k(n) Spark jobs a record. Where the step does not (an
aggregate's rows, a trial promotion), or the failure names no task, by bisection over the
offsets (`narrow`).

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
# Runs the step over all the pieces at once, each piece in a Spark task of its own: None when
# every piece passes, else which pieces failed, which passed before the job stopped, and why.
# Raises `Unlocated` when it cannot tell which task failed.
Locate = Callable[[Sequence[Sequence[OffsetRange]]], "Located | None"]
# A job's pieces, each a task: a task of a Python UDF costs ~40 ms on 2 cores (a warm job of 32
# such tasks took 1.2 s, of 8 0.5 s), so 16 (900,000 records in 5 levels, 310 in 3) cost less than 32.
PIECES = 16


@dataclass(frozen=True)
class Step:
    """A step of an attempt's write, which a probe repeats on a part of the records: the
    transform and the row checks (no table), a table's COPY, or a sink's trial promotion."""

    table: str | None = None  # a sink's name, or the dead letters'
    trial: bool = False


ROWS = Step()


class NotIsolated(Permanent):
    """A failure no set of single records reproduces, or too many records fail."""


@dataclass(frozen=True)
class Located:
    """What a located probe's failed job says: the pieces whose tasks failed (at least one),
    those whose tasks passed (each on its own: none of their records fails alone), and why."""

    failed: frozenset[int]
    passed: frozenset[int]
    why: str


class Unlocated(Exception):
    """A located probe failed without naming the task that failed."""


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


def pieces(ranges: Sequence[OffsetRange], k: int) -> list[list[OffsetRange]]:
    """The offsets split into k parts of (nearly) equal count, ranges kept in order (a part
    is empty when there are fewer offsets than parts)."""
    total, parts, part, taken = size(ranges), [], [], 0
    bounds = [total * (i + 1) // k for i in range(k)]  # offsets taken when each part ends
    for r in ranges:
        start = r.start
        while start < r.end:
            while taken == bounds[len(parts)]:  # full (empty, when offsets are fewer than parts)
                parts.append(part)
                part = []
            cut = min(r.end, start + bounds[len(parts)] - taken)
            part.append(OffsetRange(r.topic, r.partition, start, cut))
            taken, start = taken + cut - start, cut
    parts.append(part)
    return parts + [[] for _ in range(k - len(parts))]


def without(ranges: Sequence[OffsetRange], taken: Sequence[OffsetRange]) -> list[OffsetRange]:
    """`ranges` less the offsets of `taken`, ranges kept in order."""
    left = list(ranges)
    for t in taken:
        kept = []
        for r in left:
            if (r.topic, r.partition) != (t.topic, t.partition) or r.end <= t.start or t.end <= r.start:
                kept.append(r)
                continue
            if r.start < t.start:
                kept.append(OffsetRange(r.topic, r.partition, r.start, t.start))
            if t.end < r.end:
                kept.append(OffsetRange(r.topic, r.partition, t.end, r.end))
        left = kept
    return left


class Budget:
    """Isolation's limits, counted once over both searches and every round of an attempt's
    write: the Spark jobs asked (probes and located probes alike) and the records found."""

    def __init__(self, max_isolated: int = MAX_ISOLATED, max_probes: int = MAX_PROBES):
        self.max_isolated, self.max_probes = max_isolated, max_probes
        self.found: dict[OffsetRange, str] = {}
        self.jobs = 0
        self._records: int | None = None  # the checkpoint's good records, once counted

    def found_every_record(self, records: Callable[[], int]) -> bool:
        """Whether two or more records were found and they are all of the checkpoint's good
        records, which `records` counts (a Spark job: once an attempt, not once a round)."""
        if len(self.found) < 2:
            return False
        if self._records is None:
            self._records = records()
        return len(self.found) == self._records

    def ask(self, job: Callable, what):
        self.jobs += 1
        if self.jobs > self.max_probes:
            raise NotIsolated(f"records not isolated within {self.max_probes} probes; found so far: "
                              + describe(self.found))
        return job(what)

    def add(self, offset: OffsetRange, why: str) -> None:
        self.found[offset] = why
        if len(self.found) > self.max_isolated:
            raise NotIsolated(f"more than {self.max_isolated} records fail on their own, so the cause is not in a "
                              "few records: " + describe(self.found))


def narrow(failing: Sequence[OffsetRange], probe: Probe, budget: Budget | None = None) -> dict[OffsetRange, str]:
    """The single offsets (one-offset ranges) whose records fail on their own, with why,
    found by bisecting `failing` (known to fail as a whole). When a failing part's first half
    passes, its second half is not probed but split at once: if single records fail, one is
    there. Each record's probe is on its own, so a failure that needs two records together
    (two rows of one checkpoint breaking a unique constraint) finds none of them: the caller
    says so. `NotIsolated` beyond the limits of `budget` (the attempt's, shared by its rounds)."""
    budget = budget or Budget()
    earlier = set(budget.found)
    _bisect(failing, probe, budget)
    return found_since(budget, earlier)


def found_since(budget: Budget, earlier: set[OffsetRange]) -> dict[OffsetRange, str]:
    return {offset: why for offset, why in budget.found.items() if offset not in earlier}


def _bisect(failing: Sequence[OffsetRange], probe: Probe, budget: Budget) -> bool:
    """`narrow` within a budget that may be shared; whether it found any record."""
    before = len(budget.found)

    def ask(part: list[OffsetRange]) -> str | None:
        return budget.ask(probe, part)

    def failed(part: list[OffsetRange], why: str) -> None:
        if size(part) > 1:
            visit(part)
            return
        budget.add(part[0], why)

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
    return len(budget.found) > before


def locate_failing(failing: Sequence[OffsetRange], locate: Locate, probe: Probe, k: int = PIECES,
                   budget: Budget | None = None, first: tuple[Sequence[Sequence[OffsetRange]], Located] | None = None,
                   rest_is_the_next_write: bool = False) -> dict[OffsetRange, str]:
    """The single offsets whose records fail on their own, with why, found by the tasks that
    fail. `failing` (known to fail as a whole) is spread over k pieces; a piece whose task
    failed is spread the same way, down to a record, which is probed on its own (so a piece
    wrongly named, had it been, costs jobs but never a record). Then all of it again, less
    the records found and the pieces whose tasks passed, until it passes: each record costs
    about log_k(n) failing jobs and one more of the rest. `first`: pieces and what a job that
    already failed says of them (the failed write's own tasks, whose pieces may be empty),
    taken for the first job. A piece whose failed pieces find nothing is left out of the rest
    with them, its other pieces too: what fails there fails the next round of the write. A
    part whose failure names no task (`Unlocated`) is bisected (`narrow`). `NotIsolated`
    beyond the limits of `budget`. `rest_is_the_next_write`: once a round found records, the rest is not
    searched, as the write's next round runs the same job over it first (the transform and
    row checks, whose rows the write caches), and what fails there is its `first`."""
    budget = budget or Budget()
    found, earlier = budget.found, set(budget.found)

    def descend(part: list[OffsetRange]) -> bool:
        """Finds records that fail in `part`, which failed; whether it found any."""
        if not part:
            return False
        if size(part) == 1:
            why = budget.ask(probe, part)
            if why is not None:
                budget.add(part[0], why)
            return why is not None
        split = [p for p in pieces(part, k) if p]
        try:
            hit = budget.ask(locate, split)
        except Unlocated:
            return _bisect(part, probe, budget)
        return hit is not None and any([descend(split[i]) for i in sorted(hit.failed)])

    rest = [r for r in failing if r.size]
    while rest:
        if first is not None:
            (split, hit), first = first, None
        else:
            split = [p for p in pieces(rest, k) if p]
            try:
                hit = budget.ask(locate, split)
            except Unlocated:
                _bisect(rest, probe, budget)
                break
        if hit is None:
            break
        before = set(found)
        fruitless = [split[i] for i in sorted(hit.failed) if not descend(split[i])]
        rest = without(rest, [*(r for i in sorted(hit.passed) for r in split[i]), *(r for p in fruitless for r in p),
                              *(offset for offset in found if offset not in before)])
        if rest_is_the_next_write and len(found) > len(earlier):
            break
    return found_since(budget, earlier)


def describe(found: dict[OffsetRange, str], limit: int = 5) -> str:
    shown = "; ".join(f"{r.topic}[{r.partition}]@{r.start}: {why}" for r, why in list(found.items())[:limit])
    return shown + (f" (and {len(found) - limit} more)" if len(found) > limit else "")
