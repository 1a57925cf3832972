"""What an attempt's staging write asks of the pipeline database before it writes: the sinks
whose staged rows are promoted on trial, and whether each staging table takes the Spark types
of the rows written to it (exactly_once.spark.staging)."""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import DataFrame

from exactly_once import ddl
from exactly_once.catalog import refuses_type
from exactly_once.config import PipelineConfig, Sink
from exactly_once.errors import ConfigError
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.rows import LedgerRows
from exactly_once.ledger.tables import staging_table


def promoted_on_trial(rows: LedgerRows, config: PipelineConfig, checkpoint_id: int) -> list[Sink]:
    """The sinks whose final tables can refuse rows that pass the row checks (a CHECK, foreign
    key or exclusion constraint, a trigger, or a unique index besides the one the merge
    conflicts on), and the sinks their foreign keys reference, whose new rows the keys must
    see; every sink once a commit of these ranges was refused (an aggregate's sum beyond its
    column, say)."""
    if rows.refused_at_commit(checkpoint_id):  # a table refused what no trial had tried
        return list(config.sinks)
    refusing = [sink for sink in config.sinks if rows.may_refuse(sink)]
    return [sink for sink in config.sinks
            if sink in refusing or any(rows.references(other, sink) for other in refusing if other != sink)]


def require_staged_types(ledger: Ledger, typed: set[str], staging: Mapping[str, DataFrame]) -> None:
    """`require_staged_type` of each table (by sink, or the dead letters) not in `typed`, the
    tables found to take their frames' types, which it adds; every table before any row is written."""
    with ledger.rows() as rows:
        for name, frame in staging.items():
            if name not in typed:
                require_staged_type(rows, ledger.config, name, frame)
                typed.add(name)


def require_staged_type(rows: LedgerRows, config: PipelineConfig, name: str, frame: DataFrame) -> None:
    """Each column of the sink's (or the dead letters') staging table takes the values of the
    frame's Spark type as Spark's JDBC writer bound them (an assignment cast exists: PostgreSQL
    answers, without inserting anything), as the COPY writer writes what such a cast makes of
    them; else no record is at fault, and the pipeline's configuration is (`ConfigError`)."""
    table = staging_table(config, name)
    for field in frame.schema.fields:
        spark_type = field.dataType.simpleString()
        if spark_type == "void":  # only nulls, which every nullable column takes
            continue
        try:
            bound = ddl.bound_type(spark_type)
        except ValueError:  # a type the configuration's types do not name (interval, variant)
            bound = None
        if bound is None:
            raise ConfigError(f"sink {name}: column {field.name}: Spark {spark_type} values cannot be staged")
        refused = refuses_type(rows.cur, table, field.name, bound)
        if refused is not None:
            raise ConfigError(f"sink {name}: column {field.name} gets Spark {spark_type} values: "
                              f"PostgreSQL says {refused.diag.message_primary!r}")
