"""What a pipeline run reads and writes, named as OpenLineage names datasets (its naming
spec): a Kafka topic is `kafka://{first bootstrap host:port}` / `{topic}`; a PostgreSQL table
is `postgres://{host}:{port}` / `{database}.{schema}.{table}`. The outputs are the sinks' final
tables and the ledger's dead letters, which the commit fills in the same transaction. Pure:
IncrementOperator turns these into its OpenLineage facets.
"""

from __future__ import annotations

from dataclasses import dataclass

from exactly_once.config import PipelineConfig
from exactly_once.ledger.tables import LEDGER_SCHEMA


@dataclass(frozen=True)
class DatasetName:
    namespace: str
    name: str


def inputs(config: PipelineConfig, bootstrap_servers: str) -> list[DatasetName]:
    first = bootstrap_servers.split(",")[0].strip()
    return [DatasetName(f"kafka://{first}", topic) for topic in config.source.topics]


def outputs(config: PipelineConfig, host: str, port: int, database: str) -> list[DatasetName]:
    namespace = f"postgres://{host}:{port}"
    tables = [".".join(sink.schema_and_table) for sink in config.sinks] + [f"{LEDGER_SCHEMA}.dead_letters"]
    return [DatasetName(namespace, f"{database}.{table}") for table in tables]
