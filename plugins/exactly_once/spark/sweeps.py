"""Record isolation's sweep (exactly_once.spark.isolation): the records a transform (or the row
checks) fails on, found level by level, each level one Spark job of pieces whose tasks all run to
their end (exactly_once.spark.rows_step.sweep), searched from where each failed task stopped.

Pure: the sweep asks its `Sweep` about pieces of the offsets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from exactly_once.ledger.planning import OffsetRange
from exactly_once.spark.isolation import PIECES, Budget, Unlocated, found_since, pieces, size, without

# Runs the step over all the pieces at once, each piece in a Spark task of its own and every task
# to its end, a Python UDF getting at most the given number of records at once: how each piece
# that failed did, by index ({} when every piece passes). Raises `Unlocated` when it cannot tell
# which task holds which piece.
Sweep = Callable[[Sequence[Sequence[OffsetRange]], int], "dict[int, Failed]"]
# A sweep's tasks at most: a part searched whole takes one, the others share the rest, each split
# in 2 to PIECES; parts beyond them wait for the next job.
SWEPT_TASKS = 64
# A sweep's Python UDFs get each task's records in this many batches at most: a task that fails
# gave every row of the batches before the one it failed in, so its failing record lies within a
# batch after its last row (when the transform keeps the records' order), and the batch's records
# are what the next level searches, in batches of one record once a batch and MARKERS fit this.
# 1,024, not 512: a second level's pieces (up to 1,024 offsets) then get batches of one record,
# their tasks' last rows are the records just before, and the third level is the last (ten
# records among 1 M: three levels, not four). Smaller batches cost a UDF little: 24,000 rows took
# 0.29 s in batches of 16 against 0.22 s in batches of 64 (issue 63, a scratch run).
BATCHES_PER_TASK = 1024
# Offsets searched after a batch's, as they may hold no record: a Kafka transaction's commit
# marker between the last row's record and the next (the first order of a transaction raising
# cost two levels more without them).
MARKERS = 2


@dataclass(frozen=True)
class Failed:
    """How a sweep's piece failed: why, and, where its task's rows were read (`read`), the last
    record whose rows it gave before it failed (None: none)."""

    why: str
    after: OffsetRange | None = None  # one offset
    read: bool = False


@dataclass(eq=False)
class _Scope:
    """A piece that failed, searched part by part: first the offsets after its task's last row
    (its first batch where it gave none), then the rest of it (`rest`) if nothing under it is
    found to fail alone (a transform that reorders its rows, offsets holding no record, records
    that fail only together)."""

    rest: list[OffsetRange]
    parent: _Scope | None
    live: int = 0  # its parts and the scopes below it still searched
    found: bool = False

    def found_one(self) -> None:
        """A record under it fails alone, which says why each piece above it failed."""
        scope: _Scope | None = self
        while scope is not None and not scope.found:
            scope.found = True
            scope = scope.parent


@dataclass(frozen=True)
class _Part:
    """A part a sweep searches: split into pieces, or `whole`, in a task of its own."""

    ranges: list[OffsetRange]
    scope: _Scope | None
    whole: bool = False


def sweep_failing(failing: Sequence[OffsetRange], sweep: Sweep, k: int = PIECES, budget: Budget | None = None,
                  stops: Sequence[tuple[list[OffsetRange], Failed]] = ()) -> dict[OffsetRange, str]:
    """The single offsets whose records fail on their own, with why, found level by level: each
    part known to fail is split into pieces, every part's pieces in one job whose tasks all run
    to their end (`sweep`), and each piece that failed is searched again, down to a record. A
    piece whose task failed after giving the rows of the records up to some offset (or none, in
    a piece of one partition) is searched next from there: the offsets of a batch of its Python
    UDFs (`udf_batch`) in a task of their own, or each on its own after batches of one record
    (where the transform keeps the records' order, the record it failed on is among them); the
    rest of the piece only if nothing there fails alone. So the first record each failed piece holds
    costs a few jobs, all of them together; what follows it in its piece fails the next round
    of the write. Beyond `budget`'s limit of records, only that many failed pieces and one more
    are searched, which is enough to find too many. A piece whose parts all pass (records that
    fail only together) is left out. `Unlocated` from `sweep` is raised unless records were
    found before it, which are returned then (the next round of the write finds the rest).

    `stops`: the failed pieces of a job that was a first level already (the write's first pass,
    whose tasks are the cached records' partitions), each with how its task failed; where its
    last row is known, what the piece holds after it is searched first (`_after_stop`), and the
    others join `failing`, searched as one part."""
    unknown, level = [r for r in failing if r.size], []
    for piece, how in stops:
        part = _after_stop([r for r in piece if r.size], how)
        if part is None:
            unknown += [r for r in piece if r.size]
        else:
            level.append(part)
    return _levels(([_Part(unknown, None)] if unknown else []) + level, sweep, k, budget or Budget())


def _after_stop(piece: list[OffsetRange], failed: Failed) -> _Part | None:
    """A first pass's failed piece as a part to search: its offsets after the last row its task
    gave, its rest searched after them only if nothing there fails alone; None where that row is
    not known. Not a batch after it, as in a sweep's level: in a first pass a Python UDF's output
    may be read some batches behind when its error comes (its rows pass into a cache, not to a
    sweep's reader), so the record lies somewhere after that row (where the transform keeps the
    records' order)."""
    after = failed.after if failed.read else None
    if _range_of(piece, after) is None:
        return None
    gave = [OffsetRange(r.topic, r.partition, r.start, min(r.end, after.start + 1)) for r in piece
            if (r.topic, r.partition) == (after.topic, after.partition) and r.start <= after.start]
    later = without(piece, gave)
    if not later:  # its last row the piece's last: the transform's order is not the records'
        return None
    return _Part(later, _Scope(gave, None, live=1))


def _range_of(piece: list[OffsetRange], offset: OffsetRange | None) -> OffsetRange | None:
    """The range of the piece that holds the offset (None: none, or no offset)."""
    if offset is None:
        return None
    return next((r for r in piece if (offset.topic, offset.partition) == (r.topic, r.partition)
                 and r.start <= offset.start < r.end), None)


def _offsets_from(piece: list[OffsetRange], topic: str, partition: int, start: int, count: int) -> list[OffsetRange]:
    """The piece's first `count` offsets of the partition from `start` on, across its ranges (a
    piece of cached records leaves out the offsets of an aborted transaction, spread.cached_pieces)."""
    taken: list[OffsetRange] = []
    for r in sorted((r for r in piece if (r.topic, r.partition) == (topic, partition) and r.end > start),
                    key=lambda r: r.start):
        begin = max(r.start, start)
        taken.append(OffsetRange(topic, partition, begin, min(r.end, begin + count - size(taken))))
        if size(taken) == count:
            break
    return taken


def _levels(level: list[_Part], sweep: Sweep, k: int, budget: Budget) -> dict[OffsetRange, str]:
    """The sweep's levels, from the parts of the first."""
    earlier = set(budget.found)
    while level:
        wholes = sum(part.whole for part in level)
        share = max(2, min(k, (SWEPT_TASKS - wholes) // max(1, len(level) - wholes)))
        split, part_of, searched, waiting = [], [], [], []
        for part in level:
            taken = [part.ranges] if part.whole else [
                p for p in pieces(part.ranges, min(share, size(part.ranges))) if p]
            if split and len(split) + len(taken) > SWEPT_TASKS:  # the job's tasks are full: the next job's
                waiting.append(part)
                continue
            split += taken
            part_of += [part] * len(taken)
            searched.append(part)
        if not split:
            break
        batch = udf_batch(split)
        try:
            failed = budget.ask(lambda pieces_: sweep(pieces_, batch), split)
        except Unlocated:
            if len(budget.found) > len(earlier):
                break
            raise
        level, failing = waiting, []
        for i, how in sorted(failed.items()):
            if size(split[i]) > 1:
                failing.append(i)
                continue
            budget.add(split[i][0], how.why)
            if part_of[i].scope is not None:
                part_of[i].scope.found_one()
        for i in failing[:budget.max_isolated + 1]:
            level += _next_parts(split[i], failed[i], batch, part_of[i].scope)
        for part in searched:  # each searched: a scope with none left searches its rest, or is done
            level += _done(part.scope)
    return found_since(budget, earlier)


def _next_parts(piece: list[OffsetRange], failed: Failed, batch: int, parent: _Scope | None) -> list[_Part]:
    """The parts to search of a piece that failed, in a scope of their own below `parent`: the
    offsets after its task's last row (from its start where it gave none), the rest of the piece
    only if nothing there fails alone; the whole piece where they are not known. A task that gave
    no row most likely failed on its first batch: the cached records' pieces leave out blocks of
    offsets that hold none (spread.cached_pieces), so a piece rarely begins in such offsets (a gap
    inside a block, a compacted topic's), where that batch passes and its rest is searched a job
    later. Its rest searched beside its first batch cost 16 of the 26 tasks of a level at ten
    records among 1 M (issue 63)."""
    searched = _after_last_row(piece, failed, batch)
    if searched is None:
        scope = _Scope([], parent)
        parts = [_Part(piece, scope)]
    else:
        scope = _Scope(without(piece, searched), parent)
        offsets = [searched] if batch > 1 else [[OffsetRange(r.topic, r.partition, o, o + 1)]
                                                for r in searched for o in range(r.start, r.end)]
        parts = [_Part(part, scope, whole=True) for part in offsets]
    scope.live = len(parts)
    if parent is not None:
        parent.live += 1
    return parts


def _done(scope: _Scope | None) -> list[_Part]:
    """What a scope searches once one of its parts was searched: its rest, when none is left and
    nothing under it failed alone; and so on above it, as each scope it closes is done."""
    while scope is not None:
        scope.live -= 1
        if scope.live:
            return []
        if scope.rest and not scope.found:
            rest, scope.rest, scope.live = scope.rest, [], 1
            return [_Part(rest, scope)]
        scope = scope.parent
    return []


def udf_batch(split: Sequence[Sequence[OffsetRange]]) -> int:
    """The records a sweep's Python UDFs get at once: each task's in BATCHES_PER_TASK batches or
    fewer, a power of two (PySpark starts a pool of workers for each batch size it is given)."""
    batches = -(-max(size(piece) for piece in split) // BATCHES_PER_TASK)
    return 1 << max(0, batches - 1).bit_length()


def _after_last_row(piece: list[OffsetRange], failed: Failed, batch: int) -> list[OffsetRange] | None:
    """The offsets of a batch (and MARKERS) after the last record whose rows a failed piece's
    task gave, in that record's partition; from its start for a piece of one partition whose task
    gave no row. None where the task's rows were not read, it gave no row of a piece of several
    partitions (whose order in the task is not known), or they would be the whole piece."""
    after = failed.after
    if not failed.read:
        return None
    if after is None:
        if len({(r.topic, r.partition) for r in piece}) != 1:
            return None
        topic, partition, start = piece[0].topic, piece[0].partition, min(r.start for r in piece)
    elif _range_of(piece, after) is None:
        return None
    else:
        topic, partition, start = after.topic, after.partition, after.start + 1
    searched = _offsets_from(piece, topic, partition, start, batch + MARKERS)
    return searched if 0 < size(searched) < size(piece) else None
