"""Promise 8 against real Kafka, Spark and PostgreSQL, through the run path: each poison
record among valid ones becomes exactly one dead letter whose reason names the sink and
column (or the transform), the valid records commit exactly once, and nothing stalls."""

from __future__ import annotations

import json
import secrets
import shutil
from collections import Counter
from contextlib import closing

import psycopg2
import pytest

from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.checkpoints import State
from exactly_once.ledger.planning import OffsetRange
from exactly_once.ledger.refusals import PromotionRefused
from exactly_once.orchestration import tasks
from exactly_once.orchestration.outcomes import TaskOutcome, after_error
from exactly_once.spark import kept_rows, one_pass
from exactly_once.spark.increment import grouped_tasks, offsets_per_task
from exactly_once.spark.runners import job_runner
from exactly_once.spark.settings import JobSettings
from exactly_once.spark.staging_writes import StagingWrites
from exactly_once_stack import spark_cluster
from exactly_once_stack.settings import spark_connection
from tests.job_role import job_db_url
from tests.spark.poison import TRANSFORM, Orders, order, valid_orders, written_table_by_table
from tests.spark.transforms import PRICED

NUL = "\u0000"
STANDALONE = "spark_poison_standalone"  # the Airflow connection the standalone test gives the job's Spark
# case: (value, key, expected reason; None for a record that commits)
POISON = {
    "NUL in a string field": (order("nul-note", note=f"a{NUL}b"), b"k", "sink orders: column note: contains NUL (0x00)"),
    "NUL in an upsert/aggregate key": (order("nul-key", sku=f"ap{NUL}le"), b"k",
                                       "sink latest: column sku: contains NUL (0x00)"),
    "invalid UTF-8 value": (b'{"id": "\xff\xfe", "sku": "apple"}', b"k", "value is not valid UTF-8"),
    "invalid UTF-8 key (kept as bytes; the record counts)": (order("bad-key"), b"\xff\xfe", None),
    "number beyond the column's precision": (order("too-dear", price="12345.678"), b"k",
                                             "sink latest: column price: 12345.678 does not fit numeric(6,2)"),
    "string longer than varchar(n)": (order("long-sku", sku="a-very-long-sku"), b"k",
                                      "sink latest: column sku: 15 characters, longer than character varying(8)"),
    "timestamp PostgreSQL cannot store": (order("ancient", at="-5000-01-01T00:00:00Z"), b"k",
                                          "sink orders: column at: -5000-01-01 00:00:00 is outside PostgreSQL's "
                                          "timestamp range (-4713-11-24 to 294276-12-31)"),
    "row refused by a CHECK constraint": (order("bulk", qty=5000), b"k", 'sink orders: new row for relation "orders" '
                                          'violates check constraint "orders_qty_check"'),
    "transform raises on one record": (order("raises"), b"k",
                                       f"transform {TRANSFORM}: ValueError: cannot price order raises"),
    "trigger raises on one row": (order("cursed"), b"k", "sink orders: order cursed is cursed"),
    "a domain's CHECK (refused by the staging write, through JDBC)": (
        order("minus", qty=-1), b"k", 'sink orders: value for domain {schema}.quantity violates check constraint '
                                      '"quantity_check"'),
}


@pytest.fixture
def orders(ledger_db, kafka_servers, topic) -> Orders:
    return Orders(ledger_db, kafka_servers, topic,
                  bad=frozenset(value for value, _, reason in POISON.values() if reason is not None))


def produce_poison_among_valid(orders: Orders) -> None:
    valid = valid_orders(0, 24)
    poison = [(i % 3, key, value) for i, (value, key, _) in enumerate(POISON.values())]
    orders.produce(valid[:12] + poison + valid[12:])


def assert_each_poison_record_is_its_dead_letter(orders: Orders, checkpoint_id: int) -> None:
    """The checkpoint committed the valid records exactly once, and each poison record is
    the one dead letter with its case's reason."""
    assert orders.ledger.checkpoint(checkpoint_id).state is State.COMMITTED
    orders.assert_exact()
    at = {r.value: (r.partition, r.offset) for r in orders.records}
    reasons = orders.dead_letter_reasons()
    assert {case: reasons.get(at[value]) for case, (value, _, _) in POISON.items()} == \
        {case: reason and reason.format(schema=orders.config.name) for case, (_, _, reason) in POISON.items()}


