"""Record isolation, pure: the bisection, the search by failed tasks and the sweep find exactly
the offsets whose records fail on their own, within their limits, and say so when none does;
and, in Spark, each piece is in the partition of its index and a sweep names every task that
fails, with the message a failed job gives."""

from __future__ import annotations

import psycopg2
import pytest

from exactly_once.ledger.planning import OffsetRange
from exactly_once.spark.isolation import (Budget, Located, NotIsolated, Unlocated, halves, locate_failing, narrow,
                                          pieces, size, without)
from exactly_once.spark.sweeps import MARKERS, SWEPT_TASKS, Failed, sweep_failing
from exactly_once.sqlstates import record_failure

RANGES = [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 40, 47), OffsetRange("t", 2, 5, 5)]


def prober(bad: dict[tuple[int, int], str], calls: list | None = None):
    """A probe failing on any part that holds a bad offset, with the first one's reason."""
    def probe(part):
        if calls is not None:
            calls.append(part)
        inside = [why for (p, o), why in sorted(bad.items()) if any(r.partition == p and r.start <= o < r.end
                                                                   for r in part)]
        return inside[0] if inside else None
    return probe


def test_halves_split_the_offsets_evenly_and_keep_every_offset_once():
    first, second = halves(RANGES)
    assert (size(first), size(second)) == (53, 54)
    assert first == [OffsetRange("t", 0, 0, 53)]
    assert second == [OffsetRange("t", 0, 53, 100), *RANGES[1:]]


def test_narrow_finds_exactly_the_failing_offsets_with_their_reasons():
    bad = {(0, 0): "first", (0, 57): "middle", (1, 46): "last"}
    calls = []
    found = narrow(RANGES, prober(bad, calls))
    assert found == {OffsetRange("t", p, o, o + 1): why for (p, o), why in bad.items()}
    assert len(calls) < 60  # a bisection, not a probe per offset (107 offsets)


def test_a_half_is_not_probed_when_its_sibling_passes_for_the_failure_is_then_in_it():
    calls = []
    found = narrow([OffsetRange("t", 0, 0, 1024)], prober({(0, 1000): "bad"}, calls))
    assert found == {OffsetRange("t", 0, 1000, 1001): "bad"}
    assert [OffsetRange("t", 0, 0, 512)] in calls and [OffsetRange("t", 0, 512, 1024)] not in calls
    assert len(calls) < 2 * 10  # both halves of each of log2(1024) parts were probed before


def test_a_failure_no_single_record_reproduces_isolates_nothing():
    assert narrow(RANGES, lambda part: "fails" if size(part) > 50 else None) == {}


def test_beyond_its_limits_isolation_gives_up_naming_what_it_found():
    with pytest.raises(NotIsolated, match=r"more than 3 records .*t\[0\]@0: bad"):
        narrow(RANGES, prober({(0, o): "bad" for o in range(10)}), budget=Budget(max_isolated=3))
    with pytest.raises(NotIsolated, match="within 5 probes"):
        narrow(RANGES, prober({(0, 99): "bad"}), budget=Budget(max_probes=5))


def test_only_errors_a_record_can_cause_are_narrowed(ledger_db):
    with psycopg2.connect(ledger_db) as conn, conn.cursor() as cur:
        with pytest.raises(psycopg2.Error) as refused:
            cur.execute("SELECT 1 / 0")
    assert record_failure(refused.value) == ("22012", "division by zero")
    assert record_failure(ConnectionError("server closed the connection")) is None
    with pytest.raises(psycopg2.Error) as missing:
        with psycopg2.connect(ledger_db) as conn, conn.cursor() as cur:
            cur.execute("SELECT * FROM no_such_table")
    assert record_failure(missing.value) is None  # 42P01: not a record's doing


def locator(bad: dict[tuple[int, int], str], calls: list | None = None, unlocated: bool = False):
    """A located probe as Spark runs one on local[2]: its tasks run in order, two at a time,
    and the job stops at the first piece holding a bad offset (that task and the one beside
    it named failed and not run); the tasks before it passed."""
    def locate(split):
        if calls is not None:
            calls.append(split)
        failing = [i for i, part in enumerate(split) if prober(bad)(part)]
        if not failing:
            return None
        if unlocated:
            raise Unlocated(prober(bad)(split[failing[0]]))
        first = failing[0]
        return Located(frozenset({first}), frozenset(range(first)), prober(bad)(split[first]))
    return locate


def test_pieces_split_the_offsets_evenly_and_keep_every_offset_once():
    split = pieces(RANGES, 4)
    assert [size(p) for p in split] == [26, 27, 27, 27]
    assert split[3] == [OffsetRange("t", 0, 80, 100), OffsetRange("t", 1, 40, 47)]
    offsets = [(r.partition, o) for p in split for r in p for o in range(r.start, r.end)]
    assert offsets == [(r.partition, o) for r in RANGES for o in range(r.start, r.end)]
    few = pieces(RANGES[1:], 10)  # 7 offsets: 3 pieces are empty
    assert len(few) == 10 and sorted(size(p) for p in few) == [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]


