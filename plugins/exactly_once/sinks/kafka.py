"""kafka: the sink's rows are published to a Kafka topic, exactly once. Kafka cannot take
part in PostgreSQL's commit, so the commit decides alone: it promotes the staged rows into
the ledger's outbox (exactly_once.outbox), and the publisher (exactly_once.publishing)
moves committed outbox rows to the sink's `topic` in Kafka transactions.

The sink's table gives the published records their columns and types (what the row checks
hold values to); it is never written. Each row is one record: its key is the `keys`
columns' values, its value the row as a JSON object. With `measures` the rows are a
checkpoint's per-key folds, as an aggregate sink stages them (deltas a consumer adds up);
without, one row per Kafka record read, in the records' order.
"""

from __future__ import annotations

from psycopg2 import sql

from exactly_once.kafka_columns import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TOPIC
from exactly_once.sinks import require_columns
from exactly_once.sinks.aggregate import MODE as AGGREGATE
from exactly_once.sinks.append import MODE as APPEND
from exactly_once.sqlfiles import named

COORDINATES = (KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET)


class Kafka:
    def check(self, sink) -> None:
        if sink.topic is None:
            raise ValueError("kafka sinks need the topic they publish to")
        if not sink.keys:
            raise ValueError("kafka sinks need keys: the columns of each record's key")

    def unique_columns(self, sink) -> frozenset[str]:
        return frozenset()  # its table is never written: nothing to merge on

    def required_columns(self, sink) -> frozenset[str]:
        return frozenset((*sink.keys, *(sink.measures or COORDINATES)))

    def record_columns(self, sink, columns) -> list[str]:
        return AGGREGATE.record_columns(sink, columns) if sink.measures else columns

    def contribution_columns(self, sink, columns) -> None:
        return None

    def staging_rows(self, rows, sink, columns):
        if sink.measures:
            return AGGREGATE.staging_rows(rows, sink, columns)
        require_columns(rows, sink, columns)
        return rows.select(*columns)

    def rows_in_tasks(self, rows, sink, columns):
        # its measures' rows are folded in Spark only: its commit publishes each staged row
        return None if sink.measures else APPEND.rows_in_tasks(rows, sink, columns)

    def promote(self, sink, tables) -> sql.Composed:
        # The sink's own names are bound into its statement, like its tables.
        def of_staging(columns):
            return sql.SQL(", ").join(sql.Identifier("s", c) for c in columns)

        return sql.SQL(named("merge/kafka.sql")["promote"]).format(
            pipeline=sql.Literal(tables.pipeline), sink=sql.Literal(sink.name), staging=tables.staging,
            order=of_staging(sink.keys if sink.measures else COORDINATES), keys=of_staging(sink.keys))

    def replace(self, sink, tables) -> tuple[sql.Composed, sql.Composed]:
        return sql.SQL(named("merge/kafka.sql")["forget"]), self.promote(sink, tables)


MODE = Kafka()