def test_each_poison_record_is_one_dead_letter_naming_sink_and_column_and_the_rest_commits(spark, orders):
    produce_poison_among_valid(orders)

    checkpoint_id = orders.run(spark)

    assert_each_poison_record_is_its_dead_letter(orders, checkpoint_id)


@pytest.mark.variant
def test_each_poison_record_is_the_same_dead_letter_on_a_standalone_cluster(orders, monkeypatch):
    """The job spark-submitted to the stack's standalone master (and its worker's executor),
    as the Airflow task submits it: the COPY writer and the row checks run in the executor's
    JVM and Python workers, apart from the driver."""
    started = spark_cluster.start("standalone")
    try:
        monkeypatch.setenv(f"AIRFLOW_CONN_{STANDALONE.upper()}", json.dumps(spark_connection("standalone")))
        runner = job_runner(STANDALONE, f"{orders.config.name} increment", orders.config,
                            JobSettings(job_db_url(), KafkaClient.at(orders.servers)))
        produce_poison_among_valid(orders)

        checkpoint_id = orders.run(runner=runner)

        assert_each_poison_record_is_its_dead_letter(orders, checkpoint_id)
    finally:
        spark_cluster.stop_named(started)


def test_a_promotion_refused_at_commit_sends_the_checkpoint_back_and_the_next_run_dead_letters_the_record(
        spark, ledger_db, kafka_servers, topic):
    orders = Orders(ledger_db, kafka_servers, topic)
    orders.produce(valid_orders(0, 12))
    checkpoint_id = orders.begin()
    orders.increment(spark, checkpoint_id)  # pre-committed: no table refused anything then
    with closing(psycopg2.connect(ledger_db)) as conn, conn, conn.cursor() as cur:  # a table changes meanwhile
        cur.execute(f"ALTER TABLE {orders.config.sink('orders').table} ADD CONSTRAINT no_o5 CHECK (id <> 'o5')")

    with pytest.raises(PromotionRefused, match='violates check constraint "no_o5"') as refused:
        tasks.commit_checkpoint(orders.ledger, checkpoint_id, 1)
    assert after_error(refused.value) is TaskOutcome.FAIL  # no retry loops on it
    assert orders.ledger.checkpoint(checkpoint_id).state is State.PLANNED

    orders.run(spark)  # recovery re-plans its ranges; the new attempt isolates the record
    assert orders.ledger.checkpoint(checkpoint_id).state is State.ABORTED
    orders.bad = {order for order in (r.value for r in orders.records) if b'"o5"' in order}
    orders.assert_exact()
    assert sorted(orders.dead_letter_reasons().values()) == \
        ['sink orders: new row for relation "orders" violates check constraint "no_o5"']


def test_a_key_too_large_for_a_final_tables_index_is_a_dead_letter_and_the_rest_commits(spark, ledger_db,
                                                                                         kafka_servers, topic):
    """Staging has no index on the keys, so the key passes staging and pre-commit; the final
    table's unique index refuses it at commit (54000): a record's fault, like a CHECK."""
    orders = Orders(ledger_db, kafka_servers, topic, extra_ddl="ALTER TABLE {s}.latest ALTER sku TYPE text; "
                                                               "ALTER TABLE {s}.per_sku ALTER sku TYPE text; "
                                                               "ALTER TABLE {s}.orders ALTER sku TYPE text;")
    huge = order("huge", sku=secrets.token_hex(4000))  # 8,000 characters that do not compress: over 2,704 bytes
    orders.produce(valid_orders(0, 12) + [(1, b"k", huge)])
    checkpoint_id = orders.begin()
    orders.increment(spark, checkpoint_id)
    with pytest.raises(PromotionRefused, match="index row size"):
        tasks.commit_checkpoint(orders.ledger, checkpoint_id, 1)

    orders.run(spark)  # the next run's attempt promotes every sink on trial and isolates the record
    orders.bad = {huge}
    orders.assert_exact()
    [reason] = orders.dead_letter_reasons().values()
    assert reason.startswith("sink latest: index row size") and 'index "latest_pkey"' in reason


