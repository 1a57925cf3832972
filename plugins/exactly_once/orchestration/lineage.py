"""What a pipeline run reads and writes, named as OpenLineage names datasets (its naming
spec): a Kafka topic is `kafka://{first bootstrap host:port}` / `{topic}`; a PostgreSQL table
is `postgres://{host}:{port}` / `{database}.{schema}.{table}`. The outputs are the sinks' final
tables and the ledger's dead letters, which the commit fills in the same transaction, and a
kafka sink's topic, which its publisher fills from the commit's outbox. Pure:
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


def topic(name: str, bootstrap_servers: str) -> DatasetName:
    return DatasetName(f"kafka://{bootstrap_servers.split(',')[0].strip()}", name)


def inputs(config: PipelineConfig, bootstrap_servers: str) -> list[DatasetName]:
    return [topic(name, bootstrap_servers) for name in config.source.topics]


def postgres_namespace(host: str, port: int) -> str:
    return f"postgres://{host}:{port}"


def outputs(config: PipelineConfig, host: str, port: int, database: str, bootstrap_servers: str
            ) -> list[DatasetName]:
    namespace = postgres_namespace(host, port)
    tables = [".".join(sink.schema_and_table) for sink in config.sinks if sink.mode != "kafka"]
    topics = [topic(sink.topic, bootstrap_servers) for sink in config.sinks if sink.mode == "kafka"]
    return [DatasetName(namespace, f"{database}.{table}") for table in [*tables, f"{LEDGER_SCHEMA}.dead_letters"]] \
        + topics
