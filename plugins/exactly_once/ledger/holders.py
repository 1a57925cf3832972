"""Which checkpoints hold the offsets of an interval's records: what the log of a run that
finds its interval empty says (a backfill over intervals already taken)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.sqlfiles import named

Q = named("ledger.sql")


@dataclass(frozen=True)
class Holder:
    checkpoint_id: int
    state: str
    dag_run_id: str


def holders(conn, kafka: KafkaOffsets, pipeline: str, topics: list[str], interval_start: datetime,
            interval_end: datetime) -> list[Holder]:
    """Checkpoints holding offsets of the interval [interval_start, interval_end): per partition,
    from the first offset stamped at or after its start to the first at or after its end."""
    found = set()
    with conn.cursor() as cur:
        for topic in topics:
            for partition, at in kafka.topic_offsets(topic, interval_start, interval_end).items():
                first, end = at.position(at.at_interval_start), at.position(at.at_interval_end)
                if first < end:
                    cur.execute(Q["holders"], {"pipeline": pipeline, "topic": topic, "partition": partition,
                                               "from_offset": first, "to_offset": end})
                    found.update(Holder(*row) for row in cur.fetchall())
    return sorted(found, key=lambda h: h.checkpoint_id)
