"""An upsert sink's order (issue 36 item 8): the row a key keeps must depend neither on the
topic its records came from, nor on the partition the key lived in before partitions were
added, nor on the order checkpoints commit in. Without `order_by` a key's newest row is the
highest (offset, partition), which holds only while each key lives in one partition of one
topic: several source topics are refused when the configuration loads, and a partition increase
is refused when the planner checks `ambiguous_partitions`. With `order_by` it is the highest
(order_by, kafka_topic, kafka_partition, kafka_offset) in Spark's per-key fold, PostgreSQL's
fold and merge, and a reprocessing's recompute.

Real Kafka and PostgreSQL, with the harness's driver playing the Spark job and the oracle
(tests/oracle.py) saying what the tables must hold; real local Spark for its fold."""

from __future__ import annotations

import json
import time
import uuid
from contextlib import closing
from datetime import datetime, timedelta, timezone

import psycopg2
import pytest
from confluent_kafka.admin import AdminClient, NewPartitions
from psycopg2 import sql

from exactly_once.config import Sink, load_config
from exactly_once.errors import ConfigError
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger import replays
from exactly_once.ledger.checkpoints import Outcome
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.protocol import Ledger
from exactly_once.sinks import SinkTables, upsert
from exactly_once.sqlstates import record_failure
from tests import oracle
from tests.kafka_records import create_topic, produce_transactions
from tests.ledger.harness import Driver
from tests.oracle import DROPPED, Record

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
VALUE_SCHEMA = {"k": "string", "n": "bigint", "at": "timestamp"}  # `at`: when the event happened
COLUMNS = ["k", "n", "at", "kafka_topic", "kafka_partition", "kafka_offset"]
FINAL_TABLE = """CREATE SCHEMA {schema};
CREATE TABLE {schema}.latest (k text PRIMARY KEY, n bigint NOT NULL, at timestamptz NOT NULL,
    kafka_topic text NOT NULL, kafka_partition int NOT NULL, kafka_offset bigint NOT NULL)"""


def config_data(name: str, topics, **sink) -> dict:
    return {"name": name, "source": {"topics": list(topics), "value_schema": VALUE_SCHEMA},
            "sinks": [{"name": "latest", "table": f"{name}.latest", "mode": "upsert", "keys": ["k"], **sink}]}


def value(k: str, n: int, minute: int) -> bytes:
    return json.dumps({"k": k, "n": n, "at": (T0 + timedelta(minutes=minute)).isoformat()}).encode()


def row_of(record: Record) -> dict:
    """The pipeline's parse in Python (it has no transform)."""
    v = json.loads(record.value)
    return {"k": v["k"], "n": v["n"], "at": datetime.fromisoformat(v["at"])}


def produce(servers: str, topic: str, records: list[tuple[int, str, int, int]]) -> list[Record]:
    """(partition, key, n, minute) each, in one committed transaction; the records as read back."""
    produced = produce_transactions(servers, topic, [(True, [(p, k.encode(), value(k, n, minute))
                                                             for p, k, n, minute in records])])
    return [Record(topic, r.partition, r.offset, r.key, r.value) for r in produced]


class OrderedPipeline:
    """A pipeline reading `topics` into one upsert sink ordered by the event time `at`."""

    def __init__(self, db_url: str, servers: str, topics):
        name = f"p{uuid.uuid4().hex[:10]}"
        with closing(psycopg2.connect(db_url)) as conn, conn, conn.cursor() as cur:
            cur.execute(FINAL_TABLE.format(schema=name))
        self.db_url, self.servers = db_url, servers
        self.config = load_config(config_data(name, topics, order_by="at"))
        self.ledger = Ledger(self.config, lambda: psycopg2.connect(db_url))
        self.driver = Driver(self.ledger, servers, db_url)
        self.driver.row_of = row_of

    def begin(self, run: str) -> int:
        with KafkaOffsets(KafkaClient.at(self.servers)) as kafka:
            return self.ledger.begin(run, None, None, kafka).checkpoint.id

    def run_once(self, run: str) -> None:
        checkpoint_id = self.begin(run)
        self.driver.run(checkpoint_id)
        assert self.ledger.commit(checkpoint_id) is Outcome.COMMITTED

    def assert_exact(self, records: list[Record], row_of=row_of) -> dict[str, dict]:
        """The table equals the oracle's; its rows by key."""
        expected = oracle.expected(self.config, records, row_of)
        oracle.assert_exact(expected, oracle.actual(self.db_url, self.config))
        return {row["k"]: row for row in expected.tables["latest"]}


