"""The package as a user installs it, against the local stack: `./dev build` makes the wheel;
a fresh virtual environment outside the checkout gets the wheel and its dependencies
(constrained by the project's runtime lock: Airflow's published constraint files are on a
host this machine cannot reach); Airflow gets a home, a DAGs folder and an empty plugins
folder of its own, and nothing of the checkout on PYTHONPATH. There a pipeline scaffolded
by the installed command runs one checkpoint through `airflow dags test`: its table equals
what the topic's records say, to the row, a malformed record a dead letter. Airflow lists
the provider (its version, its connection type) and the plugin (from its entry point), and an
api-server of that environment serves the plugin's pipelines view and metrics endpoint. The
same on each Python the package allows (3.11, 3.12), from pyenv's interpreters where the
machine's own Python is another."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import uuid
from contextlib import closing
from pathlib import Path

import psycopg2
import pytest
import requests
from confluent_kafka import Producer

from exactly_once import __version__
from exactly_once.config import PipelineConfig
from exactly_once.ledger.tables import final_table
from exactly_once_demo.oracle import committed_orders
from exactly_once_stack import process
from exactly_once_stack.settings import COPY_WRITER_JAR, ROOT, SPARK_CONF_DIR, passwords, process_environment
from tests import oracle
from tests.benchmarks.copies import Q, execute, remove
from tests.kafka_records import create_topic
from tests.oracle import Record

pytestmark = pytest.mark.services

UV = ROOT / ".local" / "tools" / "bin" / "uv"
RECORDS = 120
# Beside the lock's pins: pyspark-client (the Spark provider's requirement) installs into
# pyspark's own package, so it must be the same version as pyspark (docs/install.md).
PYSPARK = re.search(r"^pyspark==(\S+)$", (ROOT / "requirements.lock").read_text(), re.MULTILINE).group(1)


def python(version: str) -> str:
    """An interpreter of that version: on PATH, or one of pyenv's."""
    for candidate in [f"/usr/bin/python{version}", *sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))]:
        if Path(candidate).is_file():
            return str(candidate)
    raise RuntimeError(f"no Python {version} here (/usr/bin/python{version} or ~/.pyenv/versions/{version}.*)")


@pytest.fixture(scope="module")
def wheel() -> Path:
    built = subprocess.run([str(ROOT / "dev"), "build"], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [found] = (ROOT / "dist").glob(f"airflow_provider_exactly_once-{__version__}-py3-none-any.whl")
    return found


def installed(wheel: Path, folder: Path, version: str) -> Path:
    """A fresh virtual environment in `folder` with the wheel installed; its bin/ folder.
    Compiled to bytecode, as pip's install compiles it (uv's does not by default). uv's cache
    is the folder's own and removed after: pyspark is a source distribution, and each build
    kept in the machine's cache (~2 GB a run) would fill the disk of a machine that runs the
    suite often."""
    venv = folder / "venv"
    cache = folder / "uv-cache"
    constraints = folder / "constraints.txt"
    constraints.write_text((ROOT / "requirements.lock").read_text() + f"pyspark-client=={PYSPARK}\n")
    try:
        for command in ([str(UV), "venv", "-q", "--python", python(version), str(venv)],
                        [str(UV), "pip", "install", "-q", "--compile-bytecode", "--python",
                         str(venv / "bin" / "python"), str(wheel), "--constraint", str(constraints),
                         "--cache-dir", str(cache)]):
            run = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=folder)
            assert run.returncode == 0, f"{command}: {run.stdout[-3000:]}{run.stderr[-3000:]}"
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return venv / "bin"


