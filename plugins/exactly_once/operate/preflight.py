"""The preflight: what is wrong with a pipeline that can be known before Spark starts, every
problem at once, each naming the field, topic, table or column at fault (and, for a table,
the DDL that fixes it).

- the transform imports and is a function;
- every topic exists and each of its partitions answers its offsets;
- every sink's final table exists, has the columns its mode needs and the unique index it
  merges on, and takes the values whose Spark type is known without running the transform —
  the library's columns; without a transform, the value's fields — at their types:
  PostgreSQL itself is asked whether each column takes what Spark's JDBC writer binds
  (sql/preflight.sql), which is what the COPY staging writer writes. A transform's own
  columns are asked the same by the job, before it writes them (spark/staging.py).

The configuration is checked when it loads (`exactly_once.config`), the connections by
`exactly_once.connections.connection_problems`; whether the brokers accept the Kafka login
here, on the first question asked of them. `python -m exactly_once check` reports it
all; the first task of every run calls `require`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from confluent_kafka import KafkaException
from psycopg2 import errorcodes

from exactly_once import ddl
from exactly_once.catalog import ColumnType, column_types, refuses_type
from exactly_once.config import PipelineConfig, Sink
from exactly_once.errors import ConfigError
from exactly_once.ledger.kafka_offsets import UNANSWERED, KafkaOffsets, KafkaRefused
from exactly_once.ledger.registration import order_problems, structure_problems, table_subject, unique_column_sets
from exactly_once.ledger.tables import final_table
from exactly_once.ledger.transactions import Transactions
from exactly_once.ledger.versions import config_version
from exactly_once.problems import PreflightFailed, Problem
from exactly_once.spark.transforms import find_transform
from exactly_once.sqlfiles import named

Q = named("preflight.sql")
Transaction = Callable[[], AbstractContextManager]  # a cursor in a transaction of the pipeline database


def check(config: PipelineConfig, kafka: KafkaOffsets | None, connect: Callable[[], object] | None
          ) -> list[Problem]:
    """Every problem of the pipeline's transform, topics (given Kafka) and tables (given the
    pipeline database); none when it may run."""
    transaction = None if connect is None else Transactions(connect).transaction
    return [*transform_problems(config), *_source_and_sink_problems(config, kafka, transaction)]


def require(config: PipelineConfig, kafka: KafkaOffsets, transaction: Transaction) -> bool:
    """The first task's check, before planning; PreflightFailed listing every problem. Topics
    and tables are checked on every run (metadata and catalog queries, beside what planning
    reads anyway); the transform's import once per configuration version, which the ledger
    remembers (a version is the configuration and the transform module's source). Returns
    whether it imported the transform. `transaction` gives a cursor in a transaction of the
    pipeline database (`Ledger.transactions.transaction`: while the plan keeps connections,
    on one of them)."""
    version = {"pipeline": config.name, "version": config_version(config)}
    with transaction() as cur:
        cur.execute(Q["passed"], version)
        imported_before = cur.fetchone() is not None
    transform = [] if imported_before else transform_problems(config)
    problems = [*transform, *_source_and_sink_problems(config, kafka, transaction)]
    if problems:
        raise PreflightFailed(config.name, problems)
    if not imported_before:
        with transaction() as cur:
            cur.execute(Q["record_pass"], version)
    return not imported_before


def _source_and_sink_problems(config: PipelineConfig, kafka: KafkaOffsets | None,
                              transaction: Transaction | None) -> list[Problem]:
    problems = [] if kafka is None else topic_problems(config, kafka)
    if transaction is not None:
        with transaction() as cur:
            for sink in config.sinks:
                problems += table_problems(cur, config, sink)
            problems += order_problems(cur, config)
    return problems


def transform_problems(config: PipelineConfig) -> list[Problem]:
    if config.transform is None:
        return []
    try:
        find_transform(config.transform)
    except ConfigError as error:
        return [Problem(f"transform {config.transform!r}", str(error))]
    return []


def topic_problems(config: PipelineConfig, kafka: KafkaOffsets) -> list[Problem]:
    problems = []
    for topic in config.source.topics:
        subject = f"source.topics: {topic!r}"
        try:
            partitions = kafka.partitions(topic)
        except LookupError as missing:
            problems.append(Problem(subject, str(missing)))
            continue
        except KafkaRefused as refused:  # a wrong password or certificate: no retry fixes it
            return [*problems, Problem(f"connection {refused.connection!r}", refused.said)]
        except KafkaException as error:  # no broker answers: the other topics would say the same
            return [*problems, Problem("Kafka", f"no answer about topic {topic!r}: {error.args[0]}", passing=True)]
        try:
            kafka.topic_offsets(topic, None, None)  # every partition's at once: over 512, 0.56 s less than one by one
        except LookupError as missing:  # deleted since its partitions were listed
            problems.append(Problem(subject, str(missing)))
        except KafkaException as error:
            if error.args[0].code() in UNANSWERED:  # no broker answers: asking each partition would wait as long
                return [*problems, Problem("Kafka", f"no answer about topic {topic!r}: {error.args[0]}",
                                           passing=True)]
            problems += unreadable_partitions(subject, topic, partitions, kafka)  # e.g. one without a leader
    return problems


def unreadable_partitions(subject: str, topic: str, partitions: list[int], kafka: KafkaOffsets) -> list[Problem]:
    """The partitions whose offsets cannot be read, asked one by one to name them."""
    problems = []
    for partition in partitions:
        try:
            kafka.offsets(topic, partition, None, None)
        except KafkaException as error:
            problems.append(Problem(f"{subject} partition {partition}", "its offsets cannot be read: "
                                                                          f"{error.args[0]}", passing=True))
    return problems


def table_problems(cur, config: PipelineConfig, sink: Sink) -> list[Problem]:
    columns = column_types(cur, final_table(sink))
    problems = structure_problems(config, sink, columns, unique_column_sets(cur, sink))
    if not columns:
        return problems
    subject = table_subject(sink)
    if config.transform is None:
        known = ddl.known_types(config)
        problems += [Problem(f"{subject}: column {c}", "takes its value from no field of source.key_schema or "
                                                       "source.value_schema and is none of the library's "
                                                       f"{sorted(ddl.LIBRARY_COLUMNS)}")
                     for c in sink.strategy.record_columns(sink, [c.name for c in columns]) if c not in known]
    return problems + list(_type_problems(cur, config, sink, columns))


def _type_problems(cur, config: PipelineConfig, sink: Sink, columns: list[ColumnType]) -> Iterator[Problem]:
    """Kafka's partitions and offsets must fit their columns; a column whose values' Spark type
    is known must take them (PostgreSQL answers, without inserting anything)."""
    written = _written_types(config, sink)
    for column in columns:
        where = f"{table_subject(sink)}: column {column.name}"
        if column.name in ddl.HOLDS_KAFKA and column.base not in ddl.HOLDS_KAFKA[column.name]:
            yield Problem(where, f"is {column.type}, which cannot hold every Kafka value it gets "
                                 f"(Spark {ddl.LIBRARY_COLUMNS[column.name]})",
                          ddl.alter_type(sink, column.name, ddl.LIBRARY_COLUMNS[column.name]))
            continue
        spark_type = written.get(column.name)
        bound = ddl.bound_type(spark_type) if spark_type else None
        if bound is None:
            continue
        refused = refuses_type(cur, final_table(sink), column.name, bound)
        if refused is None:
            continue
        said = refused.diag.message_primary
        if refused.pgcode == errorcodes.DATATYPE_MISMATCH:
            yield Problem(where, f"is {column.type} and gets Spark {spark_type} values: PostgreSQL says "
                                 f"{said!r}", ddl.alter_type(sink, column.name, spark_type))
        else:  # e.g. no INSERT privilege, a generated column: PostgreSQL's words say it
            yield Problem(where, f"cannot take the sink's values: PostgreSQL says {said!r}")


def _written_types(config: PipelineConfig, sink: Sink) -> dict[str, str]:
    """The Spark types of the values a sink writes into its final columns, where known."""
    known = ddl.known_types(config)
    if not sink.measures:
        return known
    folded = {"sum": ddl.summed, "min": str, "max": str}
    return {**{k: known[k] for k in sink.keys if k in known},
            **{m: "bigint" if how == "count" else folded[how](known[m])
               for m, how in sink.measures.items() if how == "count" or m in known}}
