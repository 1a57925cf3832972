"""The publisher's verdict on Kafka's progress against the database (pure): where publishing
goes on, and each disagreement that stops it rather than skip or repeat records."""

from __future__ import annotations

import pytest

from exactly_once.publishing.progress import OutboxMismatch, Progress, verdict

SHARD = "pipeline p sink s"
AT = Progress(7, 40, "epoch-a")


def test_nothing_published_anywhere_starts_at_the_beginning():
    assert verdict(SHARD, None, None, None, None) is None


def test_kafka_and_the_database_agreeing_go_on_after_it():
    assert verdict(SHARD, AT, AT, None, None) == AT


def test_kafka_ahead_of_the_database_goes_on_after_kafka_when_the_outbox_holds_its_row():
    assert verdict(SHARD, AT, Progress(5, 3, "epoch-b"), "epoch-a", None) == AT
    assert verdict(SHARD, AT, None, "epoch-a", None) == AT  # a crash before the first record of it


@pytest.mark.parametrize("epoch_at, says", [(None, "holds no such row"),
                                            ("epoch-c", "holds that row with epoch epoch-c")])
def test_kafka_ahead_of_an_outbox_without_its_row_stops(epoch_at, says):
    with pytest.raises(OutboxMismatch, match=f"Kafka's progress says checkpoint 7 row 40 \\(epoch epoch-a\\) was "
                                             f"published, but the outbox {says}; was the database restored"):
        verdict(SHARD, AT, Progress(5, 3, "epoch-b"), epoch_at, None)


def test_kafka_behind_the_database_stops():
    with pytest.raises(OutboxMismatch, match="is behind what this database recorded as published"):
        verdict(SHARD, Progress(5, 3, "epoch-b"), AT, None, None)


def test_kafka_at_the_same_row_of_another_epoch_stops():
    with pytest.raises(OutboxMismatch, match="names another epoch"):
        verdict(SHARD, Progress(7, 40, "epoch-z"), AT, None, None)


def test_no_progress_in_kafka_after_the_database_recorded_some_stops():
    with pytest.raises(OutboxMismatch, match="Kafka holds no progress, but this database recorded checkpoint 7"):
        verdict(SHARD, None, AT, None, None)


def test_progress_survives_its_encoding():
    assert Progress.decode(AT.encode()) == AT and Progress.decode(AT.encode()).epoch == "epoch-a"


def test_kafka_past_a_checkpoint_the_database_holds_open_stops():
    # Publishing never passes an open checkpoint: a backup taken before it committed
    with pytest.raises(OutboxMismatch, match="but checkpoint 6, planned before it, is open in this database"):
        verdict(SHARD, AT, Progress(5, 3, "epoch-b"), "epoch-a", 6)
    assert verdict(SHARD, AT, Progress(5, 3, "epoch-b"), "epoch-a", 8) == AT