def user_environment(bin_dir: Path, folder: Path) -> dict[str, str]:
    """The stack's endpoints and connections, with Airflow's folders and Spark's configuration
    of the user's own, the environment's bin/ first on PATH, and no PYTHONPATH at all."""
    env = {k: v for k, v in process_environment().items() if k != "PYTHONPATH"}
    env["PATH"] = os.pathsep.join([str(bin_dir), *(p for p in env["PATH"].split(os.pathsep)
                                                   if not p.startswith(str(ROOT)))])
    jar = subprocess.run([str(bin_dir / "python"), "-m", "exactly_once", "jar"], capture_output=True, text=True,
                         env=env, cwd=folder, check=True).stdout.strip()
    assert jar.startswith(str(bin_dir.parent)), jar  # the wheel's jar, not the checkout's
    spark_conf = folder / "spark-conf"
    spark_conf.mkdir()
    defaults = (SPARK_CONF_DIR / "spark-defaults.conf").read_text()
    assert str(COPY_WRITER_JAR) in defaults  # the checkout's jar, replaced by the wheel's
    (spark_conf / "spark-defaults.conf").write_text(defaults.replace(str(COPY_WRITER_JAR), jar))
    for name in ("airflow-home", "dags", "plugins"):
        (folder / name).mkdir()
    return {**env, "SPARK_CONF_DIR": str(spark_conf), "PYSPARK_PYTHON": str(bin_dir / "python"),
            "AIRFLOW_HOME": str(folder / "airflow-home"), "AIRFLOW__CORE__DAGS_FOLDER": str(folder / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(folder / "plugins")}


def produce(servers: str, topic: str) -> None:
    """RECORDS JSON orders, and one value that is not JSON."""
    producer = Producer({"bootstrap.servers": servers})
    for i in range(RECORDS):
        producer.produce(topic, key=f"c{i % 5}", value=json.dumps({"order_id": f"o{i}", "amount": i}))
    producer.produce(topic, key="c0", value=b"\xffnot json")
    producer.flush()


def row_of(record: Record) -> dict | None:
    try:
        value = json.loads(record.value)
    except ValueError:
        return None
    return {"order_id": value["order_id"], "amount": value["amount"]}


def free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_wheel_holds_the_library_its_sql_and_the_jar_and_no_demo_or_test(wheel):
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert {"exactly_once/sql/ledger.sql", "exactly_once/sql/migrations/0001_ledger.sql",
            "exactly_once/jars/exactly-once-copy.jar", "exactly_once/orchestration/plugin.py"} <= set(names)
    assert not [n for n in names if n.startswith(("exactly_once_demo/", "tests/", "exactly_once_stack/"))]
    entry_points = zipfile.ZipFile(wheel).read(
        f"airflow_provider_exactly_once-{__version__}.dist-info/entry_points.txt").decode()
    assert "[airflow.plugins]\nexactly_once = exactly_once.orchestration.plugin:ExactlyOncePlugin" in entry_points
    assert "[apache_airflow_provider]\nprovider_info = exactly_once.orchestration.provider:get_provider_info" \
        in entry_points


# 3.12 is a variant (CI runs 3.11; `./dev install-test` and `./dev test -m variant` run both).
@pytest.mark.parametrize("version", ["3.11", pytest.param("3.12", marks=pytest.mark.variant)])
def test_installed_from_the_wheel_a_checkpoint_commits_exactly_and_the_plugin_serves(
        version, wheel, ledger_db, kafka_servers, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"user-py{version}")
    assert not folder.resolve().is_relative_to(ROOT)
    bin_dir = installed(wheel, folder, version)
    env = user_environment(bin_dir, folder)

    def run(*command: str, timeout: float = 600) -> str:
        done = subprocess.run(list(command), capture_output=True, text=True, env=env, cwd=folder, timeout=timeout)
        assert done.returncode == 0, f"{command}: {done.stdout[-4000:]}{done.stderr[-4000:]}"
        return done.stdout

    where, python_version = run(str(bin_dir / "python"), "-c", "import exactly_once, platform; "
                                "print(exactly_once.__file__); print(platform.python_version())").split()
    assert where.startswith(str(bin_dir.parent)) and python_version.startswith(f"{version}."), (where, python_version)

    name = f"installed_{uuid.uuid4().hex[:8]}"
    create_topic(kafka_servers, name, partitions=2)
    produce(kafka_servers, name)
    dags = folder / "dags"
    run(str(bin_dir / "python"), "-m", "exactly_once", "new", name, "--topic", name,
        "--schema", "order_id:string,amount:bigint", "--dags", str(dags), "--plugins", str(dags))
    with closing(psycopg2.connect(ledger_db)) as conn, conn, conn.cursor() as cur:
        cur.execute((dags / name / "tables.sql").read_text())
    found: dict = {}
    exec((dags / name / "pipeline.py").read_text(), found)
    config: PipelineConfig = found["CONFIG"]
    try:
        assert f"pipeline {name!r}: ready" in run(str(bin_dir / "python"), "-m", "exactly_once", "check",
                                                   str(dags / f"{name}.py"))
        run(str(bin_dir / "airflow"), "dags", "test", name, timeout=900)

        records = [Record.of(m) for m in committed_orders(kafka_servers, name)]
        assert len(records) == RECORDS + 1
        oracle.assert_exact(oracle.expected(config, records, row_of), oracle.actual(ledger_db, config))
        status = run(str(bin_dir / "python"), "-m", "exactly_once.operate.status", "--pipeline", name)
        assert f"({RECORDS + 1} records, interval end " in status and "open checkpoints: none" in status

        providers = json.loads(run(str(bin_dir / "airflow"), "providers", "get", "airflow-provider-exactly-once",
                                   "--output", "json"))
        assert providers == [{"Provider": "airflow-provider-exactly-once", "Version": __version__}]
        hooks = json.loads(run(str(bin_dir / "airflow"), "providers", "hooks", "--output", "json"))
        assert [h for h in hooks if h["package_name"] == "airflow-provider-exactly-once"] == [
            {"connection_type": "exactly_once_pipeline_db", "hook_name": "Exactly-once pipeline database",
             "class": "exactly_once.orchestration.pipeline_db_hook.PipelineDatabaseHook",
             "conn_id_attribute_name": "postgres_conn_id", "package_name": "airflow-provider-exactly-once"}]
        plugins = json.loads(run(str(bin_dir / "airflow"), "plugins", "--output", "json"))
        [plugin] = [p for p in plugins if p["name"] == "exactly_once"]
        assert plugin["source"] == (f"airflow-provider-exactly-once=={__version__}: EntryPoint(name='exactly_once', "
                                    "value='exactly_once.orchestration.plugin:ExactlyOncePlugin', group='airflow.plugins')")
        served(bin_dir, env, folder, name)
    finally:
        remove(kafka_servers, ledger_db, config, schemas=[])
        execute(ledger_db, Q["drop_table"], table=final_table(config.sinks[0]))


def served(bin_dir: Path, env: dict[str, str], folder: Path, pipeline: str) -> None:
    """The environment's own api-server: the installed plugin's metrics endpoint (the scrapers'
    token) and pipelines view (an Airflow login) show the pipeline's committed checkpoint."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server_env = {**env, "AIRFLOW__API__PORT": str(port), "AIRFLOW__API__BASE_URL": base}
    log = folder / "api-server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([str(bin_dir / "airflow"), "api-server", "--port", str(port)], env=server_env,
                                  cwd=folder, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def answers() -> bool:
            try:
                return requests.get(f"{base}/api/v2/monitor/health", timeout=2).status_code == 200
            except (requests.ConnectionError, requests.Timeout):
                return False

        process.wait_until(answers, 180, "the installed environment's api-server", log)
        metrics = requests.get(f"{base}/exactly-once/metrics", params={"pipeline": pipeline}, timeout=60,
                               headers={"Authorization": f"Bearer {passwords()['metrics_scraper']}"})
        assert metrics.status_code == 200, metrics.text[:2000]
        assert f'pipeline="{pipeline}"' in metrics.text
        assert requests.get(f"{base}/exactly-once/api/pipelines", timeout=30).status_code == 401
        token = requests.post(f"{base}/auth/token", timeout=30,
                              json={"username": "admin", "password": passwords()["airflow_admin"]}).json()
        view = requests.get(f"{base}/exactly-once/api/pipelines", params={"pipeline": pipeline}, timeout=60,
                            headers={"Authorization": f"Bearer {token['access_token']}"})
        assert view.status_code == 200, view.text[:2000]
        [shown] = view.json()
        assert shown["status"]["name"] == pipeline and shown["status"]["last_commit"]["records"] == RECORDS + 1 \
            and shown["dag_id"] == pipeline and shown["status"]["open"] == [], shown
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(30)
