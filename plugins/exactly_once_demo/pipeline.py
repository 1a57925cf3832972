"""The demo pipeline `orders`: its configuration and its transform. The DAG that runs it
is `orders_exactly_once` (dag.py); its tables are in tables.sql."""

from __future__ import annotations

from exactly_once.config import PipelineConfig, load_config

TOPIC = "orders"
PARTITIONS = 3  # when produce.py creates the topic; readers ask the broker
DELTAS_TOPIC = "sku_minute_deltas"  # the demo's Kafka output


def config(name: str = "orders", topic: str = TOPIC, schema: str = "demo", deltas_topic: str | None = None,
           **options) -> PipelineConfig:
    """The demo pipeline; tests run copies of it on a topic and tables of their own. With
    `deltas_topic`, each checkpoint's contribution to sku_minute_totals is published there too
    (a kafka sink: docs/guide/kafka-output.md)."""
    deltas = {"name": "sku_minute_deltas", "table": f"{schema}.sku_minute_deltas", "mode": "kafka",
              "topic": deltas_topic, "keys": ["minute", "sku"],
              "measures": {"orders": "count", "qty": "sum", "revenue": "sum"}, "on_reprocess": "republish"}
    return load_config({
        "name": name,
        "source": {"topics": [topic], "value_schema": {
            "order_id": "string", "sku": "string", "qty": "int", "price": "decimal(12,2)", "ts": "timestamp"}},
        "transform": "exactly_once_demo.pipeline:prepare",
        "sinks": [
            {"name": "orders", "table": f"{schema}.orders", "mode": "append"},
            {"name": "sku_minute_totals", "table": f"{schema}.sku_minute_totals", "mode": "aggregate",
             "keys": ["minute", "sku"], "measures": {"orders": "count", "qty": "sum", "revenue": "sum"}},
            {"name": "sku_last_price", "table": f"{schema}.sku_last_price", "mode": "upsert", "keys": ["sku"]},
            *([deltas] if deltas_topic else []),
        ],
        **options,
    })


CONFIG = config(deltas_topic=DELTAS_TOPIC)


def prepare(rows):
    """Adds what the aggregate sink folds: the order's minute and revenue."""
    from pyspark.sql import functions as F

    return rows.withColumns({"minute": F.date_trunc("minute", "ts"), "revenue": F.col("qty") * F.col("price")})


def prepare_with_returns(rows):
    """A later version of `prepare`, to show reprocessing (README, "Reprocess a committed
    interval"): orders of a single item are returns and left out, revenue is net of a 1.00
    fee per item, and the totals are per hour (the aggregate's "minute" key becomes the hour)."""
    from pyspark.sql import functions as F

    return rows.where(F.col("qty") > 1).withColumns({
        "minute": F.date_trunc("hour", "ts"), "revenue": F.col("qty") * (F.col("price") - F.lit(1))})


def prepare_with_udf(rows):
    """`prepare` with the revenue computed by a Python UDF (exactly_once_demo.udfs): the same
    rows, but executors must import the demo's package, which only the job's code archive
    brings them (README, "Spark beyond local[2]")."""
    from pyspark.sql import functions as F

    from exactly_once_demo.udfs import revenue

    return rows.withColumns({"minute": F.date_trunc("minute", "ts"), "revenue": revenue("qty", "price")})