# -- what the configuration allows ------------------------------------------------------------


def test_several_topics_and_an_upsert_sink_without_order_by_are_refused_naming_the_sink():
    with pytest.raises(ConfigError, match=r"sinks\.0\.order_by: .*sink 'latest'"):
        load_config(config_data("p", ["a", "b"]))
    assert load_config(config_data("p", ["a", "b"], order_by="at")).sink("latest").order_by == "at"
    assert load_config(config_data("p", ["a"])).sink("latest").order_by is None  # one topic: offsets order


@pytest.mark.parametrize("sink, message", [
    ({"mode": "append", "order_by": "at"}, "order_by is for upsert sinks, not append sinks"),
    ({"mode": "aggregate", "keys": ["k"], "measures": {"n": "sum"}, "order_by": "at"},
     "order_by is for upsert sinks, not aggregate sinks"),
    ({"mode": "upsert", "keys": ["k"], "order_by": "k"}, "order_by 'k' is a key column"),
    ({"mode": "upsert", "keys": ["k"], "order_by": "kafka_offset"}, "order_by 'kafka_offset' is a coordinate"),
])
def test_order_by_is_an_upsert_sinks_own_column(sink, message):
    with pytest.raises(ValueError, match=message):
        Sink(name="s", table="t", **sink)


def test_a_partition_increase_is_refused_for_an_upsert_sink_ordered_by_offset_naming_it():
    unordered = load_config(config_data("p", ["t"]))
    before, seen = {("t", 0)}, {("t", 0), ("t", 1), ("t", 2)}
    message = upsert.ambiguous_partitions(unordered, before, seen)
    assert "sink 'latest'" in message and "t[1], t[2]" in message and "order_by" in message
    assert upsert.ambiguous_partitions(unordered, seen, seen) is None    # no partition is new
    assert upsert.ambiguous_partitions(unordered, set(), seen) is None   # a first plan: no key lived anywhere before
    assert upsert.ambiguous_partitions(load_config(config_data("p", ["t"], order_by="at")), before, seen) is None
    appends = load_config({**config_data("p", ["t"]), "sinks": [{"name": "e", "table": "e", "mode": "append"}]})
    assert upsert.ambiguous_partitions(appends, before, seen) is None


# -- through the protocol (the driver plays the Spark job) -------------------------------------


@pytest.fixture
def two_topics(kafka_servers) -> tuple[str, str]:
    base = f"t_order_{uuid.uuid4().hex[:8]}"
    topics = (f"{base}-a", f"{base}_b")  # the second is higher in the tie-break ('-' < '_')
    for topic in topics:
        create_topic(kafka_servers, topic, partitions=2)
    return topics


# (partition, key, n, minute). Each key's newest event may be in either topic, at a lower or
# higher offset, and committed first or last; plum and kiwi tie on their event times.
FIRST_TOPIC = [(0, "apple", 1, 5), (0, "pear", 2, 1), (0, "pear", 3, 2), (0, "plum", 4, 4),
               (1, "fig", 5, 7), (1, "fig", 6, 6), (1, "kiwi", 7, 3), (0, "kiwi", 8, 3)]
SECOND_TOPIC = [(1, "apple", 11, 3), (0, "pear", 12, 9), (0, "plum", 13, 4), (1, "kiwi", 14, 3)]


def two_checkpoints(db_url: str, servers: str, topics, pipelines: int) -> tuple[list, list[Record]]:
    """Pipelines that each begin a checkpoint of the first topic's records and one of the
    second's (both open at once, as parallel runs) and run them to pre-commit: each
    pipeline's (pipeline, [first, second]), and the records."""
    opened = [(OrderedPipeline(db_url, servers, topics), []) for _ in range(pipelines)]
    records = []
    for topic, batch in zip(topics, (FIRST_TOPIC, SECOND_TOPIC)):
        records += produce(servers, topic, batch)
        for pipeline, checkpoints in opened:
            checkpoints.append(pipeline.begin(f"run-{topic}"))
    for pipeline, checkpoints in opened:
        for checkpoint_id in checkpoints:
            pipeline.driver.run(checkpoint_id)
    return opened, records


