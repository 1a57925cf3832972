"""The restore drill (`./dev restore-drill`, tests/operate/restore_drill.py) in its smallest
configuration: CI's slice of it."""

from tests.operate.restore_drill import drill


def test_restore_drill(kafka_servers):
    """A point-in-time restore of the pipeline database between two commits, on a cluster of
    the drill's own: the run again re-reads from the restored frontier (tables = ledger = every
    record once), a read_committed consumer of the kafka sink's topic sees no record twice,
    status names the stopped publishing, and the way out publishes the rest once."""
    report = drill(kafka_servers, records=10)
    assert [s.name for s in report.steps][-1].startswith("way out"), report
    assert "OutboxMismatch" in report.status and "Restore from a backup" in report.status  # its way out
