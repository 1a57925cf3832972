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

A record Kafka refuses (larger than the topic's `max.message.bytes`, an invalid record:
`refusals.ROW_REFUSALS`) aborts its transaction (transactions.py); the batch is published
again in halves, each a transaction of its own, down to the one row Kafka refuses alone: the
rows before it are published, and the sink's publishing stops at it (`OutputRefused`,
recorded in `exactly_once.refusals` until a publish passes; the way out is `stalls
dead-letter-output`). A refusal of the topic itself (`refusals.SINK_REFUSALS`: an ACL, a
topic gone) blames no row. Any other error (a broker blip, a timeout) is raised as it is: a
retry may pass, and nothing is ever dead-lettered for it. Publishers of one sink read Kafka's
progress and read and record the database's under a lock of the sink (`lock_sink`): one
never reads Kafka's progress, then finds its row pruned by another that recorded it meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timezone

from confluent_kafka import Producer

from exactly_once import faults
from exactly_once.config import PipelineConfig, Sink
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger import run_refusals
from exactly_once.publishing import progress, transactions
from exactly_once.publishing.progress import NEVER, Hold, Progress
from exactly_once.publishing.refusals import OutputRefused, Refused, blamed, fenced, halves, may_pass
from exactly_once.sqlfiles import named


def lock_sink(cur, pipeline: str, sink: str) -> None:
    """The sink's lock for the rest of the transaction: reading and recording the database's
    progress, and pruning or dead-lettering outbox rows, one publisher (or operator) at a time."""
    cur.execute("SET LOCAL lock_timeout = '60s'")
    cur.execute("SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(%s, 0))",
                (f"exactly_once:publish:{pipeline}:{sink}",))


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
        """Every kafka sink, each on its own: one whose publishing fails holds up no other;
        the first failure is raised once all were tried."""
        published, failures = [], []
        for sink in kafka_sinks(self.config):
            try:
                published.append(self.publish_sink(sink))
            except Exception as failure:
                failures.append(failure)
        if failures:
            raise failures[0]
        return published

    def publish_sink(self, sink: Sink) -> Published:
        """The sink's rows, published; a failure recorded as a refusal of its publishing (but
        a publisher fenced by another), a success clearing it."""
        kind = run_refusals.publishing(sink.name)
        try:
            published = self._publish_sink(sink)
        except OutputRefused as refused:
            run_refusals.record(self.connect, self.config.name, kind, refused, row=refused.row, topic=refused.topic)
            raise
        except Exception as failure:
            if not fenced(failure):
                run_refusals.record(self.connect, self.config.name, kind, failure, retryable=may_pass(failure),
                                    topic=sink.topic)
            raise
        run_refusals.clear(self.connect, self.config.name, kind)
        return published

    def _publish_sink(self, sink: Sink) -> Published:
        shard, progress_at = transactional_id(self.config, sink), progress_topic(self.config, sink)
        progress.ensure_topic(self.client, progress_at)
        producer = self._producer(sink, shard)
        faults.point("publish.after_init")
        with closing(self.connect()) as reader, closing(self.connect()) as writer:
            at = self._reconcile(writer, sink, shard, progress_at)
            done = _Done(at, producer)
            try:
                for rows in self._batches(reader, sink, at):
                    self._publish_rows(writer, sink, shard, progress_at, rows, done)
            except OutputRefused:
                if done.transactions:  # what was published before the refused row
                    self._record(writer, sink, done.at, prune=True)
                raise
            if done.transactions:
                self._record(writer, sink, done.at, prune=True)
        return Published(sink.name, done.records, done.transactions, done.at)

    def _producer(self, sink: Sink, shard: str) -> Producer:
        return transactions.producer(self.client, sink, shard, self.transaction_timeout_ms)

    def _publish_rows(self, writer, sink: Sink, shard: str, progress_at: str, rows: list[tuple], done: _Done) -> None:
        """The rows in one Kafka transaction. Refused by Kafka: the rows before the first it
        refused, then the rest, each a transaction of its own (halves when it refused the first),
        down to the row it refuses alone (OutputRefused). After a refusal the producer is a new
        one: librdkafka's idempotent sequence of a refused batch does not recover by an abort."""
        try:
            at = transactions.transaction(done.producer, sink, shard, progress_at, rows, self.transaction_timeout_ms)
        except Refused as refused:
            done.producer = self._producer(sink, shard)
            if (stop := blamed(self.config.name, sink, refused, rows)) is not None:
                raise stop from None
            for part in halves(refused, rows):
                self._publish_rows(writer, sink, shard, progress_at, part, done)
            return
        faults.point("publish.after_commit")
        self._record(writer, sink, at, prune=False)  # pruned once, at the end: this cursor reads on
        done.at, done.records, done.transactions = at, done.records + len(rows), done.transactions + 1

    def _reconcile(self, conn, sink: Sink, shard: str, progress_at: str) -> Progress | None:
        """Where publishing goes on (progress.verdict); the database catches up with Kafka.
        Kafka's progress is read under the sink's lock too: read before it, another publisher
        could publish, record and prune past it meanwhile, and the database would be found
        ahead of Kafka (the protocol model's finding, model/publisher.pml)."""
        with conn, conn.cursor() as cur:
            lock_sink(cur, self.config.name, sink.name)  # no record or prune of another publisher between the reads
            in_kafka = progress.read(self.client, progress_at, shard)
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
            lock_sink(cur, self.config.name, sink.name)
            params = {**self._names(sink), **_where(at), "epoch": at.epoch, "now": datetime.now(timezone.utc)}
            cur.execute(statement("record_published"), params)
            if prune:
                cur.execute(statement("prune"), params)

    def _ranked(self, cur, sink: Sink, at: Progress) -> Progress:
        cur.execute(statement("rank_of"), {**self._names(sink), **_where(at)})
        return Progress(at.checkpoint_id, at.position, at.epoch, rank=cur.fetchone()[0])

    def _names(self, sink: Sink) -> dict[str, str]:
        return {"pipeline": self.config.name, "sink": sink.name}


@dataclass
class _Done:
    """What a publish_sink has published so far."""

    at: Progress | None
    producer: Producer
    records: int = 0
    transactions: int = 0


def statement(name: str) -> str:
    """A statement of sql/outbox.sql, with the frontier order's ranks (`ranks`) where it asks."""
    found = named("outbox.sql")
    return found[name].replace("/* ranks */", found["ranks"])


def held_behind(cur, pipeline: str, sink: str) -> Hold | None:
    """What the sink's publishing waits for (outbox.sql, held_behind); None: nothing."""
    cur.execute(statement("held_behind"), {"pipeline": pipeline, "sink": sink})
    found = cur.fetchone()
    return Hold(*found) if found else None


def _where(at: Progress) -> dict[str, int]:
    return {"checkpoint_id": at.checkpoint_id, "position": at.position}

