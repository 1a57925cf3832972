"""`python -m exactly_once new`: a first pipeline of one append sink, as three files to edit —
its configuration module (PLUGINS/NAME/pipeline.py), its DAG (DAGS/NAME.py, one checkpoint per
10-minute interval) and its final table's DDL (PLUGINS/NAME/tables.sql). They pass the
preflight once the topic exists and the DDL has run. The value's fields are given
(`--schema`), or read from a schema registry subject's Avro schema (`--value-format avro
--subject`), which becomes the pipeline's reader schema."""

from __future__ import annotations

import importlib.util
import keyword
import pprint
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.parse import quote

from exactly_once import ddl
from exactly_once.config import PipelineConfig, load_config
from exactly_once.errors import ConfigError
from exactly_once.formats._avro_types import record_fields

PIPELINE = '''\
"""The pipeline `{name}`: {value_format} records of the Kafka topic `{topic}`,
a row per record in the table `{table}`. Written by `python -m exactly_once new`;
the configuration reference is docs/configuration.md."""

from exactly_once.config import load_config

CONFIG = load_config({config})
'''

DAG = '''\
"""The DAG `{name}`: a checkpoint of the pipeline `{name}` per 10-minute interval.
A run takes the unclaimed offsets of its interval (per partition, from the first offset
stamped at or after its start to the first at or after its end) and every unclaimed
offset before it; a backfill run only its interval's."""

from datetime import timedelta

import pendulum
from airflow.sdk import DeltaDataIntervalTimetable, dag
from exactly_once.orchestration.checkpoint_tasks import checkpoint_tasks

from {name}.pipeline import CONFIG


# A data-interval timetable: each run has an interval [start, end) of its own. (A bare
# timedelta or cron string gives runs whose interval is a point in Airflow 3.)
@dag(dag_id="{name}", schedule=DeltaDataIntervalTimetable(timedelta(minutes=10)),
     start_date=pendulum.datetime({start.year}, {start.month}, {start.day}, tz="UTC"), catchup=False,
     max_active_runs=3, tags=["exactly-once"])
def {name}():
    checkpoint_tasks(CONFIG)


{name}()
'''


def parse_schema(text: str) -> dict[str, str]:
    """'field:type,...' as a value schema; commas inside a type (decimal(12,2), map<k,v>) stay
    with it. The types are checked when the configuration loads."""
    fields, depth, current = [], 0, ""
    for char in text:
        depth += (char in "(<") - (char in ")>")
        if char == "," and depth == 0:
            fields.append(current)
            current = ""
        else:
            current += char
    fields.append(current)
    schema = {}
    for field in fields:
        name, colon, spark_type = field.partition(":")
        if not colon or not name.strip() or not spark_type.strip():
            raise ConfigError(f"--schema: {field.strip()!r} is not 'field:type'")
        schema[name.strip()] = spark_type.strip()
    return schema


def registry_source(value_format: str, subject: str, version: str, connection: str) -> dict[str, Any]:
    """The source fields of a topic whose Avro or Protobuf values a registry subject describes:
    the subject's version (`latest` made its number) as the reader schema, its fields (Protobuf:
    its first message's) as the columns."""
    from exactly_once import connections
    from exactly_once.formats._protobuf_schemas import descriptor_set, first_message, message_columns, subject_path

    registry = connections.schema_registry(connection)
    try:
        if value_format == "avro":
            found = registry.get(f"/subjects/{quote(subject, safe='')}/versions/{version}")
            columns = record_fields(found["schema"])
        else:
            found = registry.get(subject_path(subject, version))
            serialized = descriptor_set(found, lambda s, v: registry.get(subject_path(s, v)))
            columns = message_columns(serialized, first_message(serialized))
    except HTTPError as refused:
        raise ConfigError(f"--subject: the schema registry ({connection!r}) answers HTTP {refused.code} for "
                          f"subject {subject!r} version {version}") from None
    except OSError as failed:
        raise ConfigError(f"--subject: the schema registry ({connection!r}) does not answer: {failed}") from None
    except ValueError as unreadable:
        raise ConfigError(f"--subject: {subject!r} version {version}: {unreadable}") from None
    return {"schema_registry": connection, "value_format": value_format,
            "value_reader_schema": {"subject": subject, "version": found["version"]}, "value_schema": columns}


def pipeline_config(name: str, topic: str, source: dict[str, Any], table: str | None) -> PipelineConfig:
    config = load_config({"name": name, "source": {"topics": [topic], **source},
                          "sinks": [{"name": name, "table": table or name, "mode": "append"}]})
    unwritable = {c: t for c, t in config.source.value_schema.items() if ddl.column_type(t) is None}
    if unwritable:
        raise ConfigError(f"--schema: the staging writer cannot write fields {unwritable} to a column; "
                          "flatten them in a transform (or store them as a JSON string)")
    return config


def scaffold(name: str, topic: str, source: dict[str, Any], table: str | None, dags: Path, plugins: Path
             ) -> list[Path]:
    """Writes the three files, none over an existing one; returns their paths. `source` holds
    the value's fields (`parse_schema`) and, for Avro and Protobuf, the rest of `registry_source`."""
    config = pipeline_config(name, topic, source, table)
    as_written = {"name": name, "source": {"topics": [topic], **source},
                  "sinks": [config.sinks[0].model_dump(include={"name", "table", "mode"})]}
    files = {
        plugins / name / "__init__.py": "",
        plugins / name / "pipeline.py": PIPELINE.format(name=name, topic=topic, table=config.sinks[0].table,
                                                        value_format=config.source.value_format.upper(),
                                                        config=pprint.pformat(as_written, sort_dicts=False)),
        plugins / name / "tables.sql": f"-- The final table of the pipeline `{name}`.\n"
                                       + ddl.create_table(config, config.sinks[0]) + "\n",
        dags / f"{name}.py": DAG.format(name=name, start=datetime.now(timezone.utc)),
    }
    existing = [str(path) for path in files if path.exists()]
    if existing:
        raise FileExistsError(f"not overwriting {', '.join(existing)}")
    if keyword.iskeyword(name) or importlib.util.find_spec(name) is not None:
        raise ConfigError(f"NAME {name!r} names the package of the pipeline's files, and Python already "
                          "has a module of that name: choose another")
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(files)
