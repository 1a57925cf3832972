"""What a Spark job of the pipeline needs to reach its services, handed over by the task that
submits it: the pipeline database (a libpq URI) and the Kafka client config, both read from
the task's Airflow connections. They hold credentials, so they travel in a file only the
task's user can read, named on the job's command line, removed by the job once read and by
the task when the job ends (whichever comes first; a task and job both killed before the job
read it leave it behind, readable by their user only) — never on a command line or in an
environment variable, which `ps` and Spark's UI show.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from exactly_once.kafka_client import KafkaClient


@dataclass(frozen=True)
class JobSettings:
    db_url: str = field(repr=False)
    kafka: KafkaClient

    @contextmanager
    def written(self) -> Iterator[Path]:
        """A private file of these settings, removed on exit."""
        descriptor, name = tempfile.mkstemp(prefix="exactly_once-job-", suffix=".json")  # mode 0600
        try:
            with os.fdopen(descriptor, "w") as file:
                json.dump({"db_url": self.db_url, "kafka_connection": self.kafka.connection,
                           "kafka": dict(self.kafka.config)}, file)
            yield Path(name)
        finally:
            Path(name).unlink(missing_ok=True)

    @classmethod
    def take(cls, path: Path) -> JobSettings:
        """The settings of the file, which is removed."""
        found = json.loads(path.read_text())
        path.unlink(missing_ok=True)
        return cls(found["db_url"], KafkaClient(found["kafka_connection"], found["kafka"]))
