"""Record isolation's bisection, pure: it finds exactly the offsets whose records fail on
their own, within its limits, and says so when none does."""

from __future__ import annotations

import psycopg2
import pytest

from exactly_once.ledger.planning import OffsetRange
from exactly_once.spark.isolation import NotIsolated, halves, narrow, size
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
        narrow(RANGES, prober({(0, o): "bad" for o in range(10)}), max_isolated=3)
    with pytest.raises(NotIsolated, match="within 5 probes"):
        narrow(RANGES, prober({(0, 99): "bad"}), max_probes=5)


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
