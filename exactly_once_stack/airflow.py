"""Airflow: its metadata database (on the local PostgreSQL), its local admin user, and its
long-running services (api-server, scheduler, dag-processor, triggerer) for tests that need them."""

from __future__ import annotations

import json
import subprocess
import urllib.request

from exactly_once_stack import process
from exactly_once_stack.private import write_private
from exactly_once_stack.settings import AIRFLOW_HOME, LOCAL, ROOT, passwords, process_environment

STAMP = LOCAL / "stamps" / "airflow-db"


def version() -> str:
    from importlib.metadata import version as dist_version

    return dist_version("apache-airflow")


def migrate(force: bool = False) -> bool:
    """`airflow db migrate`, skipped while this Airflow version already migrated the database."""
    AIRFLOW_HOME.mkdir(parents=True, exist_ok=True)
    # The simple auth manager's passwords file (AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE): 0600
    # from its first byte. Airflow adds a user missing from it in place, keeping that mode.
    write_private(AIRFLOW_HOME / "passwords.json", json.dumps({"admin": passwords()["airflow_admin"]}))
    if not force and STAMP.exists() and STAMP.read_text() == version():
        return False
    subprocess.run(["airflow", "db", "migrate"], env=process_environment(), cwd=ROOT,
                   check=True, stdout=subprocess.DEVNULL)
    STAMP.parent.mkdir(parents=True, exist_ok=True)
    STAMP.write_text(version())
    return True


def forget_migration() -> None:
    """Called when the PostgreSQL cluster is created anew: its airflow database is empty."""
    STAMP.unlink(missing_ok=True)


# -- the long-running services: api-server, scheduler, dag-processor, triggerer ---------

SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer")


def _pid_file(service: str):
    return AIRFLOW_HOME / f"{service}.pid"


def _marker(service: str) -> str:
    # What stays in the process title: the api-server renames itself "airflow api_server -- host:…".
    return f"airflow {service.split('-')[0]}"


def service_pid(service: str) -> int | None:
    found = process.read_pid(_pid_file(service))
    return found if found and process.alive(found, _marker(service)) else None


def api_healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/api/v2/monitor/health", timeout=2) as answer:
            health = json.load(answer)
    except (OSError, ValueError):
        return False
    return all(health.get(part, {}).get("status") == "healthy" for part in ("metadatabase", "scheduler"))


def start_services(**overrides: str) -> list[str]:
    """Starts the services not running (logs in .local/airflow/<service>.log) and waits until
    the API reports the metadata database and the scheduler healthy. `overrides` are extra
    environment variables, e.g. another AIRFLOW__CORE__DAGS_FOLDER. Returns what it started."""
    env = {**process_environment(), **overrides}
    started = []
    for service in SERVICES:
        if service_pid(service) is None:
            process.spawn(["airflow", *service.split()], AIRFLOW_HOME / f"{service}.log", _pid_file(service),
                          env=env, cwd=ROOT)
            started.append(service)
    try:
        process.wait_until(lambda: api_healthy(env["AIRFLOW__API__BASE_URL"]), 120, "Airflow api-server and scheduler",
                           AIRFLOW_HOME / "scheduler.log")
    except BaseException:
        stop_services(started)
        raise
    return started


def stop_services(names: list[str] | tuple[str, ...] = SERVICES) -> None:
    for service in names:
        running = service_pid(service)
        if running is not None:
            process.stop(running, _marker(service), timeout=60)
