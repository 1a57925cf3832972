"""The restore drill's pipeline: one topic in, an append, an upsert and an aggregate table
and a kafka sink out (a record per order, keyed by `k`, carrying its source coordinates),
on the drill's own PostgreSQL. Its runs go through the pipeline's own run path
(exactly_once.orchestration.tasks: begin, which publishes first, as the DAG's does; the
increment; commit; publish) with the protocol harness's Driver playing the Spark job, so
no Spark is started; the oracle (tests/oracle.py) says what the tables and the topic hold.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from contextlib import closing

from confluent_kafka import Producer
from psycopg2 import sql

from exactly_once.config import PipelineConfig
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.checkpoints import Outcome
from exactly_once.ledger.invariants import violations
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.migrate import migrate
from exactly_once.ledger.protocol import Ledger
from exactly_once.orchestration import tasks
from exactly_once.orchestration.outcomes import TaskOutcome, after_begin
from exactly_once.publishing.publisher import kafka_sinks, progress_topic, transactional_id
from exactly_once.publishing.transactions import CHECKPOINT_HEADER
from tests import oracle
from tests.kafka_records import committed_records, create_topic, produce_transactions, wait_for_markers
from tests.ledger.harness import FINAL_TABLES, KEYS, Driver, order, pipeline_config, row_of
from tests.oracle import Record

# The protocol tests' three sinks, and the kafka sink's table (the outbox's shape).
TABLES = FINAL_TABLES + """
CREATE TABLE {schema}.out (id text NOT NULL, k text NOT NULL, n bigint NOT NULL,
    kafka_topic text NOT NULL, kafka_partition int NOT NULL, kafka_offset bigint NOT NULL);