def test_two_topics_leave_each_key_its_latest_event_in_either_commit_order(ledger_db, kafka_servers, two_topics):
    [(in_order, in_order_ids), (reverse, reverse_ids)], records = two_checkpoints(ledger_db, kafka_servers,
                                                                                  two_topics, pipelines=2)
    for checkpoint_id in in_order_ids:
        assert in_order.ledger.commit(checkpoint_id) is Outcome.COMMITTED
    for checkpoint_id in reversed(reverse_ids):
        assert reverse.ledger.commit(checkpoint_id) is Outcome.COMMITTED
    newest = in_order.assert_exact(records)
    reverse.assert_exact(records)
    # What the oracle's rule makes of the cases: the latest event, whatever its topic, partition,
    # offset or commit; on a tie the higher topic, though its record has the lower offset.
    first, second = two_topics
    assert {k: (row["kafka_topic"], row["n"]) for k, row in newest.items()} == {
        "apple": (first, 1), "pear": (second, 12), "plum": (second, 13), "fig": (first, 5), "kiwi": (second, 14)}


def test_a_reprocessing_recomputes_the_keys_it_touches_by_the_same_order(ledger_db, kafka_servers, two_topics):
    [(pipeline, checkpoints)], records = two_checkpoints(ledger_db, kafka_servers, two_topics, pipelines=1)
    for checkpoint_id in checkpoints:
        assert pipeline.ledger.commit(checkpoint_id) is Outcome.COMMITTED

    def fixed(record: Record) -> dict:
        """The second topic's records parsed anew: pear dropped (its key falls back to the
        first topic's contribution), the others' n ten times (plum and kiwi still tie)."""
        row = row_of(record)
        return DROPPED if row["k"] == "pear" else {**row, "n": 10 * row["n"]}

    pipeline.driver.row_of = fixed
    reprocessing = replays.reprocess(pipeline.ledger, checkpoints[1], "fix").checkpoint.id
    pipeline.driver.run(reprocessing)
    assert pipeline.ledger.commit(reprocessing) is Outcome.COMMITTED
    newest = pipeline.assert_exact(records, lambda r: (fixed if r.topic == two_topics[1] else row_of)(r))
    assert (newest["pear"]["n"], newest["plum"]["n"], newest["apple"]["n"]) == (3, 130, 1)


def add_partitions(servers: str, topic: str, total: int) -> None:
    """Grows the topic to `total` partitions and waits until the broker's metadata shows them."""
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_partitions([NewPartitions(topic, total)])[topic].result(timeout=30)
    deadline = time.monotonic() + 30
    while len(admin.list_topics(topic, timeout=10).topics[topic].partitions) < total:
        assert time.monotonic() < deadline, f"{topic} never showed {total} partitions"
        time.sleep(0.1)


def test_after_a_partition_increase_a_keys_newer_record_wins_from_a_lower_offset(ledger_db, kafka_servers):
    topic = f"t_grown_{uuid.uuid4().hex[:8]}"
    create_topic(kafka_servers, topic, partitions=1)
    pipeline = OrderedPipeline(ledger_db, kafka_servers, [topic])
    records = produce(kafka_servers, topic, [(0, "apple", 1, 1), (0, "apple", 2, 2), (0, "pear", 3, 5),
                                             (0, "apple", 4, 3)])
    pipeline.run_once("before")
    add_partitions(kafka_servers, topic, 2)
    # apple's newest event lands at offset 0 of the new partition, below its older one's offset 3.
    records += produce(kafka_servers, topic, [(1, "apple", 5, 9), (1, "pear", 6, 0)])
    pipeline.run_once("after")
    newest = pipeline.assert_exact(records)
    assert (newest["apple"]["kafka_partition"], newest["apple"]["kafka_offset"], newest["pear"]["n"]) == (1, 0, 3)


# -- Spark's fold and PostgreSQL's agree -------------------------------------------------------

# (k, n, minute, topic, partition, offset). Each key's rows but h's tie on the event time. The
# topics compare one way as bytes (Spark's strings, COLLATE "C": 'O' < 'o', '-' < '_') and
# another in a locale's collation (und-x-icu: orders_a < Orders_c < orders-b).
TIES = [("k", 1, 4, "orders_a", 0, 5), ("k", 2, 4, "orders-b", 0, 1), ("k", 3, 4, "Orders_c", 0, 9),
        ("j", 4, 4, "orders", 1, 2), ("j", 5, 4, "orders", 0, 9),
        ("m", 6, 4, "orders", 0, 7), ("m", 7, 4, "orders", 0, 3),
        ("h", 8, 5, "orders", 0, 1), ("h", 9, 4, "orders", 0, 8)]
