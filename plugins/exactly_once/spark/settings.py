"""What a Spark job of the pipeline needs to reach its services, handed over by the task that
submits it: the pipeline database (a libpq URI), the Kafka client config and the schema
registry (when the pipeline's formats read one), all read from the task's Airflow
connections. They hold credentials, so they travel in a file only the task's user can read,
named on the job's command line, removed by the job once read and by the task when the job
ends (whichever comes first; a task and job both killed before the job read it leave it
behind, readable by their user only) — never on a command line or in an environment
variable, which `ps` and Spark's UI show. PEM files travel inline in it
(`KafkaClient.portable`, `SchemaRegistry.portable`), and the job's processes get the task's
environment without the variables that could hold the same secrets (`job_environment`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from exactly_once.kafka_client import KafkaClient
from exactly_once.schema_registry import SchemaRegistry


@dataclass(frozen=True)
class JobSettings:
    db_url: str = field(repr=False)
    kafka: KafkaClient
    schema_registry: SchemaRegistry | None = None

    @contextmanager
    def written(self) -> Iterator[Path]:
        """A private file of these settings, removed on exit."""
        descriptor, name = tempfile.mkstemp(prefix="exactly_once-job-", suffix=".json")  # mode 0600
        try:
            with os.fdopen(descriptor, "w") as file:
                json.dump({"db_url": self.db_url, "kafka_connection": self.kafka.connection,
                           "kafka": dict(self.kafka.portable().config),
                           "schema_registry": self.schema_registry and self.schema_registry.portable().as_dict()},
                          file)
            yield Path(name)
        finally:
            Path(name).unlink(missing_ok=True)

    @classmethod
    def take(cls, path: Path) -> JobSettings:
        """The settings of the file, which is removed."""
        found = json.loads(path.read_text())
        path.unlink(missing_ok=True)
        registry = found.get("schema_registry")
        return cls(found["db_url"], KafkaClient(found["kafka_connection"], found["kafka"]),
                   SchemaRegistry.of_dict(registry) if registry else None)

    def job_environment(self, environment: Mapping[str, str]) -> dict[str, str]:
        """The environment for the job's processes: the task's, less Airflow's variables (the job
        reads none, and AIRFLOW_CONN_* hold the very connections this file carries) and less any
        variable whose value holds one of these settings' secrets (e.g. a database URL with the
        password, which a local setup may export)."""
        registry = self.schema_registry.portable().secrets() if self.schema_registry else []
        secrets = [s for s in (unquote(urlsplit(self.db_url).password or ""), *self.kafka.portable().secrets(),
                               *registry) if s]
        return {name: value for name, value in environment.items()
                if not name.lstrip("_").startswith("AIRFLOW") and not any(s in value for s in secrets)}