def test_without_takes_out_exactly_the_offsets_taken():
    left = without(RANGES, [OffsetRange("t", 0, 10, 20), OffsetRange("t", 1, 40, 47)])
    assert left == [OffsetRange("t", 0, 0, 10), OffsetRange("t", 0, 20, 100), OffsetRange("t", 2, 5, 5)]


def test_located_isolation_finds_exactly_the_failing_offsets_in_a_few_jobs_a_record():
    bad = {(0, 0): "first", (0, 57): "middle", (1, 46): "last"}
    located, probed = [], []
    found = locate_failing(RANGES, locator(bad, located), prober(bad, probed), k=4)
    assert found == {OffsetRange("t", p, o, o + 1): why for (p, o), why in bad.items()}
    assert len(probed) == 3  # each record found, alone
    assert len(located) <= 3 * (4 + 1)  # log4(107) levels a record, and the rest once each
    one, calls = [], []
    big = [OffsetRange("t", 0, 0, 1_000_000)]
    assert locate_failing(big, locator({(0, 765_432): "bad"}, one), prober({(0, 765_432): "bad"}, calls)) == {
        OffsetRange("t", 0, 765_432, 765_433): "bad"}
    assert (len(one), len(calls)) == (5 + 1, 1)  # 5 levels of 16 pieces, the rest passes; the record alone


def test_a_job_that_already_failed_is_taken_for_the_first_its_empty_pieces_too():
    bad = {(0, 57): "middle", (0, 58): "next"}
    located, probed = [], []

    def both(split):  # the two records' tasks fail together
        located.append(split)
        failing = [i for i, part in enumerate(split) if prober(bad)(part)]
        return Located(frozenset(failing), frozenset(), "either") if failing else None
    write = [[OffsetRange("t", 0, 0, 50)], [OffsetRange("t", 0, 50, 100)], RANGES[1:], []]  # a partition of none
    found = locate_failing(RANGES, both, prober(bad, probed), k=64,
                           first=(write, Located(frozenset({1, 3}), frozenset({0}), "middle")))
    assert found == {OffsetRange("t", p, o, o + 1): why for (p, o), why in bad.items()}
    assert located[0] == [[OffsetRange("t", 0, o, o + 1)] for o in range(50, 100)]  # the write's piece, at once
    assert sorted(p[0].start for p in probed) == [57, 58]
    assert OffsetRange("t", 0, 0, 50) not in [r for split in located for part in split for r in part]


def test_when_the_next_write_is_the_rest_a_round_that_found_records_searches_no_further():
    bad = {(0, 57): "middle", (1, 46): "last"}
    write = [[OffsetRange("t", 0, 0, 100)], RANGES[1:]]
    failed_first = (write, Located(frozenset({0}), frozenset(), "middle"))  # the job stopped at the first task
    located, budget = [], Budget()  # the attempt's, over its rounds
    assert locate_failing(RANGES, locator(bad, located), prober(bad), k=4, budget=budget, first=failed_first,
                          rest_is_the_next_write=True) == {OffsetRange("t", 0, 57, 58): "middle"}
    assert all(r.partition == 0 for split in located for part in split for r in part)  # the rest not searched
    write_again = (write, Located(frozenset({1}), frozenset({0}), "last"))  # the next round's write
    assert locate_failing(RANGES, locator(bad), prober({(1, 46): "last"}), k=4, budget=budget, first=write_again,
                          rest_is_the_next_write=True) == {OffsetRange("t", 1, 46, 47): "last"}  # only the new one
    assert budget.found == {OffsetRange("t", p, o, o + 1): why for (p, o), why in bad.items()}
    with pytest.raises(NotIsolated, match="more than 1 records"):  # the limits count every round's records
        one = Budget(max_isolated=1)
        locate_failing(RANGES, locator(bad), prober(bad), k=4, budget=one, first=failed_first,
                       rest_is_the_next_write=True)
        locate_failing(RANGES, locator(bad), prober({(1, 46): "last"}), k=4, budget=one, first=write_again,
                       rest_is_the_next_write=True)
    nothing = (write, Located(frozenset({0}), frozenset(), "transient"))  # a round that finds nothing searches on
    assert locate_failing(RANGES, locator(bad), prober({(1, 46): "last"}), k=4, first=nothing,
                          rest_is_the_next_write=True) == {OffsetRange("t", 1, 46, 47): "last"}


def test_whether_every_record_was_found_counts_the_checkpoints_records_once_an_attempt():
    counts, budget = [], Budget()

    def records() -> int:  # the Spark job counting the checkpoint's good records
        counts.append(1)
        return 3
    budget.add(OffsetRange("t", 0, 1, 2), "bad")
    assert not budget.found_every_record(records) and counts == []  # one record found: nothing to count
    budget.add(OffsetRange("t", 0, 2, 3), "bad")
    assert not budget.found_every_record(records)  # two of three
    budget.add(OffsetRange("t", 0, 3, 4), "bad")  # a later round's
    assert budget.found_every_record(records) and counts == [1]


