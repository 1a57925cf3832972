"""Issue 39, item 4, on the ledger's side: a tombstone (a Kafka record with a key and no
value) deletes its key's row from an upsert sink ordered by offset, ordered like the key's
other records, whatever order checkpoints commit in, and a reprocessing replays it exactly.
Real Kafka (the tombstones are real records, read back by the harness's driver) and
PostgreSQL; the test stages the sink's rows as the Spark job does (a tombstone: its key and
coordinates, `kafka_tombstone` true, nothing else) and drives the ledger's own begin,
pre-commit, commit and reprocessing. The oracle: per key, the newest committed record by
(offset, partition); no row if it is a tombstone."""

from __future__ import annotations

import json
from collections.abc import Iterable
from contextlib import closing
from datetime import timedelta

import psycopg2
import pytest
from psycopg2 import sql
from psycopg2.extras import execute_values

from exactly_once.config import load_config
from exactly_once.kafka_columns import KAFKA_TOMBSTONE
from exactly_once.ledger import replays, retention
from exactly_once.ledger.checkpoints import Outcome
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.refusals import NotReprocessable
from exactly_once.ledger.tables import DEAD_LETTERS, contributions_table, qualified, staging_table, tombstones_index
from exactly_once.sqlfiles import text
from tests import oracle
from tests.ledger.harness import Driver, Pipeline, order, query
from tests.ledger.machine import Clock
from tests.oracle import Record

PARTITION = {"apple": 0, "pear": 1, "fig": 2, "plum": 0}  # each key lives in one partition
GONE = None  # a tombstone's value


class Upserts:
    """The harness's pipeline reduced to its upsert sink `latest` (k, n, kafka_partition,
    kafka_offset; ordered by offset), with what each committed checkpoint (or its latest
    reprocessing) read, for the oracle."""

    def __init__(self, db_url: str, servers: str, topic: str, sink_name: str = "latest", keep_all: bool = False,
                 **options):
        """`options`: the ledger's clock, the pipeline's retention."""
        pipeline = Pipeline(db_url, servers, topic)
        dumped = pipeline.config.model_dump()
        sinks = [{**s, "name": sink_name} if s["name"] == "latest" else s for s in dumped["sinks"]
                 if keep_all or s["name"] == "latest"]
        source = {**dumped["source"], "value_schema": {"id": "string", "n": "bigint"}, "key_format": "string",
                  "key_schema": {"k": "string"}, "tombstones": "delete"}
        retention = {"retention": options["retention"]} if "retention" in options else {}
        pipeline.config = load_config({**dumped, "source": source, "sinks": sinks, **retention})
        clock = {"clock": options["clock"]} if "clock" in options else {}
        pipeline.ledger = Ledger(pipeline.config, pipeline.ledger.connect, **clock)
        pipeline.driver = Driver(pipeline.ledger, servers, db_url)
        self.pipeline, self.ledger, self.sink = pipeline, pipeline.ledger, pipeline.config.sink(sink_name)
        self.read: dict[int, list[Record]] = {}       # per checkpoint planned, the records of its ranges
        self.committed: dict[int, list[Record]] = {}  # per committed checkpoint, the records it contributed
        self.pending: dict[int, tuple[int, list[Record]]] = {}  # per pre-committed one: (its slot, its records)

    def plan(self, records: list[tuple[str, int | None]]) -> int:
        """Produces (key, n or GONE) records in one transaction and plans a checkpoint of
        them (and of nothing else: every earlier record is planned already)."""
        self.pipeline.produce([(True, [(PARTITION[k], k.encode(), GONE if n is GONE else order(n, k, n))
                                       for k, n in records])])
        checkpoint_id = self.pipeline.begin().checkpoint.id
        self.read[checkpoint_id] = self.pipeline.driver.read(self.ledger.checkpoint(checkpoint_id).ranges)
        assert len(self.read[checkpoint_id]) == len(records)
        return checkpoint_id

    def pre_commit(self, checkpoint_id: int, records: list[Record] | None = None) -> None:
        """An attempt that stages a row per record (all of them: the ledger folds them per key
        too) and pre-commits; `records` as a transform keeps them (all that were read, by default)."""
        checkpoint = self.ledger.start_attempt(checkpoint_id)
        slot = checkpoint.replays or checkpoint_id
        staged = self.read[slot] if records is None else records
        columns = ["k", "n", "kafka_partition", "kafka_offset", KAFKA_TOMBSTONE, "checkpoint_id", "attempt"]
        with closing(psycopg2.connect(self.pipeline.db_url)) as conn, conn, conn.cursor() as cur:
            statement = sql.SQL("INSERT INTO {} ({}) VALUES %s").format(
                staging_table(self.pipeline.config, self.sink.name), sql.SQL(", ").join(map(sql.Identifier, columns)))
            execute_values(cur, statement.as_string(cur), [(*staged_row(r), checkpoint_id, checkpoint.attempt)
                                                            for r in staged])
        self.ledger.pre_commit(checkpoint_id, checkpoint.attempt, {self.sink.name: len(staged), DEAD_LETTERS: 0},
                               records=len(staged))
        self.pending[checkpoint_id] = slot, staged

    def commit(self, checkpoint_id: int) -> None:
        slot, staged = self.pending.pop(checkpoint_id)
        assert self.ledger.commit(checkpoint_id) is Outcome.COMMITTED
        self.committed[slot] = staged

    def through(self, records: list[tuple[str, int | None]]) -> int:
        """A checkpoint of the records, planned, run and committed."""
        checkpoint_id = self.plan(records)
        self.pre_commit(checkpoint_id)
        self.commit(checkpoint_id)
        return checkpoint_id

    def reprocess(self, checkpoint_id: int, run_id: str, keep=lambda record: True) -> None:
        """A reprocessing of a committed checkpoint whose transform keeps the records `keep` says."""
        reprocessing = replays.reprocess(self.ledger, checkpoint_id, run_id).checkpoint.id
        self.pre_commit(reprocessing, [r for r in self.read[checkpoint_id] if keep(r)])
        self.commit(reprocessing)

    def table(self) -> dict[str, tuple]:
        rows = query(self.pipeline.db_url, f"SELECT k, n, kafka_partition, kafka_offset FROM {self.sink.table}")
        return {k: tuple(rest) for k, *rest in rows}

    def assert_exact(self) -> None:
        assert self.table() == expected(r for records in self.committed.values() for r in records)


