"""`python -m exactly_once new` on the local stack: what it writes passes the preflight once
the topic exists and its DDL has run; it never overwrites a file and refuses a name Python
already has."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from tests.operate.test_preflight import execute


def cli(*arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{cwd / 'plugins'}{os.pathsep}{os.environ['PYTHONPATH']}"}
    return subprocess.run([sys.executable, "-m", "exactly_once", *arguments], capture_output=True, text=True,
                          timeout=120, env=env, cwd=cwd)


def test_a_scaffolded_pipeline_passes_the_preflight_once_its_table_exists(ledger_db, topic, tmp_path):
    name = f"new_{uuid.uuid4().hex[:8]}"
    execute(ledger_db, f"CREATE SCHEMA {name}")
    new = cli("new", name, "--topic", topic, "--schema", "id:string,amount:decimal(12,2),at:timestamp",
              "--table", f"{name}.events", cwd=tmp_path)
    assert new.returncode == 0, new.stderr
    assert new.stdout.splitlines()[1:] == [f"  plugins/{name}/__init__.py", f"  plugins/{name}/pipeline.py",
                                           f"  plugins/{name}/tables.sql", f"  dags/{name}.py"]

    missing = cli("check", f"dags/{name}.py", cwd=tmp_path)
    assert missing.returncode == 1
    assert f'- sink {name!r}: table {name}.events: does not exist\n    fix: CREATE TABLE "{name}"."events" (\n' \
        in missing.stdout

    execute(ledger_db, (tmp_path / "plugins" / name / "tables.sql").read_text())
    ready = cli("check", f"dags/{name}.py", cwd=tmp_path)
    assert (ready.returncode, ready.stdout) == (0, f"pipeline {name!r}: ready\n"), ready.stderr

    again = cli("new", name, "--topic", topic, "--schema", "id:string", cwd=tmp_path)
    assert again.returncode == 1 and again.stderr.startswith(f"not overwriting plugins/{name}/__init__.py, ")
    taken = cli("new", "json", "--topic", topic, "--schema", "id:string", cwd=tmp_path)
    assert taken.returncode == 1 and "Python already has a module of that name" in taken.stderr


def test_an_avro_topic_is_scaffolded_from_its_registry_subject_and_passes_the_preflight(ledger_db, topic,
                                                                                      tmp_path):
    from confluent_kafka.schema_registry import Schema

    from tests.spark.avro_orders import READER, registry_client

    name, subject = f"new_{uuid.uuid4().hex[:8]}", f"{topic}-value"
    registry_client().register_schema(subject, Schema(json.dumps(READER), "AVRO"))
    execute(ledger_db, f"CREATE SCHEMA {name}")
    new = cli("new", name, "--topic", topic, "--value-format", "avro", "--subject", subject,
              "--table", f"{name}.orders", cwd=tmp_path)
    assert new.returncode == 0, new.stderr
    written = (tmp_path / "plugins" / name / "pipeline.py").read_text()
    assert "'value_format': 'avro'" in written and f"'value_reader_schema': {{'subject': '{subject}'" in written
    assert "'value_schema': {'id': 'string', 'n': 'bigint', 'note': 'string'}" in written

    execute(ledger_db, (tmp_path / "plugins" / name / "tables.sql").read_text())
    ready = cli("check", f"dags/{name}.py", cwd=tmp_path)
    assert (ready.returncode, ready.stdout) == (0, f"pipeline {name!r}: ready\n"), ready.stderr
    unknown = cli("new", f"{name}_x", "--topic", topic, "--value-format", "avro", "--subject", "no-such-subject",
                  cwd=tmp_path)
    assert unknown.returncode == 1
    assert unknown.stderr.startswith("--subject: the schema registry ('schema_registry_default') answers HTTP 404 "
                                     "for subject 'no-such-subject' version latest")


def test_a_protobuf_topic_is_scaffolded_from_its_subject_s_first_message_and_passes_the_preflight(ledger_db, topic,
                                                                                               tmp_path):
    from tests.spark.protobuf_orders import ORDER, proto, registered

    name, subject = f"new_{uuid.uuid4().hex[:8]}", f"{topic}-value"
    registered(subject, proto(f"message Order {{ {ORDER[3]} }} message Other {{ bool flag = 1; }}"))
    execute(ledger_db, f"CREATE SCHEMA {name}")
    new = cli("new", name, "--topic", topic, "--value-format", "protobuf", "--subject", subject,
              "--table", f"{name}.orders", cwd=tmp_path)
    assert new.returncode == 0, new.stderr
    written = (tmp_path / "plugins" / name / "pipeline.py").read_text()
    found: dict = {}
    exec(written, found)
    source = found["CONFIG"].source
    assert (source.value_format, source.value_reader_schema.subject, source.value_reader_schema.version) == \
        ("protobuf", subject, 1)
    assert source.value_schema == {"id": "string", "n": "int", "note": "string", "source": "string"}

    execute(ledger_db, (tmp_path / "plugins" / name / "tables.sql").read_text())
    ready = cli("check", f"dags/{name}.py", cwd=tmp_path)
    assert (ready.returncode, ready.stdout) == (0, f"pipeline {name!r}: ready\n"), ready.stderr