def test_a_failure_no_task_names_is_bisected():
    bad = {(0, 57): "middle"}
    assert locate_failing(RANGES, locator(bad, unlocated=True), prober(bad)) == {OffsetRange("t", 0, 57, 58): "middle"}


def test_located_isolation_finds_nothing_for_a_failure_no_single_record_reproduces():
    def together(split):  # fails whenever offsets 3 and 4 of partition 0 are in one piece
        for i, part in enumerate(split):
            if any(r.partition == 0 and r.start <= 3 and r.end >= 5 for r in part):
                return Located(frozenset({i}), frozenset(), "two together")
        return None
    assert locate_failing(RANGES, together, lambda part: None, k=4) == {}


def test_located_isolation_keeps_its_limits():
    with pytest.raises(NotIsolated, match=r"more than 3 records"):
        bad = {(0, o): "bad" for o in range(0, 40, 4)}
        locate_failing(RANGES, locator(bad), prober(bad), k=4, budget=Budget(max_isolated=3))
    with pytest.raises(NotIsolated, match="within 3 probes"):
        locate_failing(RANGES, locator({(0, 99): "bad"}), prober({(0, 99): "bad"}), k=4, budget=Budget(max_probes=3))


def sweeper(bad: dict[tuple[int, int], str], calls: list | None = None):
    """A sweep: every piece holding a bad offset fails, with its first one's reason, saying
    nothing of the rows its task gave (a step whose tasks' rows are not read)."""
    def sweep(split, batch):
        if calls is not None:
            calls.append(split)
        assert len(split) <= SWEPT_TASKS
        return {i: Failed(why) for i, part in enumerate(split) if (why := prober(bad)(part)) is not None}
    return sweep


def udf_sweeper(bad: set[tuple[int, int]], records=lambda r: range(r.start, r.end), calls: list | None = None):
    """A sweep of a transform whose Python UDF raises on the bad offsets, as Spark runs it: each
    task's records in order (a range's `records`: its offsets less gaps), `batch` at a time, a
    failing task giving the rows of the batches before the one it fails in."""
    def sweep(split, batch):
        if calls is not None:
            calls.append((split, batch))
        assert len(split) <= SWEPT_TASKS
        failed = {}
        for i, part in enumerate(split):
            held = [(r.topic, r.partition, o) for r in part for o in records(r)]
            first = next((n for n, (_, p, o) in enumerate(held) if (p, o) in bad), None)
            if first is not None:
                gave = first - first % batch  # the records of the whole batches before
                after = None if gave == 0 else OffsetRange(held[gave - 1][0], held[gave - 1][1], held[gave - 1][2],
                                                           held[gave - 1][2] + 1)
                failed[i] = Failed(f"cannot price {held[first][2]}", after, read=True)
        return failed
    return sweep


def test_a_sweep_finds_every_failing_offset_in_a_few_jobs_however_many_fail():
    big = [OffsetRange("t", 0, 0, 1_000_000), OffsetRange("t", 1, 0, 5)]
    bad = {(0, o): f"bad {o}" for o in (7, 8, 123_456, 500_000, 999_999)} | {(1, 4): "last"}
    calls, budget = [], Budget()
    found = sweep_failing(big, sweeper(bad, calls), budget=budget)
    assert found == {OffsetRange("t", p, o, o + 1): why for (p, o), why in bad.items()} == budget.found
    assert len(calls) <= 8 and budget.jobs == len(calls)  # levels, not jobs a record (7 and 8: one piece to 2 offsets)
    one = []
    assert sweep_failing([OffsetRange("t", 0, 41, 42)], sweeper({(0, 41): "alone"}, one)) == {
        OffsetRange("t", 0, 41, 42): "alone"}
    assert one == [[[OffsetRange("t", 0, 41, 42)]]]


def test_a_sweep_searches_a_failed_task_from_its_last_row_down_to_the_record_in_a_few_small_jobs():
    big = [OffsetRange("t", 0, 0, 900_000)]
    calls = []
    found = sweep_failing(big, udf_sweeper({(0, 123_456)}, calls=calls))
    assert found == {OffsetRange("t", 0, 123_456, 123_457): "cannot price 123456"}
    # 16 pieces of 56,250 in batches of 64; the failed piece's batch whole, a record at a time; the
    # offset after its last row and the MARKERS after it, each on its own
    assert [(len(split), batch) for split, batch in calls] == [(16, 64), (1, 1), (1 + MARKERS, 1)]
    assert calls[1][0] == [[OffsetRange("t", 0, 123_444, 123_510)]]  # after 171 batches of 64 from 112,500
    assert calls[2][0][0] == [OffsetRange("t", 0, 123_456, 123_457)]
    ten = {(0, o) for o in (7, 8, 90_000, 123_456, 300_001, 450_000, 600_000, 750_000, 899_999)} | {(1, 4)}
    calls = []
    found = sweep_failing([*big, OffsetRange("t", 1, 0, 5)], udf_sweeper(ten, calls=calls))
    # each failed piece's first record found, and 8 with 7 before it, as the offsets after a last row
    # are searched each on its own; partition 1's, after 899,999 in the last piece: the next round's
    assert set(found) == {OffsetRange("t", p, o, o + 1) for p, o in ten - {(1, 4)}}
    # beside the sweep that knows nothing of its tasks' rows: 3 levels, 45 tasks, against 7 and 352 (the
    # first piece gave no row, 7 being in its first batch: that batch searched first, its rest not needed)
    split_only = []
    assert sweep_failing([*big, OffsetRange("t", 1, 0, 5)], sweeper(dict.fromkeys(ten, "bad"), split_only)).keys() \
        == found.keys() | {OffsetRange("t", 1, 4, 5)}
    assert len(calls) == 3 < len(split_only) == 7
    assert [len(split) for split, _ in calls] == [16, 8, 21]  # 8 windows (one a first batch), then offsets
    assert 7 * sum(len(split) for split, _ in calls) < sum(len(split) for split in split_only)