def test_a_null_key_an_upsert_table_would_take_is_a_dead_letter_and_the_rest_commits(spark, ledger_db,
                                                                                      kafka_servers, topic):
    """An upsert sink keyed by a column that takes nulls (a unique index, not a primary key): a
    null key names no row (ON CONFLICT never matches it), and the merge reads a tombstone of a
    null key as a change feed's truncate; the record's write fails, saying so, and isolation
    sets it aside."""
    orders = Orders(ledger_db, kafka_servers, topic, transform="tests.spark.transforms:nulls_the_sku_of_keyless",
                    extra_ddl=(
        "ALTER TABLE {s}.latest DROP CONSTRAINT latest_pkey, ALTER sku DROP NOT NULL, ADD UNIQUE (sku); "
        "ALTER TABLE {s}.per_sku DROP CONSTRAINT per_sku_pkey, ALTER sku DROP NOT NULL, ADD UNIQUE (sku); "
        "ALTER TABLE {s}.orders ALTER sku DROP NOT NULL;"))
    keyless = order("keyless")  # the transform nulls its sku
    orders.produce(valid_orders(0, 12) + [(1, b"k", keyless)])
    orders.run(spark)
    orders.bad = {keyless}
    orders.assert_exact()
    [reason] = orders.dead_letter_reasons().values()
    assert "sink latest: key column sku is null: an upsert sink's key names its row" in reason


def test_a_record_larger_than_max_record_bytes_is_a_dead_letter_before_it_is_parsed(spark, ledger_db, kafka_servers,
                                                                                     topic):
    orders = Orders(ledger_db, kafka_servers, topic)
    orders.config = orders.ledger.config = orders.config.model_copy(update={"max_record_bytes": 300})
    large = order("large", note="n" * 400)
    orders.produce(valid_orders(0, 12) + [(2, b"k", large)])
    orders.run(spark)
    orders.bad = {large}
    orders.assert_exact()
    assert list(orders.dead_letter_reasons().values()) == \
        [f"record of {len(large) + 1} bytes (key and value) is larger than max_record_bytes 300"]


def test_a_sink_whose_foreign_key_references_another_sinks_new_rows_isolates_only_its_bad_record(
        spark, ledger_db, kafka_servers, topic):
    """orders' foreign key references latest, which cannot refuse anything itself: the trial
    promotes latest before orders, so the key sees the checkpoint's new skus and only the
    cursed order fails on its own."""
    orders = Orders(ledger_db, kafka_servers, topic,
                    extra_ddl="ALTER TABLE {s}.orders ADD FOREIGN KEY (sku) REFERENCES {s}.latest (sku);")
    cursed = order("cursed")
    orders.produce(valid_orders(0, 12) + [(2, b"k", cursed)])
    orders.run(spark)
    orders.bad = {cursed}
    orders.assert_exact()
    assert list(orders.dead_letter_reasons().values()) == ["sink orders: order cursed is cursed"]


def test_a_record_a_deferred_foreign_key_refuses_is_isolated_by_the_trial_not_refused_at_every_commit(
        spark, ledger_db, kafka_servers, topic):
    """PostgreSQL checks a DEFERRABLE INITIALLY DEFERRED key at commit, which a trial never
    reaches: the trial checks it after each sink's promotion (migration 0016), so the order
    of an unknown sku is a dead letter and the rest commits in the same run."""
    orders = Orders(ledger_db, kafka_servers, topic, extra_ddl="""
        CREATE TABLE {s}.skus (sku varchar(8) PRIMARY KEY);
        INSERT INTO {s}.skus VALUES ('apple'), ('pear'), ('plum');
        ALTER TABLE {s}.orders ADD CONSTRAINT known_sku FOREIGN KEY (sku) REFERENCES {s}.skus (sku)
            DEFERRABLE INITIALLY DEFERRED;""")
    unknown = order("unknown", sku="kiwi")
    orders.produce(valid_orders(0, 12) + [(1, b"k", unknown)])
    orders.run(spark)  # committed in this run: the commit is not refused
    orders.bad = {unknown}
    orders.assert_exact()
    [reason] = orders.dead_letter_reasons().values()
    assert reason.startswith('sink orders: insert or update on table "orders" violates foreign key constraint '
                             '"known_sku"')


