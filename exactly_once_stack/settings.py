"""Where the local stack lives, its ports and secrets, and the environment it exports.

`environment()` is the single source of every variable the project's tools read
(KAFKA_BOOTSTRAP_SERVERS, PIPELINE_DB_URL, AIRFLOW_*, SPARK_*) on the local stack;
`.local/env.sh` is written from it for shells. Airflow settings that do not depend on
the deployment come from deploy/airflow.env, which docker-compose.yaml reads too.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shlex
import shutil
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCAL = ROOT / ".local"
VENV = ROOT / ".venv"
ENV_SH = LOCAL / "env.sh"
AIRFLOW_HOME = LOCAL / "airflow"
SPARK_CONF_DIR = LOCAL / "spark" / "conf"
JARS = LOCAL / "jars"
LOOPBACK = "127.0.0.1"
SPARK_MASTER = "local[2]"

# Each port can be fixed with STACK_<NAME>_PORT; otherwise a free one is picked
# on first start and kept in .local/ports.json.
PORT_NAMES = ("postgres", "kafka", "kafka_controller", "airflow_api")


def _json_file(path: Path, make: callable) -> dict:
    if path.exists():
        return json.loads(path.read_text())
    value = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n")
    path.chmod(0o600)
    return value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def ports() -> dict[str, int]:
    chosen = _json_file(LOCAL / "ports.json", lambda: {name: _free_port() for name in PORT_NAMES})
    for name in PORT_NAMES:
        override = os.environ.get(f"STACK_{name.upper()}_PORT")
        if override:
            if not override.isdigit():
                raise ValueError(f"STACK_{name.upper()}_PORT must be a port number, got {override!r}")
            chosen[name] = int(override)
    return chosen


def passwords() -> dict[str, str]:
    """Generated once per checkout; local-only credentials, never committed."""
    return _json_file(LOCAL / "secrets.json", lambda: {
        "postgres": secrets.token_urlsafe(18),
        "pipeline": secrets.token_urlsafe(18),
        "airflow": secrets.token_urlsafe(18),
        "airflow_admin": secrets.token_urlsafe(12),
        "jwt_secret": secrets.token_urlsafe(32),
        "fernet_key": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
    })


def db_url(database: str, scheme: str = "postgresql") -> str:
    """A URI for `database`, whose owner role has the same name."""
    return f"{scheme}://{database}:{passwords()[database]}@{LOOPBACK}:{ports()['postgres']}/{database}"


def java_home() -> str:
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("no `java` on PATH: run exactly_once_stack/setup.sh, which installs a JDK")
    return str(Path(java).resolve().parent.parent)


def shared_airflow_settings() -> dict[str, str]:
    """deploy/airflow.env: the Airflow settings docker-compose.yaml uses too."""
    lines = (ROOT / "deploy" / "airflow.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def environment() -> dict[str, str]:
    """The variables every tool of the project reads, for the local stack."""
    port = ports()
    pw = passwords()
    api = f"http://{LOOPBACK}:{port['airflow_api']}"
    pipeline_db = {
        "conn_type": "postgres", "host": LOOPBACK, "port": port["postgres"],
        "login": "pipeline", "password": pw["pipeline"], "schema": "pipeline",
    }
    return {
        "JAVA_HOME": java_home(),
        "KAFKA_BOOTSTRAP_SERVERS": f"{LOOPBACK}:{port['kafka']}",
        "PIPELINE_DB_URL": db_url("pipeline"),
        "SPARK_CONF_DIR": str(SPARK_CONF_DIR),
        "SPARK_LOCAL_IP": LOOPBACK,
        "PYSPARK_PYTHON": str(VENV / "bin" / "python"),
        # The library and the demo for `python -m exactly_once.status`,
        # `python -m exactly_once_demo.produce`, Spark's workers.
        "PYTHONPATH": str(ROOT / "plugins"),
        "AIRFLOW_HOME": str(AIRFLOW_HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        **shared_airflow_settings(),
        "AIRFLOW__CORE__FERNET_KEY": pw["fernet_key"],
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(AIRFLOW_HOME / "passwords.json"),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api}/execution/",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url("airflow", "postgresql+psycopg2"),
        "AIRFLOW__API__HOST": LOOPBACK,
        "AIRFLOW__API__PORT": str(port["airflow_api"]),
        "AIRFLOW__API__BASE_URL": api,
        "AIRFLOW__API_AUTH__JWT_SECRET": pw["jwt_secret"],
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": SPARK_MASTER}),
        "AIRFLOW_CONN_PIPELINE_DB": json.dumps(pipeline_db),
    }


def process_environment() -> dict[str, str]:
    """os.environ with the stack's variables and the project's virtualenv first on PATH."""
    env = {**os.environ, **environment()}
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def write_env_sh() -> Path:
    lines = ["# Written by `python -m exactly_once_stack up`; source it from the project root.",
             f"export PATH={shlex.quote(str(VENV / 'bin'))}:\"$PATH\""]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in environment().items()]
    ENV_SH.write_text("\n".join(lines) + "\n")
    ENV_SH.chmod(0o600)
    return ENV_SH