def test_a_sweep_searches_the_rest_of_a_failed_piece_when_the_records_after_its_last_row_pass():
    # a transaction's marker at offset 4,999 before the record that fails: found as without it
    calls = []
    found = sweep_failing([OffsetRange("t", 0, 0, 64_000)],
                          udf_sweeper({(0, 5_000)}, lambda r: [o for o in range(r.start, r.end) if o != 4_999], calls))
    assert found == {OffsetRange("t", 0, 5_000, 5_001): "cannot price 5000"} and len(calls) == 3
    assert calls[1][0] == [[OffsetRange("t", 0, 4_996, 5_002)]]  # after 249 batches of 4 from 4,000: the marker in it
    # no records at offsets 100-199 (an aborted transaction): the batch after the last row is empty
    def records(r):
        return [o for o in range(r.start, r.end) if not 100 <= o < 200]
    found = sweep_failing([OffsetRange("t", 0, 0, 16_000)], udf_sweeper({(0, 200)}, records))
    assert found == {OffsetRange("t", 0, 200, 201): "cannot price 200"}

    # a transform that does not keep the records' order: its last row says nothing of where it failed
    def misleading(split, batch):
        return {i: Failed(f.why, OffsetRange("t", 0, 5_000, 5_001), read=True) if f.after is not None else f
                for i, f in udf_sweeper({(0, 1_700)})(split, batch).items()}
    found = sweep_failing([OffsetRange("t", 0, 0, 8_000)], misleading)
    assert found == {OffsetRange("t", 0, 1_700, 1_701): "cannot price 1700"}


def test_a_sweep_searches_the_rest_of_a_piece_when_nothing_after_its_last_row_fails_alone():
    # two markers before the record, and a budget of one record: the offsets after the last row
    # are three parts, searched together
    def records(r):
        return [o for o in range(r.start, r.end) if o not in (5_498, 5_499)]
    found = sweep_failing([OffsetRange("t", 0, 0, 16_000)], udf_sweeper({(0, 5_500)}, records),
                          budget=Budget(max_isolated=1))
    assert found == {OffsetRange("t", 0, 5_500, 5_501): "cannot price 5500"}

    # offsets 100 and 101 fail together, right after the last row; 700, later in the piece, alone
    def together_first(split, batch):
        failed = udf_sweeper({(0, 700)})(split, batch)
        for i, part in enumerate(split):
            if any(r.start <= 100 and 101 < r.end for r in part):
                failed[i] = Failed("two together", OffsetRange("t", 0, 99, 100) if part[0].start < 100 else None,
                                   read=True)
        return failed
    assert sweep_failing([OffsetRange("t", 0, 0, 16_000)], together_first) == {
        OffsetRange("t", 0, 700, 701): "cannot price 700"}