def staged_row(record: Record) -> tuple:
    """(k, n, kafka_partition, kafka_offset, kafka_tombstone) as the job stages it."""
    k = record.key.decode()
    if record.value is None:
        return k, None, record.partition, record.offset, True
    return k, json.loads(record.value)["n"], record.partition, record.offset, False


def expected(records: Iterable[Record]) -> dict[str, tuple]:
    """The oracle: per key its newest record by (offset, partition), the rule of an upsert
    sink without order_by; no row when that one is a tombstone."""
    newest: dict[str, Record] = {}
    for record in records:
        k = record.key.decode()
        if k not in newest or (record.offset, record.partition) > (newest[k].offset, newest[k].partition):
            newest[k] = record
    return {k: (json.loads(r.value)["n"], r.partition, r.offset) for k, r in newest.items() if r.value is not None}


@pytest.fixture
def upserts(ledger_db, kafka_servers, topic) -> Upserts:
    return Upserts(ledger_db, kafka_servers, topic)


def test_a_tombstone_deletes_its_key_and_a_later_record_brings_it_back(upserts):
    upserts.through([("apple", 1), ("pear", 2), ("fig", 3)])
    assert set(upserts.table()) == {"apple", "pear", "fig"}

    # Within one checkpoint too, the newest of a key's records decides: plum's tombstone
    # follows its row, fig's row follows its tombstone.
    deleting = upserts.through([("apple", GONE), ("plum", 4), ("plum", GONE), ("fig", GONE), ("fig", 5)])
    upserts.assert_exact()
    assert set(upserts.table()) == {"pear", "fig"} and upserts.table()["fig"][0] == 5
    [(kept,)] = query(upserts.pipeline.db_url, f"SELECT array_agg(k ORDER BY k) FROM "
                      f"{qualified(contributions_table(upserts.pipeline.config, upserts.sink))} "
                      "WHERE checkpoint_id = %s AND kafka_tombstone", deleting)
    assert kept == ["apple", "plum"], "the contribution keeps the checkpoint's tombstones"

    upserts.through([("apple", 6), ("pear", GONE)])
    upserts.assert_exact()
    assert set(upserts.table()) == {"apple", "fig"} and upserts.table()["apple"][0] == 6