def test_the_fail_policy_fails_naming_the_record_a_transform_raises_on(spark, ledger_db, kafka_servers, topic):
    orders = Orders(ledger_db, kafka_servers, topic)
    orders.config = orders.ledger.config = orders.config.model_copy(update={"on_bad_record": "fail"})
    raises = order("raises")
    orders.produce(valid_orders(0, 12) + [(1, b"k", raises)])
    checkpoint_id = orders.begin()
    with pytest.raises(Exception) as failed:
        orders.increment(spark, checkpoint_id)
    [raised] = [r for r in orders.records if r.value == raises]
    assert f"{topic}[1]@{raised.offset}: transform {TRANSFORM}: ValueError: cannot price order raises" in \
        str(failed.value)
    assert after_error(failed.value) is TaskOutcome.FAIL  # the policy: no retry, and nothing committed
    assert orders.ledger.checkpoint(checkpoint_id).state is not State.COMMITTED


def test_a_column_of_the_transform_no_sink_takes_is_never_computed(spark, ledger_db, kafka_servers, topic):
    """The write caches the transformed rows with only the columns a sink reads: a UDF whose
    column no sink table has never runs, so the order it would raise on commits, and the
    order the transform's own UDF raises on is the one dead letter."""
    orders = Orders(ledger_db, kafka_servers, topic, transform="tests.spark.transforms:raises_in_a_column_no_sink_takes")
    raises, unread = order("raises"), order("unread")
    orders.produce(valid_orders(0, 12) + [(0, b"k", raises), (1, b"k", unread)])

    orders.run(spark)

    orders.bad = {raises}
    orders.assert_exact()
    assert list(orders.dead_letter_reasons().values()) == [
        "transform tests.spark.transforms:raises_in_a_column_no_sink_takes: ValueError: cannot price order raises"]


@pytest.mark.parametrize("way", ["one pass", "table by table"])
def test_the_write_after_isolation_runs_the_transform_again_only_over_the_partitions_that_failed(
        spark, ledger_db, kafka_servers, topic, monkeypatch, way):
    """The write's first pass names the partition of the cached records whose task raised,
    before any table is written; the next round reads the rows of the others from its cache and
    writes them in one pass (exactly_once.spark.one_pass; the table-by-table write would fail),
    or, where the pass serves no pipeline, table by table: the transform ran once on each
    record of the partition that passed, and the record it raises on is the one dead letter."""
    if way == "one pass":
        monkeypatch.setattr(StagingWrites, "every_table", written_table_by_table)
    else:
        monkeypatch.setattr(one_pass, "plan", lambda *args: None)
    orders = Orders(ledger_db, kafka_servers, topic, transform="tests.spark.transforms:counts_what_it_prices")
    raises = order("raises")
    # two Kafka partitions, so two Spark tasks read them, one each (small ranges read together
    # never fill fewer tasks than local[2]'s cores)
    valid = [(i % 2, key, value) for i, (_, key, value) in enumerate(valid_orders(0, 24))]
    shutil.rmtree(PRICED / topic, ignore_errors=True)
    orders.produce(valid[:12] + [(1, b"k", raises)] + valid[12:])

    orders.run(spark)

    orders.bad = {raises}
    orders.assert_exact()
    assert list(orders.dead_letter_reasons().values()) == [
        "transform tests.spark.transforms:counts_what_it_prices: ValueError: cannot price order raises"]
    priced = Counter(line for noted in (PRICED / topic).iterdir() for line in noted.read_text().splitlines())
    shutil.rmtree(PRICED / topic)
    partition = {json.loads(r.value)["id"]: r.partition for r in orders.records}
    assert {i: n for i, n in priced.items() if partition[i] == 0} == {i: 1 for i, p in partition.items() if p == 0}
    assert priced["raises"] > 1 and all(n > 1 for i, n in priced.items() if partition[i] == 1)  # its partition's again


