"""The checked rows of an attempt's write, kept across its rounds (exactly_once.spark.staging).

Each round of the write starts with its first pass: the transform and the row checks computed
into a cache, every task to its end where the driver's JVM can run it so (rows_step.check).
When that pass names the partitions of the cached records whose tasks failed, the others' rows
are whole in the cache. Later rounds, after isolation set records aside, compute only the
partitions no cache holds whole, and read the others from the cache that holds them, less the
rows of the records set aside since: a transform runs once over each record that passes, where
each round ran it over all of them (a Python UDF over 1 M records, about 5 s a round: issue 63).
A record's rows are its own (a transform with no shuffle of its own, the only kind whose first
pass names tasks, is taken to make each record's rows from that record alone) and carry its
Kafka coordinates, as the refusals of a record's rows need.

Where no task could be named (Spark Connect, a transform with a shuffle of its own, an older
jar), or the plan makes rows from batches of records (`mapInPandas`) or not deterministically,
each round computes every row again, as before. A kept block Spark loses (an executor lost) is
computed again from the plan of the round that kept it, whose tasks passed there.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from py4j.java_gateway import JavaClass
from py4j.protocol import Py4JError, Py4JNetworkError
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from exactly_once.catalog import ColumnType
from exactly_once.config import PipelineConfig
from exactly_once.spark.frames import COORDINATES, SetAside, cache_level, checked_rows, in_ranges, with_set_aside
from exactly_once.spark.task_failures import noting_last_rows

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Round:
    computed: DataFrame | None    # what the round computes, cached (None: every row is kept)
    partitions: list[int] | None  # the records' partitions it computes (None: all)
    aside: int                    # how many of the records set aside it leaves out


class KeptRows:
    def __init__(self, records: DataFrame, config: PipelineConfig, columns: Mapping[str, list[ColumnType]]):
        self.records, self.config, self.columns = records, config, columns  # records: the attempt's cached parse
        self.caches: list[DataFrame] = []   # caches of checked rows, each holding some partitions whole
        self.aside_in: list[int] = []       # by cache, how many of the records set aside it left out
        self.cache_of: dict[int, int] = {}  # the records' partitions held whole, each with its cache's index
        self.current: Round | None = None
        self.known = True                   # whether the round's first pass said which tasks failed
        self.whole: DataFrame | None = None  # the round's rows computed anew, where they could not be picked
        self.partitions: int | None = None

    def round(self, set_aside: SetAside) -> Round:
        """What the round computes: the checked rows of the partitions no cache holds whole, into
        a cache of their own (only planned here; `settle` says what its first pass did)."""
        partitions = None if not self.cache_of else [i for i in range(self._partitions()) if i not in self.cache_of]
        self.current, self.known = Round(None, partitions, len(set_aside)), True
        if partitions != []:
            self.current = Round(self._cached(set_aside), partitions, len(set_aside))
        if self.cache_of:
            log.info("a round of the write: the checked rows of %d of %d partitions kept from the rounds before",
                     len(self.cache_of), self._partitions())
        return self.current

    def settle(self, failed: Sequence[int] | None) -> None:
        """What the round's first pass did: the partitions of the records whose tasks failed,
        the others' rows now whole in its cache; None if it could not say (nothing is kept then,
        nor where the rows are not made row by row)."""
        computed_here = self.current.computed
        if failed is None or computed_here is not None and not _row_by_row(computed_here):
            if failed:  # named, yet not kept: the plan does not make its rows row by row
                log.info("a round of the write: the transform does not make its rows row by row; the next round "
                         "computes every row again")
            self.known = False
            return
        computed = range(self._partitions()) if self.current.partitions is None else self.current.partitions
        failing = set(failed)
        passed = [i for i in computed if i not in failing]
        if passed:
            self.cache_of.update(dict.fromkeys(passed, len(self.caches)))
            self.caches.append(self.current.computed)
            self.aside_in.append(self.current.aside)

    def rows(self, set_aside: SetAside) -> DataFrame:
        """Every checked row of the round, once its first pass passed: partition i those of the
        records' partition i, from the cache that holds them, less the rows of the records set
        aside since; where the pass could not say, or the caches cannot be read so, the round's
        rows of every record, computed as they are read."""
        if not self.known:
            return self.current.computed
        held = [self.cache_of[i] for i in range(self._partitions())]
        rows = self.caches[held[0]] if len(set(held)) == 1 else _picked(self.caches, held)
        if rows is None:  # not read from caches as they are (nor will be): computed anew, nothing kept
            log.warning("a round of the write: the kept checked rows cannot be read partition by partition; "
                        "every row is computed again")
            self.known = False
            if self.current.computed is not None:
                return self.current.computed
            self.whole = self._cached(set_aside)
            return self.whole
        # the records set aside after the oldest cache read was made (set_aside only grows)
        aside = [offsets for offsets, _ in set_aside[min(self.aside_in[i] for i in held):]]
        return rows.where(~F.coalesce(in_ranges(aside, COORDINATES), F.lit(False))) if aside else rows

    def end_round(self) -> None:
        """Drops the round's caches that hold no rows kept; every cache where the round's first
        pass could not say which tasks failed."""
        current, whole, self.current, self.whole = self.current, self.whole, None, None
        for cache in (current.computed if current else None, whole):
            if cache is not None and all(cache is not kept for kept in self.caches):
                cache.unpersist()
        if not self.known:
            self.release()

    def release(self) -> None:
        """Drops every cache kept."""
        for cache in self.caches:
            cache.unpersist()
        self.caches, self.aside_in, self.cache_of = [], [], {}

    def _cached(self, set_aside: SetAside) -> DataFrame:
        """The checked rows, noting where a task of the round's first pass stops (for isolation)."""
        frame = noting_last_rows(checked_rows(with_set_aside(self.records, set_aside), self.config, self.columns))
        return frame.persist(cache_level(self.records.sparkSession))

    def _partitions(self) -> int:
        """The cached records' partitions: asked only where their tasks were named (`rdd` is not
        Spark Connect's)."""
        if self.partitions is None:
            self.partitions = self.records.rdd.getNumPartitions()
        return self.partitions


def _row_by_row(cache: DataFrame) -> bool:
    """Whether the cached frame's plan makes its rows row by row (the jar's KeptPartitions)."""
    kept = cache.sparkSession.sparkContext._jvm.exactly_once.isolation.KeptPartitions
    try:
        return isinstance(kept, JavaClass) and kept.rowByRow(cache._jdf)
    except Py4JNetworkError:
        raise
    except Py4JError:  # an older jar
        return False


def _picked(caches: list[DataFrame], cache_of: list[int]) -> DataFrame | None:
    """Partition i of `caches[cache_of[i]]`, by the jar's KeptPartitions; None where the driver's
    JVM has no such class (an older jar) or a frame is not a cache's rows as they are."""
    session = caches[0].sparkSession
    kept = session.sparkContext._jvm.exactly_once.isolation.KeptPartitions
    if not isinstance(kept, JavaClass):
        return None
    try:
        frame = kept.of([cache._jdf for cache in caches], cache_of)
    except Py4JNetworkError:
        raise
    except Py4JError:  # an older jar, whose method takes other arguments
        return None
    return None if frame is None else DataFrame(frame, session)
