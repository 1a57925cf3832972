"""Committed outbox rows to Kafka, exactly once, one kafka sink (a shard) at a time.

    init_transactions(transactional id of the sink)      fences every earlier publisher of it
    read the progress topic (read_committed)             what Kafka says is published
    verdict against the database                         a restored database stops here
    repeat: begin; rows after the progress in frontier order, up to a batch; the batch's progress; commit;
            record the progress in the database and prune the outbox up to it

Each Kafka transaction is short (`batch_rows`, well under `transaction_timeout_ms`) and
carries its own progress, so a publisher that dies, is fenced, or is too slow (the broker
aborts its transaction) leaves Kafka without those records and without their progress:
the next publisher publishes them once. Records are keyed by the sink's keys and
partitioned by the key's murmur2 hash, as Java clients partition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timezone

from confluent_kafka import Producer

from exactly_once import faults
from exactly_once.config import PipelineConfig, Sink
from exactly_once.errors import ConfigError
from exactly_once.kafka_client import KafkaClient
from exactly_once.publishing import progress
from exactly_once.publishing.progress import NEVER, Hold, Progress
from exactly_once.sqlfiles import named

CHECKPOINT_HEADER = "exactly_once.checkpoint"
REPLACES_HEADER = "exactly_once.replaces"


def kafka_sinks(config: PipelineConfig) -> list[Sink]:
    return [s for s in config.sinks if s.mode == "kafka"]


def transactional_id(config: PipelineConfig, sink: Sink) -> str:
    """Fixed per sink: a second publisher of the sink fences the first."""
    return f"exactly_once.{config.name}.{sink.name}"


def progress_topic(config: PipelineConfig, sink: Sink) -> str:
    """The sink's own: a read_committed reader of a partition stops at its first open
    transaction, so another publisher's would hide this one's progress."""
    return sink.progress_topic or f"exactly_once_progress-{config.name}-{sink.name}"


@dataclass(frozen=True)
class Published:
    sink: str
    records: int
    transactions: int
    through: Progress | None

    def __str__(self) -> str:
        return (f"sink {self.sink}: {self.records} records in {self.transactions} Kafka transactions, published "
                f"through {self.through or 'nothing yet'}")


class Publisher:
    def __init__(self, config: PipelineConfig, connect: Callable[[], object], client: KafkaClient,
                 batch_rows: int = 10_000, transaction_timeout_ms: int = 60_000):
        self.config, self.connect, self.client = config, connect, client
        self.batch_rows, self.transaction_timeout_ms = batch_rows, transaction_timeout_ms

    def publish(self) -> list[Published]:
        return [self.publish_sink(sink) for sink in kafka_sinks(self.config)]

    def publish_sink(self, sink: Sink) -> Published:
        shard, progress_at = transactional_id(self.config, sink), progress_topic(self.config, sink)
        progress.ensure_topic(self.client, progress_at)
        producer = Producer({**self.client.config, "transactional.id": shard, "partitioner": "murmur2_random",
                             "transaction.timeout.ms": self.transaction_timeout_ms, "linger.ms": 5})
        self._check_topic(producer, sink)
        producer.init_transactions(60)
        faults.point("publish.after_init")
        with closing(self.connect()) as reader, closing(self.connect()) as writer:
            at = self._reconcile(writer, sink, shard, progress.read(self.client, progress_at, shard))
            records = transactions = 0
            for rows in self._batches(reader, sink, at):
                producer.begin_transaction()
                try:
                    for checkpoint_id, position, epoch, replaces, key, value, _ in rows:
                        headers = [(CHECKPOINT_HEADER, str(checkpoint_id))]
                        if replaces is not None:
                            headers.append((REPLACES_HEADER, str(replaces)))
                        self._produce(producer, sink.topic, None if key is None else key.encode(), value.encode(),
                                      headers)
                    last = rows[-1]
                    at = Progress(*last[:3], rank=last[6])
                    self._produce(producer, progress_at, shard.encode(), at.encode(), None, partition=0)
                    faults.point("publish.before_commit")
                    producer.commit_transaction(self.transaction_timeout_ms / 1000)
                except BaseException:
                    _abort(producer)  # readers of the topic wait no longer on it
                    raise
                faults.point("publish.after_commit")
                self._record(writer, sink, at, prune=False)  # pruned once, at the end: this cursor reads on
                records, transactions = records + len(rows), transactions + 1
            if transactions:
                self._record(writer, sink, at, prune=True)
        return Published(sink.name, records, transactions, at)

    def _check_topic(self, producer: Producer, sink: Sink) -> None:
        if sink.topic not in producer.list_topics(timeout=30).topics:
            raise ConfigError(f"sink {sink.name!r}: Kafka topic {sink.topic!r} does not exist (create it with "
                              "the partitions its consumers need; the publisher does not guess them)")

    @staticmethod
    def _produce(producer: Producer, topic: str, key: bytes | None, value: bytes, headers, **where) -> None:
        while True:
            try:
                producer.produce(topic, value, key, headers=headers, **where)
                return
            except BufferError:  # the local queue is full: let it drain
                producer.poll(0.5)

    def _reconcile(self, conn, sink: Sink, shard: str, in_kafka: Progress | None) -> Progress | None:
        """Where publishing goes on (progress.verdict); the database catches up with Kafka."""
        with conn, conn.cursor() as cur:
            cur.execute(named("outbox.sql")["published"], self._names(sink))
            found = cur.fetchone()
            known = self._ranked(cur, sink, Progress(*found)) if found else None
            epoch_at = None
            if in_kafka is not None:
                cur.execute(named("outbox.sql")["epoch_at"], {**self._names(sink), **_where(in_kafka)})
                epoch_at = (cur.fetchone() or (None,))[0]
                in_kafka = self._ranked(cur, sink, in_kafka)
            first_open = held_behind(cur, self.config.name, sink.name)
        at = progress.verdict(f"pipeline {self.config.name} sink {sink.name}", in_kafka, known, epoch_at, first_open)
        if at is not None:  # also prunes what a publisher that died after some batches left
            self._record(conn, sink, at, prune=True)
        return at

    def _batches(self, conn, sink: Sink, at: Progress | None) -> Iterator[list[tuple]]:
        """The rows after `at` (the outbox holds no other: it is pruned up to it) that may be
        published now, in frontier order (outbox.sql, ranks), in batches, from one snapshot
        (rows committed meanwhile wait for the next publish), streamed."""
        with conn, conn.cursor() as cur:
            held = held_behind(cur, self.config.name, sink.name)
        with conn, conn.cursor(name=f"outbox_{sink.name}") as cur:
            cur.itersize = self.batch_rows
            rank, checkpoint_id = held.order if held else (NEVER, NEVER)
            cur.execute(statement("next_rows"),
                        {**self._names(sink), "held_rank": rank, "held_checkpoint": checkpoint_id})
            while rows := cur.fetchmany(self.batch_rows):
                yield rows

    def _record(self, conn, sink: Sink, at: Progress, prune: bool) -> None:
        """What Kafka's commit made durable, recorded; with `prune`, the outbox rows up to it deleted."""
        with conn, conn.cursor() as cur:
            params = {**self._names(sink), **_where(at), "epoch": at.epoch, "now": datetime.now(timezone.utc)}
            cur.execute(statement("record_published"), params)
            if prune:
                cur.execute(statement("prune"), params)

    def _ranked(self, cur, sink: Sink, at: Progress) -> Progress:
        cur.execute(statement("rank_of"), {**self._names(sink), **_where(at)})
        return Progress(at.checkpoint_id, at.position, at.epoch, rank=cur.fetchone()[0])

    def _names(self, sink: Sink) -> dict[str, str]:
        return {"pipeline": self.config.name, "sink": sink.name}


def statement(name: str) -> str:
    """A statement of sql/outbox.sql, with the frontier order's ranks (`ranks`) where it asks."""
    found = named("outbox.sql")
    return found[name].replace("/* ranks */", found["ranks"])


def held_behind(cur, pipeline: str, sink: str) -> Hold | None:
    """What the sink's publishing waits for (outbox.sql, held_behind); None: nothing."""
    cur.execute(statement("held_behind"), {"pipeline": pipeline, "sink": sink})
    found = cur.fetchone()
    return Hold(*found) if found else None


def _abort(producer: Producer) -> None:
    try:
        producer.abort_transaction(10)
    except Exception:  # fenced, or the broker gone: the broker aborts it at its timeout
        pass


def _where(at: Progress) -> dict[str, int]:
    return {"checkpoint_id": at.checkpoint_id, "position": at.position}
