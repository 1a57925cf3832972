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
import re
import shutil
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
    spark_remote: str | None = field(default=None, repr=False)  # a Spark Connect URL, which may hold a token

    @contextmanager
    def written(self) -> Iterator[Path]:
        """A private file of these settings, removed on exit."""
        with private_file("exactly_once-job-") as path:
            path.write_text(json.dumps({
                "db_url": self.db_url, "kafka_connection": self.kafka.connection,
                "kafka": dict(self.kafka.portable().config),
                "schema_registry": self.schema_registry and self.schema_registry.portable().as_dict(),
                "spark_remote": self.spark_remote}))
            yield path

    @classmethod
    def take(cls, path: Path) -> JobSettings:
        """The settings of the file, which is removed."""
        found = json.loads(path.read_text())
        path.unlink(missing_ok=True)
        registry = found.get("schema_registry")
        return cls(found["db_url"], KafkaClient(found["kafka_connection"], found["kafka"]),
                   SchemaRegistry.of_dict(registry) if registry else None, found.get("spark_remote"))

    def job_environment(self, environment: Mapping[str, str]) -> dict[str, str]:
        """The environment for the job's processes: the task's, less Airflow's variables (the job
        reads none, and AIRFLOW_CONN_* hold the tasks' own connections), less libpq's password
        variables, less any variable whose value holds one of these settings' secrets or a URL
        with a password in it (e.g. another role's database URL, which a local setup may
        export): code of the job finds no credential but the job's own."""
        registry = self.schema_registry.portable().secrets() if self.schema_registry else []
        secrets = [s for s in (unquote(urlsplit(self.db_url).password or ""), *self.kafka.portable().secrets(),
                               *registry, self.spark_remote) if s]
        return {name: value for name, value in environment.items()
                if not name.lstrip("_").startswith("AIRFLOW") and name not in LIBPQ_SECRETS
                and not URL_WITH_PASSWORD.search(value) and not any(s in value for s in secrets)}


# libpq's variables that give a password (a password file may hold every role's).
LIBPQ_SECRETS = frozenset({"PGPASSWORD", "PGPASSFILE", "PGSERVICEFILE"})
# A URL with a password, or a connection string's or URL query's password.
URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]*:[^/@\s]*@|(?:^|[\s?&;])password=", re.I)


@contextmanager
def private_file(prefix: str) -> Iterator[Path]:
    """An empty file only this user can read (mkstemp creates it with mode 0600), removed on exit."""
    descriptor, name = tempfile.mkstemp(prefix=prefix, suffix=".json")
    os.close(descriptor)
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


@contextmanager
def private_directory(prefix: str) -> Iterator[Path]:
    """An empty directory only this user can enter (mkdtemp makes it 0700), removed on exit:
    the job's working directory, so that what it may read there is its own."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