def test_a_sweep_after_the_writes_first_pass_searches_each_failed_task_from_where_it_stopped():
    # the first pass's task of offsets 0-150,155 stopped after 149,000 (a UDF's output read behind)
    piece = [OffsetRange("t", 0, 0, 150_155)]
    stop = Failed("cannot price 150100", OffsetRange("t", 0, 149_000, 149_001), read=True)
    calls = []
    found = sweep_failing([], udf_sweeper({(0, 150_100)}, calls=calls), stops=[(piece, stop)])
    assert found == {OffsetRange("t", 0, 150_100, 150_101): "cannot price 150100"}
    # only the offsets after it, in pieces of a few records each: two jobs, where the whole piece took three
    assert calls[0][0][0][0].start == 149_001 and sum(size(p) for p in calls[0][0]) == 1_154 and len(calls) == 2
    whole = []
    assert sweep_failing(piece, udf_sweeper({(0, 150_100)}, calls=whole)) == found and len(whole) == 3
    # two records in that task: both after its last row, found in the same two jobs
    calls = []
    found = sweep_failing([], udf_sweeper({(0, 149_500), (0, 150_100)}, calls=calls), stops=[(piece, stop)])
    assert set(found) == {OffsetRange("t", 0, 149_500, 149_501), OffsetRange("t", 0, 150_100, 150_101)}
    assert len(calls) == 2
    # a transform that reorders its rows: the record is before the row noted, found in the rest
    found = sweep_failing([], udf_sweeper({(0, 1_700)}), stops=[(piece, stop)])
    assert found == {OffsetRange("t", 0, 1_700, 1_701): "cannot price 1700"}
    # a piece of two ranges: the other range is searched with the offsets after the row
    two = [OffsetRange("t", 0, 0, 150_155), OffsetRange("u", 3, 0, 5_000)]
    calls = []
    found = sweep_failing([], udf_sweeper({(0, 150_100), (3, 4_000)}, calls=calls), stops=[(two, stop)])
    assert set(found) == {OffsetRange("t", 0, 150_100, 150_101), OffsetRange("u", 3, 4_000, 4_001)}
    assert sum(size(p) for p in calls[0][0]) == 1_154 + 5_000
    # nothing noted (an older jar), or no row given: the failed pieces searched as one part, as before
    for unknown in (Failed("cannot price 150100"), Failed("cannot price 150100", None, read=True)):
        calls, other = [], [OffsetRange("t", 1, 0, 90_000)]
        found = sweep_failing([], udf_sweeper({(0, 150_100), (1, 60_000)}, calls=calls),
                              stops=[(piece, unknown), (other, unknown)])
        assert set(found) == {OffsetRange("t", 0, 150_100, 150_101), OffsetRange("t", 1, 60_000, 60_001)}
        assert len(calls[0][0]) == 16 and sum(size(p) for p in calls[0][0]) == 150_155 + 90_000


def test_a_sweep_of_the_cached_pieces_reaches_over_an_aborted_transaction_to_the_next_record():
    # the first pass's piece leaves out offsets 20,000-69,999 (an aborted transaction's: no record),
    # its task stopped after 15,000, and the record that fails is the first after the transaction
    piece = [OffsetRange("t", 0, 0, 20_000), OffsetRange("t", 0, 70_000, 150_000)]
    stop = Failed("cannot price 70000", OffsetRange("t", 0, 15_000, 15_001), read=True)
    calls = []
    found = sweep_failing([], udf_sweeper({(0, 70_000)}, calls=calls), stops=[(piece, stop)])
    assert found == {OffsetRange("t", 0, 70_000, 70_001): "cannot price 70000"}
    # its first job over the offsets after the row; the next, the batch after the last row given, which
    # reaches over the gap into the next range; then each offset after that batch's last row
    assert sum(size(p) for p in calls[0][0]) == 4_999 + 80_000 and len(calls) == 3
    assert calls[1][1] == 1 and all(r.start < 20_000 or r.start >= 70_000 for p in calls[1][0] for r in p)
    # a piece of the partition's ranges whose task gave no row: from its first offset, over the gap
    assert sweep_failing([], udf_sweeper({(0, 70_001)}), stops=[
        ([OffsetRange("t", 0, 19_990, 20_000), OffsetRange("t", 0, 70_000, 80_000)],
         Failed("cannot price 70001", None, read=True))]) == {OffsetRange("t", 0, 70_001, 70_002): "cannot price 70001"}


def test_a_sweep_keeps_its_jobs_within_their_tasks_bound_however_many_parts_it_searches():
    # 22 tasks of a first pass stopped after their first offset: 2 pieces each, the second failing
    # on its first offset after no row, searched in three single offsets: 66 parts, in two jobs
    starts = range(0, 2_200, 100)
    bad = {(0, s + 50) for s in starts}
    stops = [([OffsetRange("t", 0, s, s + 100)], Failed("x", OffsetRange("t", 0, s, s + 1), read=True)) for s in starts]
    calls = []
    found = sweep_failing([], udf_sweeper(bad, calls=calls), stops=stops,  # the sweeper asserts the bound
                          budget=Budget(max_isolated=len(starts)))
    assert found.keys() == {OffsetRange("t", p, o, o + 1) for p, o in bad}
    assert [len(split) for split, _ in calls] == [2 * len(starts), SWEPT_TASKS, 3 * len(starts) - SWEPT_TASKS]
    # a sweep that knows nothing of its tasks' rows: 64 failed pieces of 100, each split in two,
    # half of them waiting for the next job
    bad = {(0, o): "bad" for o in range(50, 6_400, 100)}
    calls = []
    found = sweep_failing([OffsetRange("t", 0, 0, 6_400)], sweeper(bad, calls), budget=Budget(max_isolated=len(bad)))
    assert found == {OffsetRange("t", p, o, o + 1): why for (p, o), why in bad.items()}
    assert [len(split) for split in calls[:4]] == [16, SWEPT_TASKS, SWEPT_TASKS, SWEPT_TASKS]
    assert [{size(piece) for piece in split} for split in calls[1:4]] == [{100}, {50}, {50}]


