"""The demo pipeline on the one oracle (tests/oracle.py): its committed records and its
model of them (exactly_once_demo.oracle) give what its tables must hold. The DAG tests
use it on the demo itself; the fault matrix and the benchmarks on copies of the demo
(their own pipeline name, topic and schema)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import closing
from datetime import datetime

import psycopg2

from exactly_once.config import PipelineConfig, load_config
from exactly_once.ledger.planning import OffsetRange
from exactly_once.ledger.rows import registered_config
from exactly_once.publishing.publisher import kafka_sinks
from exactly_once_demo.oracle import checkpoints, committed_orders, has_nul, order_row, parsed_order
from exactly_once_demo.pipeline import CONFIG
from exactly_once_demo.pipeline import config as demo_config
from tests import oracle
from tests.oracle import DROPPED, Comparison, Expected, Record, Row, Tables


def order_row_with_returns(record: Record) -> Row | None:
    """`exactly_once_demo.pipeline.prepare_with_returns` in Python: no row for an order of
    one item (so no dead letter either for one whose text holds a NUL: the row checks see
    what the transform gives), hourly totals, revenue net of 1.00 per item."""
    order = parsed_order(record)
    if order is None:
        return None
    if order["qty"] == 1:
        return DROPPED
    if has_nul(order):
        return None
    return {**order, "minute": order["ts"].replace(minute=0, second=0, microsecond=0),
            "revenue": order["qty"] * (order["price"] - 1)}


def expected(config: PipelineConfig, messages: Iterable, reprocessed: Sequence[OffsetRange] = ()) -> Expected:
    """What the demo copy's tables must hold once each of these committed records
    (confluent_kafka messages) was committed once: by `prepare`, or by
    `prepare_with_returns` for those in the `reprocessed` ranges."""
    def row_of(record: Record) -> Row | None:
        return (order_row_with_returns if oracle.in_ranges(record, reprocessed) else order_row)(record)

    return oracle.expected(config, [Record.of(m) for m in messages], row_of)


def rows(db_url: str, schema: str = "demo", pipeline: str = "orders") -> Tables:
    """Every row of a demo copy's tables and dead letters, duplicates kept."""
    return oracle.actual(db_url, demo_config(pipeline, schema=schema))


def registered(db_url: str, pipeline: str = CONFIG.name) -> PipelineConfig:
    """The pipeline as its last run registered it: the demo's DAG publishes its deltas to
    Kafka, the tests' windows of the demo pipeline (tests/dags/window.py) do not."""
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        return load_config(registered_config(cur, pipeline))


def compare_with_the_oracle(db_url: str, servers: str, config: PipelineConfig = CONFIG,
                            reprocessed: Sequence[OffsetRange] = ()) -> tuple[Comparison, Tables]:
    """The demo copy's tables (and topics) against every committed record of its topic, and them."""
    [topic] = config.source.topics
    found = oracle.actual(db_url, config, servers)
    return oracle.compare(expected(config, committed_orders(servers, topic), reprocessed), found), found


def assert_tables_equal_the_oracle(db_url: str, servers: str, reprocessed: Sequence[OffsetRange] = ()) -> Tables:
    """The demo's tables, once they and the topic it publishes to, if its runs did, equal what
    the topic's committed records say (those of the `reprocessed` ranges by the demo's later
    transform)."""
    config = registered(db_url)
    comparison, found = compare_with_the_oracle(db_url, servers, config, reprocessed=reprocessed)
    assert comparison.exact, str(comparison)
    return {name: held for name, held in found.items() if name not in {s.name for s in kafka_sinks(config)}}


def assert_each_run_took_its_interval(db_url: str, servers: str, runs: list[dict]) -> dict[str, int]:
    """Each DAG run's checkpoint (runs as Airflow's REST API lists them) read exactly the
    committed records Kafka stamped inside the run's data interval, and none is empty;
    the records per run."""
    stamps = [m.timestamp()[1] for m in committed_orders(servers)]
    read = {run_id: records for _, run_id, _, records in checkpoints(db_url)}
    found = {}
    for run in runs:
        start, end = (int(datetime.fromisoformat(run[f"data_interval_{edge}"]).timestamp() * 1000)
                      for edge in ("start", "end"))
        stamped = sum(start <= stamp < end for stamp in stamps)
        found[run["dag_run_id"]] = read.get(run["dag_run_id"])
        assert stamped > 0 and found[run["dag_run_id"]] == stamped, (
            f"{run['dag_run_id']} ({run['data_interval_start']} → {run['data_interval_end']}): "
            f"read {found[run['dag_run_id']]} records, {stamped} are stamped in its interval")
    return found
