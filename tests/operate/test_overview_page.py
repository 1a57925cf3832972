"""The pipelines view's page (pure): what the ledger holds is shown, never run — names,
reasons and errors are escaped — and a dead letter's bytes are previewed without decoding."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from exactly_once.ledger.planning import OffsetRange
from exactly_once.operate.overview import DeadLetter, PipelineOverview, preview
from exactly_once.operate.overview_page import page
from exactly_once.operate.status import CheckpointSummary, LastCommit, PipelineStatus, Stall

NOW = datetime(2026, 11, 24, 8, 0, tzinfo=timezone.utc)
HOSTILE = '<script>alert("x")</script>'


def test_the_preview_shows_printable_ascii_and_every_other_byte_as_an_escape():
    assert preview(b'{"sku": "a\x00b"} \xff\xc3\xa9 \\ <') == '{"sku": "a\\x00b"} \\xff\\xc3\\xa9 \\x5c <'
    assert preview(None) == ""


def test_values_from_the_ledger_are_escaped_and_run_links_quoted():
    checkpoint = CheckpointSummary(7, "manual__2026-11-24T08:00:00+00:00", NOW - timedelta(minutes=10), NOW,
                                   "committed", 1000, (OffsetRange("t", 0, 0, 1000),), timedelta(seconds=20),
                                   timedelta(seconds=1), 1)
    status = PipelineStatus(HOSTILE, (Stall(8, "run<2>", (OffsetRange("t", 0, 1000, 1010),), 1, NOW, HOSTILE),),
                            LastCommit(7, checkpoint.dag_run_id, NOW, NOW, 1000), (), (), (), (checkpoint,))
    dead = DeadLetter("t", 0, 5, HOSTILE, 7, NOW, preview(b"<b>\x00"), 4)
    html = page([PipelineOverview(status, "dag<1>", ((HOSTILE, 1),), (dead,), None)], "", 20, NOW)
    assert "<script>" not in html and "<b>" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html and "&lt;b&gt;\\x00" in html
    assert 'href="/dags/dag%3C1%3E/runs/manual__2026-11-24T08%3A00%3A00%2B00%3A00"' in html
    assert 'data-field="records-bar" data-checkpoint="7" data-value="1000"' in html
    assert 'data-field="latency-bar" data-checkpoint="7" data-value="21.0"' in html