"""


class DrillPipeline:
    """The pipeline on a database (`connect`), the records committed to its topic, its runs."""

    def __init__(self, connect, servers: str):
        self.connect, self.servers = connect, servers
        self.name = name = f"drill_{uuid.uuid4().hex[:8]}"
        self.topic, self.output = f"{name}_orders", f"{name}_out"
        create_topic(servers, self.topic, partitions=3)
        create_topic(servers, self.output, partitions=2)
        with closing(connect()) as conn:
            migrate(conn)
            with conn, conn.cursor() as cur:
                cur.execute(TABLES.format(schema=name))
        self.config = pipeline_config(name, self.topic, more_sinks=(
            {"name": "out", "table": f"{name}.out", "mode": "kafka", "keys": ["k"], "topic": self.output},))
        self.records: list[Record] = []
        self.runs = 0

    def at(self, connect, db_url: str) -> tuple[Ledger, Driver]:
        """The ledger and the job's stand-in on a database (the primary, or the restored one)."""
        self.connect, self.db_url = connect, db_url
        ledger = Ledger(self.config, connect)
        return ledger, Driver(ledger, self.servers, db_url)

    def produce(self, first: int, n: int) -> list[Record]:
        """n orders over the three partitions and one value that is not JSON (a dead letter), committed."""
        sent = [(i % 3, KEYS[i % 4].encode(), order(i, KEYS[i % 4], i)) for i in range(first, first + n)]
        produced = produce_transactions(self.servers, self.topic, [(True, sent + [(first % 3, None, b"{bad")])])
        batch = [Record(self.topic, p.partition, p.offset, p.key, p.value) for p in produced]
        self.records += batch
        return batch

    def run(self, ledger: Ledger, driver: Driver) -> tuple[int, Exception | None]:
        """A DAG run: begin (publishing first), the increment, commit, publish; the checkpoint and
        the publish task's failure, if it failed."""
        self.runs += 1
        client = KafkaClient.at(self.servers)
        with KafkaOffsets(client) as kafka:
            begun = tasks.begin_checkpoint(ledger, kafka, f"drill{self.runs}", None, None, publish_with=client)
        assert after_begin(begun) is TaskOutcome.DONE, begun
        checkpoint = begun.checkpoint.id
        tasks.run_increment(ledger, checkpoint, driver.execute)
        assert tasks.commit_checkpoint(ledger, checkpoint, 1) is Outcome.COMMITTED
        try:
            tasks.publish_outbox(ledger, client)
        except Exception as failure:  # noqa: BLE001 - what the publish task would fail with
            return checkpoint, failure
        return checkpoint, None

    def publish(self, ledger: Ledger) -> None:
        tasks.publish_outbox(ledger, KafkaClient.at(self.servers))

    # -- what the tables, the ledger and the consumers hold ------------------------------------

    def tables_exact(self, records: list[Record]) -> oracle.Comparison:
        """The PostgreSQL tables and dead letters against the oracle's of `records` (the kafka
        sink left out: `published` reads the topic)."""
        expected = oracle.expected(self.config, records, row_of)
        actual = oracle.actual(self.db_url, _without_kafka(self.config))
        return oracle.compare(oracle.Expected(_without_kafka(self.config), expected.tables), actual)

    def all_exact(self) -> oracle.Comparison:
        """Every sink, the kafka sink's topic read as a read_committed consumer keeps it."""
        return oracle.compare(oracle.expected(self.config, self.records, row_of),
                              oracle.actual(self.db_url, self.config, self.servers))

    def ledger_agrees(self) -> list[str]:
        """The ledger's invariants, and its committed ranges: from offset 0 to each partition's
        end of the records produced, without a gap or an overlap."""
        found = []
        with closing(self.connect()) as conn:
            found += violations(conn, self.config)
            with conn.cursor() as cur:
                cur.execute("SELECT partition, from_offset, to_offset FROM exactly_once.committed_ranges "
                            "WHERE pipeline = %s ORDER BY partition, from_offset", (self.name,))
                ranges = cur.fetchall()
        ends = Counter()
        for record in self.records:
            ends[record.partition] = max(ends[record.partition], record.offset + 1)
        for partition, end in sorted(ends.items()):
            mine = [(a, b) for p, a, b in ranges if p == partition]
            if not mine or mine[0][0] != 0 or mine[-1][1] < end or any(b != a for (_, b), (a, _) in
                                                                       zip(mine, mine[1:])):
                found.append(f"partition {partition}: committed {mine}, records to {end}")
        return found

    def published(self) -> list[tuple[int, int, int]]:
        """What a read_committed consumer of the output topic sees: per record, its source
        partition and offset and its header exactly_once.checkpoint."""
        wait_for_markers(self.servers, self.output)
        seen = []
        for record in committed_records(self.servers, self.output):
            headers = dict(record.headers)
            value = json.loads(record.value)
            seen.append((value["kafka_partition"], value["kafka_offset"], int(headers[CHECKPOINT_HEADER])))
        return seen

    # -- the runbook's way out after a restore --------------------------------------------------

    def skip_what_the_topic_holds(self) -> int:
        """What a person does once publishing stopped after a restore, for a sink whose records
        carry their source coordinates: the outbox rows whose records the topic already holds
        deleted, the sink's progress started over (a tombstone under the publisher's
        transactional id in the progress topic, the database's published row deleted); the next
        publish publishes the rest, once. The rows deleted."""
        held = {(partition, offset) for partition, offset, _ in self.published()}
        [sink] = kafka_sinks(self.config)
        with closing(self.connect()) as conn, conn, conn.cursor() as cur:
            cur.execute("SELECT checkpoint_id, position, (record->>'kafka_partition')::int, "
                        "(record->>'kafka_offset')::bigint FROM exactly_once.outbox WHERE pipeline = %s AND sink = %s",
                        (self.name, sink.name))
            doubles = [(c, p) for c, p, partition, offset in cur.fetchall() if (partition, offset) in held]
            for checkpoint, position in doubles:
                cur.execute(sql.SQL("DELETE FROM {} WHERE pipeline = %s AND sink = %s AND checkpoint_id = %s "
                                    "AND position = %s").format(sql.Identifier("exactly_once", "outbox")),
                            (self.name, sink.name, checkpoint, position))
            cur.execute("DELETE FROM exactly_once.outbox_published WHERE pipeline = %s AND sink = %s",
                        (self.name, sink.name))
            producer = Producer({"bootstrap.servers": self.servers})
            producer.produce(progress_topic(self.config, sink), None, transactional_id(self.config, sink).encode(),
                             partition=0)
            if producer.flush(30):
                raise TimeoutError("the progress tombstone was not delivered within 30 s")
        return len(doubles)


def _without_kafka(config: PipelineConfig) -> PipelineConfig:
    return config.model_copy(update={"sinks": tuple(s for s in config.sinks if s.mode != "kafka")})