def test_a_sweep_leaves_out_what_fails_only_together_and_keeps_its_limits():
    def together(split, batch):  # fails whenever offsets 3 and 4 of partition 0 are in one piece
        return {i: Failed("two together") for i, part in enumerate(split)
                if any(r.partition == 0 and r.start <= 3 and r.end >= 5 for r in part)}
    assert sweep_failing(RANGES, together) == {}
    every = {(0, o): "bad" for o in range(100)}
    with pytest.raises(NotIsolated, match=r"more than 3 records"):
        sweep_failing(RANGES, sweeper(every), budget=Budget(max_isolated=3))  # each job within SWEPT_TASKS
    with pytest.raises(NotIsolated, match="within 1 probes"):  # 107 offsets: 16 pieces, then each of theirs
        sweep_failing(RANGES, sweeper({(0, 99): "bad"}), budget=Budget(max_probes=1))
    with pytest.raises(Unlocated):
        sweep_failing(RANGES, lambda split, batch: (_ for _ in ()).throw(Unlocated("no tasks named")))
    levels = []

    def lost_after_the_first(split, batch):  # the records of partition 1 fail alone; then no job names its tasks
        levels.append(split)
        if len(levels) > 1:
            raise Unlocated("no tasks named")
        return sweeper({(1, 44): "found", (0, 3): "next"})(split, batch)
    # 31 offsets in 16 pieces: the first, (1, 44), alone; (0, 3) in a piece of two
    found = sweep_failing([OffsetRange("t", 1, 44, 45), OffsetRange("t", 0, 0, 30)], lost_after_the_first)
    assert found == {OffsetRange("t", 1, 44, 45): "found"}  # what it found, the rest left to the next round


def test_a_sweep_names_every_task_that_fails_with_a_failed_jobs_message_and_plans_nothing_else(spark):
    from pyspark.sql import functions as F

    from exactly_once.spark.spread import spread
    from exactly_once.spark.task_failures import ADAPTIVE, UDF_BATCHES, task_failures

    @F.udf("long")
    def priced(offset):
        if offset in (5, 1500, 1501, 2999):
            raise ValueError(f"cannot price {offset}")
        return offset

    records = spark.range(0, 3000).select(F.lit("t").alias("topic"), F.lit(0).alias("partition"),
                                          F.col("id").alias("offset"), F.lit(None).cast("string").alias("reason"))
    split = pieces([OffsetRange("t", 0, 0, 3000)], 8)

    def step(frame):
        return frame.select("topic", "partition", "offset", priced("offset").alias("price"))
    coordinates = ("topic", "partition", "offset")
    settings = {name: spark.conf.get(name) for name in (ADAPTIVE, *UDF_BATCHES)}
    failed = task_failures(step(spread(records, split)), len(split), coordinates, udf_batch=10)
    assert sorted(failed) == [0, 4, 7]  # 1500 and 1501 in one piece; every task ran
    assert {name: spark.conf.get(name) for name in settings} == settings
    # the rows of the batches of 10 before the one that raised: none in pieces 0 (0-374) and 4
    # (1500-1874); in piece 7 (2625-2999), up to 2994
    assert [(failed[i].after, failed[i].read) for i in (0, 4, 7)] == [(None, True), (None, True),
                                                                       (("t", 0, 2994), True)]
    with pytest.raises(Exception) as job:
        step(records.where("offset = 1500")).write.format("noop").mode("overwrite").save()
    assert str(failed[4].error).splitlines()[-1] == str(job.value).splitlines()[-1]
    assert "ValueError: cannot price 1500" in str(failed[4].error).splitlines()[-1]
    unread = task_failures(spread(records, split).select("offset", priced("offset")), len(split), coordinates)
    assert (unread[7].after, unread[7].read) == (None, False)  # no coordinates among its columns
    retyped = spread(records, split).select("topic", F.col("partition").cast("bigint").alias("partition"), "offset",
                                            priced("offset"))
    unread = task_failures(retyped, len(split), coordinates)
    assert (unread[7].after, unread[7].read) == (None, False)  # not of the coordinates' types
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(None)
    assert task_failures(step(spread(records, split)).groupBy("price").count(), len(split), coordinates) is None
    assert task_failures(step(records), 2, coordinates) is None  # no spread
    assert spark.sparkContext.statusTracker().getJobIdsForGroup(None) == jobs  # nothing ran


def test_the_writes_first_pass_names_every_partition_of_the_cached_records_that_fails_and_caches_the_rest(spark):
    from pyspark.sql import functions as F

    from exactly_once.spark.task_failures import task_failures_over

    @F.udf("long")
    def priced(offset):
        if offset in (5, 2400):
            raise ValueError(f"cannot price {offset}")
        return offset

    def partitions_cached() -> int:
        return sum(info.numCachedPartitions() for info in spark.sparkContext._jsc.sc().getRDDStorageInfo())

    # two columns, as the records always have more than one: over a cache of one column alone,
    # this machine's Spark 4.2 hung on a UDF that raises, a plain job's too
    records = spark.range(0, 3000, numPartitions=4).select(F.col("id").alias("offset"),
                                                           F.lit(None).cast("string").alias("reason")).persist()
    records.count()
    checked = records.select("offset", priced("offset").alias("price")).persist()
    try:
        before = partitions_cached()
        failed = task_failures_over(checked, records)
        assert sorted(failed) == [0, 3]  # the partitions of offsets 5 and 2400: every task ran
        assert "ValueError: cannot price 2400" in str(failed[3].error).splitlines()[-1]
        assert partitions_cached() == before + 2  # the rows of the two that passed
        assert task_failures_over(records.select("offset").repartition(4), records) is None  # a shuffle of its own
        assert task_failures_over(records.coalesce(2), records) is None  # tasks reading other partitions
        assert sorted(task_failures_over(checked, records, [1, 3])) == [3]  # those tasks only: 0 would fail
    finally:
        checked.unpersist()
        records.unpersist()