@pytest.mark.parametrize("commit_order", [(0, 1, 2, 3), (3, 2, 1, 0), (2, 1, 0, 3), (1, 0, 3, 2)])
def test_checkpoints_committed_in_any_order_leave_each_key_as_its_newest_record_says(upserts, commit_order):
    """(2, 1, 0, 3): the tombstones' checkpoint commits after a newer row of fig and before
    older rows of apple and pear, which must not bring them back."""
    checkpoints = [upserts.plan([("apple", 1), ("pear", 1), ("fig", 1)]),
                   upserts.plan([("apple", GONE), ("pear", GONE), ("fig", GONE), ("plum", GONE)]),
                   upserts.plan([("fig", 3), ("plum", 3)]),
                   upserts.plan([("pear", 4)])]
    for checkpoint_id in checkpoints:  # all pre-committed before any commits
        upserts.pre_commit(checkpoint_id)
    for i in commit_order:
        upserts.commit(checkpoints[i])
        upserts.assert_exact()
    assert upserts.table().keys() == {"fig", "plum", "pear"}


def test_a_reprocessing_replays_a_tombstone_and_one_without_it_brings_the_row_back(upserts):
    upserts.through([("apple", 1), ("pear", 1)])
    deleting = upserts.through([("apple", GONE), ("pear", 2), ("plum", 2)])
    upserts.through([("fig", 3), ("plum", GONE)])
    upserts.assert_exact()
    before = upserts.table()
    assert "apple" not in before and "plum" not in before

    upserts.reprocess(deleting, "again")
    assert upserts.table() == before

    upserts.reprocess(deleting, "fixed", keep=lambda record: record.value is not None)  # drops the tombstone
    upserts.assert_exact()
    assert upserts.table()["apple"][0] == 1, "the newest contribution left: the first checkpoint's row"
    assert "plum" not in upserts.table(), "plum's newer tombstone, in a later checkpoint, still holds"

    upserts.reprocess(deleting, "back", keep=lambda record: record.key != b"pear")  # the tombstone again; no pear
    upserts.assert_exact()
    assert "apple" not in upserts.table() and upserts.table()["pear"][0] == 1


def test_a_tombstone_folded_into_the_base_still_keeps_an_older_record_committed_later_out(ledger_db, kafka_servers,
                                                                                          topic):
    """Retention (exactly_once.ledger.retention) folds the tombstone's checkpoint into the
    base: the base keeps it as its key's newest contribution, so an older record of the key,
    committed after the fold, still comes too late, and a reprocessing of that record's
    checkpoint (inside the horizon) recomputes the key from the base: no row."""
    clock = Clock()
    upserts = Upserts(ledger_db, kafka_servers, topic, clock=clock,
                      retention={"reprocess_horizon": "PT1H", "history": "PT3H", "dead_letters": None, "batch": 10})
    older = upserts.plan([("apple", 1), ("pear", 1)])
    deleting = upserts.plan([("apple", GONE), ("fig", 2)])
    upserts.pre_commit(older)
    upserts.pre_commit(deleting)
    upserts.commit(deleting)
    clock.advance(timedelta(hours=2))
    retention.prune(upserts.ledger)
    assert query(ledger_db, "SELECT folded_at IS NOT NULL FROM exactly_once.checkpoints WHERE id = %s",
                 deleting) == [(True,)]
    contributions = qualified(contributions_table(upserts.pipeline.config, upserts.sink))
    assert query(ledger_db, f"SELECT k, kafka_tombstone FROM {contributions} ORDER BY k") == [
        ("apple", True), ("fig", False)]  # the base's: the deleting checkpoint's, folded

    upserts.commit(older)
    upserts.assert_exact()
    assert upserts.table().keys() == {"pear", "fig"}
    upserts.reprocess(older, "again")
    upserts.assert_exact()
    with pytest.raises(NotReprocessable, match="reprocess horizon"):
        upserts.reprocess(deleting, "refused")


