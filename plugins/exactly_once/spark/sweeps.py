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
# A sweep's tasks at most: its failing parts share them, each split in 2 to PIECES.
SWEPT_TASKS = 64
# A sweep's Python UDFs get each task's records in about this many batches at most: a task that
# fails gave every row of the batches before the one it failed in, so its failing record lies
# within a batch after its last row (when the transform keeps the records' order), and the
# batch's records are what the next level searches.
BATCHES_PER_TASK = 256
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


@dataclass
class _Cut:
    """The records a sweep searches after a failed task's last row, and the rest of its piece,
    searched instead if none of them fails."""

    rest: list[OffsetRange]
    failed: bool = False


@dataclass(frozen=True)
class _Part:
    """A part a sweep searches: split into pieces, or `whole`, in a task of its own (some of
    the records after a failed task's last row, of `cut`)."""

    ranges: list[OffsetRange]
    whole: bool = False
    cut: _Cut | None = None


def sweep_failing(failing: Sequence[OffsetRange], sweep: Sweep, k: int = PIECES,
                  budget: Budget | None = None) -> dict[OffsetRange, str]:
    """The single offsets whose records fail on their own, with why, found level by level: each
    part known to fail is split into pieces, every part's pieces in one job whose tasks all run
    to their end (`sweep`), and each piece that failed is searched again, down to a record. A
    piece whose task failed after giving the rows of the records up to some offset (or none, in
    a piece of one range) is searched next from there, in a task of its own, the offsets of one
    batch of its Python UDFs (`udf_batch`): where the transform keeps the records' order, the
    record it failed on is among them; if they pass, the rest of the piece is searched instead. So all
    the records that fail cost a few jobs together, where the search by a job's first failed task
    costs about log_k(n) per record. Beyond `budget`'s limit of records, only that many failed
    pieces and one more are searched, which is enough to find too many. A piece whose pieces
    all pass (records that fail only together) is left out, and so is what follows the records
    searched after a failed task's last row: what fails there fails the next round of the
    write. `Unlocated` from `sweep` is raised unless records were found before it, which are
    returned then (the next round of the write finds the rest)."""
    budget = budget or Budget()
    earlier = set(budget.found)
    level = [_Part([r for r in failing if r.size])]
    while level:
        level = level[:budget.max_isolated + 1]
        wholes = sum(part.whole for part in level)
        share = max(2, min(k, (SWEPT_TASKS - wholes) // max(1, len(level) - wholes)))
        split, of = [], []
        for part in level:
            taken = [part.ranges] if part.whole else [
                p for p in pieces(part.ranges, min(share, size(part.ranges))) if p]
            split += taken
            of += [part] * len(taken)
        batch = udf_batch(split)
        try:
            failed = budget.ask(lambda pieces_: sweep(pieces_, batch), split)
        except Unlocated:
            if len(budget.found) > len(earlier):
                break
            raise
        level = []
        for i, piece in enumerate(split):
            if i not in failed:
                continue
            if of[i].cut is not None:
                of[i].cut.failed = True
            if size(piece) == 1:
                budget.add(piece[0], failed[i].why)
            else:
                level += _after(piece, failed[i], batch)
        # the records after a last row passed: the failure was elsewhere in its piece
        cuts = {id(part.cut): part.cut for part in of if part.cut is not None and not part.cut.failed}
        level += [_Part(cut.rest) for cut in cuts.values() if cut.rest]
    return found_since(budget, earlier)


def udf_batch(split: Sequence[Sequence[OffsetRange]]) -> int:
    """The records a sweep's Python UDFs get at once: each task's in BATCHES_PER_TASK batches."""
    return max(1, -(-max(size(piece) for piece in split) // BATCHES_PER_TASK))


def _after(piece: list[OffsetRange], failed: Failed, batch: int) -> list[_Part]:
    """What to search of a piece whose task failed, given the last record whose rows it gave:
    the offsets of a batch (and MARKERS) after that record in its range, or from the start of
    a piece of one range if it gave none: whole, or each offset on its own after batches of one
    record; the rest of the piece kept in case they pass. Else (the task gave no row of a piece
    of several ranges, whose order in the task is not known) the piece."""
    after = failed.after
    if not failed.read:
        return [_Part(piece)]
    if after is None:
        within, start = (piece[0], piece[0].start) if len(piece) == 1 else (None, 0)
    else:
        within = next((r for r in piece if (after.topic, after.partition) == (r.topic, r.partition)
                       and r.start <= after.start < r.end), None)
        start = after.start + 1
    if within is None:
        return [_Part(piece)]
    searched = OffsetRange(within.topic, within.partition, start, min(within.end, start + batch + MARKERS))
    if not searched.size or [searched] == piece:
        return [_Part(piece)]
    cut = _Cut(without(piece, [searched]))
    if batch > 1:
        return [_Part([searched], whole=True, cut=cut)]
    return [_Part([OffsetRange(searched.topic, searched.partition, o, o + 1)], whole=True, cut=cut)
            for o in range(searched.start, searched.end)]
