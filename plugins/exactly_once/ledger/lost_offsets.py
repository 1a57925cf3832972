"""When Kafka's log no longer holds what a pipeline planned: records deleted by retention
before they were read, a log that ends before offsets already planned, a topic deleted and
created again (another topic id, KIP-516). Each stops the pipeline naming what happened
and the operator's way out (exactly_once.operate.stalls).
"""

from __future__ import annotations

from exactly_once.errors import Permanent


class DataLossError(Permanent):
    """Records were deleted by retention before the pipeline read them."""

    def __init__(self, topic: str, partition: int, frontier: int, log_start: int):
        self.topic, self.partition, self.frontier, self.log_start = topic, partition, frontier, log_start
        super().__init__(
            f"{topic}[{partition}]: offsets {frontier}..{log_start - 1} ({log_start - frontier} records) were "
            f"deleted by Kafka retention before this pipeline read them; set allow_data_loss to record "
            f"the gap and go on")


class OffsetsWentBack(Permanent):
    """A partition's log ends before offsets the pipeline already planned, or is another
    topic's log (its id is not the one recorded with the partition): the topic was deleted
    and created again, or the brokers are another cluster's. Planning there would read other
    records under the offsets of ones already counted, or skip the new log's first records."""

    def __init__(self, topic: str, partition: int, frontier: int, log_end: int,
                 recorded_id: str | None = None, topic_id: str | None = None):
        self.topic, self.partition, self.frontier, self.log_end = topic, partition, frontier, log_end
        self.recorded_id, self.topic_id = recorded_id, topic_id
        why = ("(the topic deleted and created again? a failover to another cluster?)" if recorded_id == topic_id else
               f"in another topic of that name: the topic's id was {recorded_id} and is now {topic_id} (deleted and "
               "created again, or another cluster's), so its offsets are not the ones planned")
        super().__init__(
            f"{topic}[{partition}]: offsets went backwards: the pipeline planned up to offset {frontier}, but the "
            f"partition's log now ends at {log_end} {why}; no run goes on until an operator resets the partition: "
            f"`python -m exactly_once.operate.stalls reset-partition PIPELINE '{topic}[{partition}]' --to OFFSET "
            "--reason WHY`")


class PlannedInAnotherTopic(Permanent):
    """A checkpoint's frozen ranges were planned in a topic that has been deleted and created
    again since (its id is another): reading them would read the new topic's records under
    offsets frozen for the old one's (promise 7). Its job fails without reading, not retryable."""

    def __init__(self, pipeline: str, checkpoint_id: int, topic: str, partitions: list[int], recorded_id: str,
                 topic_id: str):
        self.checkpoint_id, self.topic, self.partitions = checkpoint_id, topic, partitions
        self.recorded_id, self.topic_id = recorded_id, topic_id
        where = ", ".join(f"{topic}[{p}]" for p in partitions)
        super().__init__(
            f"checkpoint {checkpoint_id}: offsets went backwards: its ranges of {where} were planned in topic "
            f"{topic!r} whose id was {recorded_id}, but the topic's id is now {topic_id} (deleted and created again, "
            f"or another cluster's): they are not read; release the checkpoint (`python -m exactly_once.operate.stalls "
            f"retry {checkpoint_id}`), then reset each partition: `python -m exactly_once.operate.stalls "
            f"reset-partition {pipeline} '{topic}[PARTITION]' --to OFFSET --reason WHY`")


def replaced(recorded_id: str | None, topic_id: str | None) -> bool:
    """Whether a topic's id differs from the one recorded (neither unknown): the topic was
    created again since."""
    return recorded_id is not None and topic_id is not None and recorded_id != topic_id


RESET = "@reset-"  # no Kafka topic name holds '@': the label cannot name a topic


def reset_label(topic: str, resets_before: int) -> str:
    """The name a partition's history is kept under once an operator reset it (`stalls
    reset-partition`): its committed ranges, gaps and append rows, `TOPIC@reset-N`."""
    return f"{topic}{RESET}{resets_before + 1}"


def was_reset(topic: str) -> bool:
    """Whether a range's topic is such a label: its records were read from a log since gone."""
    return RESET in topic