def columns_of(db_url: str, table) -> dict[str, tuple]:
    """name → (NOT NULL, default) of a ledger table's columns."""
    rows = query(db_url, "SELECT a.attname::text, a.attnotnull, pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a "
                         "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
                         "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped",
                 qualified(table))
    return {name: (not_null, default) for name, not_null, default in rows}


def as_before_tombstones(upserts: Upserts) -> None:
    """The sink's ledger tables as a version without tombstones left them: no mark, no index of
    tombstones, the final table's NOT NULL in staging."""
    config, db_url = upserts.pipeline.config, upserts.pipeline.db_url
    for table in (staging_table(config, upserts.sink.name), contributions_table(config, upserts.sink)):
        query(db_url, f"ALTER TABLE {qualified(table)} DROP COLUMN {KAFKA_TOMBSTONE}")  # its index goes with it
    query(db_url, f"ALTER TABLE {qualified(staging_table(config, upserts.sink.name))} ALTER COLUMN n SET NOT NULL")


def assert_marked(upserts: Upserts) -> None:
    config, db_url = upserts.pipeline.config, upserts.pipeline.db_url
    for table in (staging_table(config, upserts.sink.name), contributions_table(config, upserts.sink)):
        assert columns_of(db_url, table)[KAFKA_TOMBSTONE] == (True, "false")


@pytest.mark.parametrize("sink_name", ["latest", "latest_" + "x" * 33])  # the second's tables' names are cut
def test_an_existing_sinks_tables_gain_the_mark_by_migration_and_by_registration(ledger_db, kafka_servers, topic,
                                                                                    sink_name):
    upserts = Upserts(ledger_db, kafka_servers, topic, sink_name, keep_all=True)
    upserts.pipeline.produce([(True, [(0, b"apple", order(1, "apple", 1)), (1, b"pear", order(2, "pear", 2))])])
    upserts.pipeline.run_once()
    upserts.pipeline.produce([(True, [(0, b"apple", order(3, "apple", 3))])])
    waiting = upserts.pipeline.begin().checkpoint.id
    as_before_tombstones(upserts)  # as the version before left them
    upserts.pipeline.driver.run(waiting)  # pre-committed by that version's job: no mark named

    # The upgrade's migration, before any begin registers the pipeline again (run here as
    # exactly_once.ledger.migrate runs it; it changes nothing where the mark is there).
    with closing(psycopg2.connect(ledger_db)) as conn, conn, conn.cursor() as cur:
        cur.execute(text("migrations/0010_upsert_tombstones.sql"))
    assert_marked(upserts)
    assert upserts.ledger.commit(waiting) is Outcome.COMMITTED  # by the new promotion
    upserts.pipeline.assert_exact()

    # A registration alone also brings them to shape: the mark, its index, nulls in staging.
    as_before_tombstones(upserts)
    upserts.ledger.register()
    assert_marked(upserts)
    config = upserts.pipeline.config
    assert columns_of(ledger_db, staging_table(config, sink_name))["n"][0] is False, "a tombstone has no n"
    [(indexed,)] = query(ledger_db, "SELECT to_regclass(%s) IS NOT NULL",
                         qualified(sql.Identifier("exactly_once", tombstones_index(config, upserts.sink).strings[-1])))
    assert indexed
    [(final_not_null,)] = query(ledger_db, "SELECT attnotnull FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                                           "AND attname = 'n'", upserts.sink.table)
    assert final_not_null, "the final table is the user's: it keeps its NOT NULL and gets no mark"
    assert KAFKA_TOMBSTONE not in oracle.final_columns(ledger_db, config)[sink_name]