@pytest.mark.parametrize("picked", ["kept", "computed again"])
def test_a_record_a_later_round_sets_aside_in_a_partition_whose_rows_are_kept_reaches_no_sink(
        spark, ledger_db, kafka_servers, topic, monkeypatch, picked):
    """After the transform raised in one partition, a CHECK constraint refuses a record of the
    other, whose checked rows the write keeps: the trial sets it aside, and the next round's rows
    from the kept cache leave its rows out, so it is the one dead letter with the constraint's
    message, as the record the transform raises on is with the transform's. Where the kept
    caches cannot be read partition by partition, the rounds compute every row again, with the
    same outcome; either way no cache is left behind."""
    read, reads = [], kept_rows._picked

    def spy(caches, cache_of):
        read.append(None if picked == "computed again" else reads(caches, cache_of))
        return read[-1]
    monkeypatch.setattr(kept_rows, "_picked", spy)
    orders = Orders(ledger_db, kafka_servers, topic, transform="tests.spark.transforms:counts_what_it_prices")
    raises, bulk = order("raises"), order("bulk", qty=5000)
    valid = [(i % 2, key, value) for i, (_, key, value) in enumerate(valid_orders(0, 24))]
    orders.produce(valid[:12] + [(1, b"k", raises), (0, b"k", bulk)] + valid[12:])
    cached = spark.sparkContext._jsc.getPersistentRDDs().size()

    orders.run(spark)

    orders.bad = {raises, bulk}
    orders.assert_exact()
    assert sorted(orders.dead_letter_reasons().values()) == [
        'sink orders: new row for relation "orders" violates check constraint "orders_qty_check"',
        "transform tests.spark.transforms:counts_what_it_prices: ValueError: cannot price order raises"]
    assert read and (read[-1] is not None) == (picked == "kept")  # the last round's rows: picked, or not
    assert spark.sparkContext._jsc.getPersistentRDDs().size() == cached
    shutil.rmtree(PRICED / topic, ignore_errors=True)


def test_a_transform_raising_on_every_record_fails_the_attempt_saying_the_cause_is_not_in_the_records(
        spark, ledger_db, kafka_servers, topic):
    """Isolation finds the records a transform raises on a round of the write at a time (each
    round's rest is the next write); its limits count every round's records, so every record
    failing on its own is still no set of dead letters, and nothing commits."""
    orders = Orders(ledger_db, kafka_servers, topic, transform="tests.spark.transforms:raises_on_every_order")
    orders.produce(valid_orders(0, 4))
    checkpoint_id = orders.begin()

    with pytest.raises(Exception) as failed:
        orders.increment(spark, checkpoint_id)

    assert "every record fails on its own, so the cause is not in the records" in str(failed.value)
    assert orders.ledger.checkpoint(checkpoint_id).state is not State.COMMITTED
    assert orders.dead_letter_reasons() == {}


def test_tasks_hold_fewer_records_when_records_may_be_large():
    assert offsets_per_task(None) == 250_000
    assert offsets_per_task(1024) == 250_000
    assert offsets_per_task(2**20) == 256  # 256 MiB a task at most
    assert offsets_per_task(2**30) == 1


def test_small_ranges_are_read_together_and_large_ones_as_spark_splits_them():
    def ranges(*sizes: int) -> tuple[OffsetRange, ...]:
        return tuple(OffsetRange("t", p, 0, size) for p, size in enumerate(sizes))

    def two_cores() -> int:
        return 2

    assert grouped_tasks(ranges(*[390] * 512), 250_000, two_cores) == 4  # 160 ranges a task: 62,400 offsets
    assert grouped_tasks(ranges(*[390] * 512), 250_000, lambda: 64) == 64  # never fewer tasks than cores
    assert grouped_tasks(ranges(10, 10, 10), 250_000, two_cores) == 2
    assert grouped_tasks(ranges(10, 10, 10), 250_000, lambda: 4) is None
    assert grouped_tasks(ranges(40_000, 40_000, 40_000), 250_000, two_cores) is None  # one a quarter's share
    assert grouped_tasks(ranges(300_000, 300_000, 300_000), 250_000, two_cores) is None  # 6 tasks of 150,000
    # a range split into tasks of 225,000 offsets: no task reads two of the source's
    assert grouped_tasks(ranges(900_000, *[10] * 511), 250_000, two_cores) is None
    assert grouped_tasks(ranges(0, 0), 250_000, two_cores) is None