def test_the_writes_first_pass_says_where_each_task_that_failed_stopped(spark):
    """The first pass computes its rows into a cache, where no task's rows can be read: a column
    of theirs notes the last row each task gave, before the record it failed on (a Python
    UDF's output may be read some batches behind when its error comes)."""
    from pyspark.sql import functions as F

    from exactly_once.spark.task_failures import noting_last_rows, task_failures_over

    @F.udf("long")
    def priced(offset):
        if offset == 62_345:
            raise ValueError(f"cannot price {offset}")
        return offset

    records = spark.range(0, 100_000, numPartitions=4).select(
        F.lit("t").alias("kafka_topic"), F.lit(0).alias("kafka_partition"), F.col("id").alias("kafka_offset"),
        F.lit(None).cast("string").alias("reason")).persist()
    records.count()
    steps = {"a Python UDF": priced("kafka_offset"),
             "an expression": F.when(F.col("kafka_offset") == 87_500, F.raise_error(F.lit("cannot price 87500")))
             .otherwise(F.col("kafka_offset"))}
    cached = {name: noting_last_rows(records.select("kafka_topic", "kafka_partition", "kafka_offset",
                                                    step.alias("price"))).persist()
              for name, step in steps.items()}
    unnoted = records.select("kafka_topic", "kafka_partition", "kafka_offset", priced("kafka_offset")).persist()
    try:
        stopped = {}
        for name, frame in cached.items():
            (index, failure), = task_failures_over(frame, records).items()
            stopped[name] = (index, failure.read, failure.after)
        python_udf = stopped["a Python UDF"]
        assert python_udf[:2] == (2, True) and python_udf[2][:2] == ("t", 0) and 50_000 <= python_udf[2][2] < 62_345
        assert stopped["an expression"] == (3, True, ("t", 0, 87_499))  # a row at a time: the one before
        (failure,) = task_failures_over(unnoted, records).values()
        assert (failure.after, failure.read) == (None, False)  # nothing noted where its rows passed
    finally:
        for frame in [*cached.values(), unnoted]:
            frame.unpersist()
        records.unpersist()


