"""Transforms named in the test pipelines' configuration ("module:function")."""

import os
import tempfile
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

PRICED = Path(tempfile.gettempdir()) / "exactly_once_priced"  # counts_what_it_prices's notes, a folder a topic


def measures(rows: DataFrame) -> DataFrame:
    """The harness pipeline's aggregate measures, each folded from `n`."""
    return rows.withColumns({"total": F.col("n"), "smallest": F.col("n"), "largest": F.col("n")})


def measures_v2(rows: DataFrame) -> DataFrame:
    """A fixed `measures` (tests/ledger/test_reprocess.py): a new configuration version."""
    return measures(rows)


def refuses_one_order(rows: DataFrame) -> DataFrame:
    """The poison pipeline's transform: a Python UDF that raises on the order with id
    'raises' (a transform failing on one record), and the aggregate's `quantity`."""

    @F.udf("string")
    def priced(order_id: str) -> str:
        if order_id == "raises":
            raise ValueError(f"cannot price order {order_id}")
        return order_id

    return rows.withColumns({"id": priced("id"), "quantity": F.col("qty")})


def counts_what_it_prices(rows: DataFrame) -> DataFrame:
    """refuses_one_order, noting each order it prices, before it raises, in a file of its Python
    worker's under PRICED/<the record's topic>: how many times the transform ran on each record."""

    @F.udf("string")
    def priced(order_id: str, topic: str) -> str:
        folder = PRICED / topic
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / str(os.getpid()), "a") as noted:
            noted.write(order_id + "\n")
        if order_id == "raises":
            raise ValueError(f"cannot price order {order_id}")
        return order_id

    return rows.withColumns({"id": priced("id", "kafka_topic"), "quantity": F.col("qty")})


def nulls_the_sku_of_keyless(rows: DataFrame) -> DataFrame:
    """The poison pipeline's transform, and the order with id 'keyless' loses its sku: a null
    key for the upsert sink."""
    return refuses_one_order(rows).withColumn("sku", F.when(F.col("id") != "keyless", F.col("sku")))


def raises_in_a_column_no_sink_takes(rows: DataFrame) -> DataFrame:
    """refuses_one_order, and `audit`, which no sink table has: a Python UDF that raises on
    the order with id 'unread'."""

    @F.udf("string")
    def audited(order_id: str) -> str:
        if order_id == "unread":
            raise ValueError(f"cannot audit order {order_id}")
        return order_id

    return refuses_one_order(rows).withColumn("audit", audited("id"))


def raises_on_every_order(rows: DataFrame) -> DataFrame:
    """A Python UDF that raises on every order: the cause is not in the records."""

    @F.udf("string")
    def priced(order_id: str) -> str:
        raise ValueError(f"no prices today (order {order_id})")

    return rows.withColumns({"id": priced("id"), "quantity": F.col("qty")})


def header_source(rows: DataFrame) -> DataFrame:
    """The Avro pipeline's transform (tests/spark/avro_orders.py): `source`, the text of the
    record's `source` header (null without one), read from the headers column."""
    source = F.filter("kafka_headers", lambda header: header["key"] == "source")
    return rows.withColumn("source", F.get(source, 0)["value"].cast("string"))


def twins_one_order(rows: DataFrame) -> DataFrame:
    """Two rows of the order with id 'twin', the second's sku too long for the poison
    pipeline's upsert table; one row of every other order; and the aggregate's `quantity`.
    Column expressions only: a Spark Connect server runs it without this module."""
    skus = F.when(F.col("id") == "twin", F.array("sku", F.lit("a-very-long-sku"))).otherwise(F.array("sku"))
    return rows.withColumns({"sku": F.explode(skus), "quantity": F.col("qty")})


def quantity(rows: DataFrame) -> DataFrame:
    """The aggregate's `quantity`, in column expressions only (see twins_one_order)."""
    return rows.withColumn("quantity", F.col("qty"))