FRAME_SCHEMA = "k string, n bigint, at timestamp, kafka_topic string, kafka_partition int, kafka_offset bigint"
TABLE_COLUMNS = """(k text NOT NULL, n bigint NOT NULL, at timestamptz NOT NULL,
    kafka_topic text COLLATE "und-x-icu" NOT NULL, kafka_partition int NOT NULL, kafka_offset bigint NOT NULL)"""


def ordered_sink(**changes) -> Sink:
    return Sink(**{"name": "latest", "table": "s.latest", "mode": "upsert", "keys": ("k",), "order_by": "at",
                   **changes})


def newest_by_key(rows) -> dict[str, int]:
    """n of each key's row, from (k, n, ...) rows."""
    return {row[0]: row[1] for row in rows}


def test_spark_postgresql_and_the_oracle_pick_the_same_row_of_each_key(spark, pipeline_db_url):
    sink = ordered_sink()
    rows = [(k, n, T0 + timedelta(minutes=minute), *coordinates) for k, n, minute, *coordinates in TIES]
    spark_picks = newest_by_key(sink.strategy.staging_rows(spark.createDataFrame(rows, FRAME_SCHEMA), sink,
                                                           COLUMNS).select("k", "n").collect())
    records = [Record(topic, partition, offset, k.encode(), value(k, n, minute))
               for k, n, minute, topic, partition, offset in TIES]
    config = load_config(config_data("p", sorted({r.topic for r in records}), order_by="at"))
    assert spark_picks == newest_by_key((row["k"], row["n"]) for row in
                                        oracle.expected(config, records, row_of).tables["latest"])

    schema = f"u{uuid.uuid4().hex[:10]}"
    source, final = sql.Identifier(schema, "rows"), sql.Identifier(schema, "final")
    with closing(psycopg2.connect(pipeline_db_url)) as conn, conn, conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        cur.execute(sql.SQL("CREATE TABLE {} " + TABLE_COLUMNS).format(source))
        cur.execute(sql.SQL("CREATE TABLE {} " + TABLE_COLUMNS[:-1] + ", PRIMARY KEY (k))").format(final))
        cur.executemany(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s, %s)").format(source), rows)
        cur.execute(sink.strategy.folded(sink, source, sql.SQL("true"), COLUMNS))
        assert newest_by_key(cur.fetchall()) == spark_picks
        # Each row merged on its own, as if every row were a checkpoint's: in the order given
        # and in reverse, the final table keeps the same rows.
        tables = SinkTables(final, source, sql.Identifier(schema, "unused"), COLUMNS)
        for merged in (rows, rows[::-1]):
            cur.execute(sql.SQL("TRUNCATE {}").format(final))
            for k, n, *_ in merged:
                one = sink.strategy.folded(sink, source, sql.SQL("n = {}").format(sql.Literal(n)), COLUMNS)
                cur.execute(sink.strategy.merge(sink, tables, one))
            cur.execute(sql.SQL("SELECT k, n FROM {}").format(final))
            assert newest_by_key(cur.fetchall()) == spark_picks


def test_spark_refuses_a_row_without_an_order_value_as_a_record_that_fails_its_write(spark):
    sink = ordered_sink()
    frame = spark.createDataFrame([("k", 1, None, "orders", 0, 0)], FRAME_SCHEMA)
    with pytest.raises(Exception) as refused:
        sink.strategy.staging_rows(frame, sink, COLUMNS).collect()
    # Record isolation sets the record aside as a dead letter with this reason.
    state, message = record_failure(refused.value)
    assert state.startswith("P0") and "order_by column at is null" in message


def test_an_order_by_column_that_spark_and_postgresql_may_compare_differently_is_refused(spark):
    sink = ordered_sink()
    frame = spark.createDataFrame([("k", 1, "2024-05-01 12:00", "orders", 0, 0)],
                                  FRAME_SCHEMA.replace("at timestamp", "at string"))
    with pytest.raises(ConfigError, match="sink 'latest' .*order_by column at is string: .*a number, a date or a "):
        sink.strategy.staging_rows(frame, sink, COLUMNS)