def test_a_rounds_rows_are_read_partition_by_partition_from_the_caches_that_hold_them(spark):
    """The write's next round (exactly_once.spark.kept_rows) reads each partition's checked rows
    from the cache that holds them whole: a cache whose task raised for one partition is never
    asked for that one, which would compute it again, and raise."""
    from pyspark.sql import functions as F

    from exactly_once.spark.kept_rows import _picked
    from exactly_once.spark.task_failures import task_failures_over

    @F.udf("long")
    def priced(offset):
        if offset == 2400:
            raise ValueError(f"cannot price {offset}")
        return offset

    records = spark.range(0, 3000, numPartitions=4).select(F.col("id").alias("offset"),
                                                           F.lit(None).cast("string").alias("reason")).persist()
    records.count()
    first = records.select("offset", priced("offset").alias("price")).persist()
    again = records.where("offset != 2400").select("offset", (F.col("offset") * 10).alias("price")).persist()
    try:
        assert sorted(task_failures_over(first, records)) == [3]
        picked = _picked([first, again], [0, 0, 0, 1])  # partition 3's rows from the cache that has them
        assert picked.rdd.getNumPartitions() == 4
        rows = picked.select(F.spark_partition_id().alias("p"), "offset", "price").collect()
        assert sorted((r.offset, r.price, r.p) for r in rows) == sorted(
            [(o, o, o * 4 // 3000) for o in range(0, 2250)] + [(o, o * 10, 3) for o in range(2250, 3000) if o != 2400])
        with pytest.raises(Exception, match="cannot price 2400"):
            _picked([first, again], [0, 0, 0, 0]).count()  # partition 3 computed again from its plan: it raises
        assert _picked([first, records.select("offset", F.col("offset").alias("price"))], [0, 1, 1, 1]) is None
    finally:
        again.unpersist()
        first.unpersist()
        records.unpersist()


def test_rows_are_kept_only_from_a_plan_that_makes_them_row_by_row(spark):
    """A round's rows are kept only where each row comes from its record alone: not from a
    Python function over batches (`mapInPandas`), nor an expression that is not deterministic."""
    from pyspark.sql import functions as F

    from exactly_once.spark.kept_rows import _row_by_row

    @F.udf("long")
    def priced(offset):
        return offset

    def deduplicated(batches):
        for batch in batches:
            yield batch.drop_duplicates("price")

    records = spark.range(0, 100, numPartitions=2).select(F.col("id").alias("offset"),
                                                          F.lit(None).cast("string").alias("reason")).persist()
    records.count()
    frames = {"a Python UDF": records.select("offset", priced("offset").alias("price")),
              "mapInPandas": records.select("offset", (F.col("offset") % 7).alias("price")).mapInPandas(
                  deduplicated, "offset long, price long"),
              "rand()": records.select("offset", (F.rand() * 10).cast("long").alias("price"))}
    cached = {name: frame.persist() for name, frame in frames.items()}
    try:
        assert {name: _row_by_row(frame) for name, frame in cached.items()} == {
            "a Python UDF": True, "mapInPandas": False, "rand()": False}
        assert not _row_by_row(records.select(F.col("offset") + 1))  # not a cache's rows as they are
    finally:
        for frame in cached.values():
            frame.unpersist()
        records.unpersist()


def test_each_piece_lands_in_the_spark_partition_of_its_index(spark):
    from pyspark.sql import functions as F

    from exactly_once.spark.spread import spread

    records = spark.range(0, 3000).select(F.lit("t").alias("topic"), (F.col("id") % 3).cast("int").alias("partition"),
                                          F.col("id").alias("offset"), F.lit(None).cast("string").alias("reason"))
    split = pieces([OffsetRange("t", p, 0, 3000) for p in range(3)], 32)
    placed = spread(records, split).select("partition", "offset", F.spark_partition_id().alias("task")).collect()
    assert len(placed) == 3000
    assert all(any(r.partition == row.partition and r.start <= row.offset < r.end for r in split[row.task])
               for row in placed)


def test_ranges_take_exactly_their_records_whatever_the_topics_names_and_the_offsets(spark):
    from pyspark.sql import functions as F

    from exactly_once.spark.frames import in_ranges, with_set_aside

    topics = ["orders.v1-eu_west", "it's", "back\\slash`tick"]
    big = 1 << 40  # offsets beyond an int
    records = spark.range(0, 600).select(
        F.element_at(F.array(*map(F.lit, topics)), (F.col("id") % 3 + 1).cast("int")).alias("t"),
        (F.col("id") % 2).cast("int").alias("p"), (F.col("id") + big).alias("o"),
        F.lit(None).cast("string").alias("reason"))
    ranges = [OffsetRange(topics[1], 0, big + 10, big + 200), OffsetRange(topics[1], 0, big + 400, big + 401),
              OffsetRange(topics[2], 1, big, big + 50), OffsetRange(topics[0], 1, big + 590, big + 700)]
    expected = {(t, p, o) for t, p, o in ((topics[i % 3], i % 2, i + big) for i in range(600))
                if any((t, p) == (r.topic, r.partition) and r.start <= o < r.end for r in ranges)}
    taken = records.where(in_ranges(ranges, ("t", "p", "o"))).collect()
    assert {(row.t, row.p, row.o) for row in taken} == expected and len(taken) == len(expected)
    assert records.where(in_ranges([], ("t", "p", "o"))).count() == 0

    renamed = records.withColumnsRenamed({"t": "topic", "p": "partition", "o": "offset"})
    aside = [(OffsetRange(topics[1], 0, big + 10, big + 11), "first 'reason'"), (ranges[0], "second"),
             (OffsetRange(topics[2], 1, big + 5, big + 6), "third")]
    reasons = {(row.topic, row.offset): row.reason
               for row in with_set_aside(renamed, aside).where(F.col("reason").isNotNull()).collect()}
    first_match = {}
    for t, p, o in ((topics[i % 3], i % 2, i + big) for i in range(600)):
        for r, why in aside:
            if (t, p) == (r.topic, r.partition) and r.start <= o < r.end:
                first_match.setdefault((t, o), why)
    assert reasons == first_match and reasons[(topics[1], big + 10)] == "first 'reason'"
    assert len(first_match) == 33  # 32 records of the second range (the first among them), one of the third


def test_the_cached_records_pieces_leave_out_the_blocks_of_offsets_that_hold_no_record(spark):
    from exactly_once.spark.spread import GAP, cached_pieces

    # partition 0: an aborted transaction at 3,000-7,999, a marker at 9,000; partition 1: a gap
    # that covers no whole block
    offsets = [(0, o) for o in [*range(0, 3000), *range(8000, 9000), 9001]] + [(1, o) for o in range(0, 100)]
    held = spark.createDataFrame([("t", p, o) for p, o in offsets + [(1, 100 + GAP - 10)]],
                                 "topic string, partition int, offset long").coalesce(1).persist()
    try:
        assert cached_pieces(held) == [[OffsetRange("t", 0, 0, 3000), OffsetRange("t", 0, 8000, 9002),
                                        OffsetRange("t", 1, 0, 100 + GAP - 9)]]
    finally:
        held.unpersist()
