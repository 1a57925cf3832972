"""Airflow's metadata database (on the local PostgreSQL) and its local admin user."""

from __future__ import annotations

import json
import subprocess

from stack.settings import AIRFLOW_HOME, LOCAL, ROOT, passwords, process_environment

STAMP = LOCAL / "stamps" / "airflow-db"


def version() -> str:
    from importlib.metadata import version as dist_version

    return dist_version("apache-airflow")


def migrate(force: bool = False) -> bool:
    """`airflow db migrate`, skipped while this Airflow version already migrated the database."""
    AIRFLOW_HOME.mkdir(parents=True, exist_ok=True)
    (AIRFLOW_HOME / "passwords.json").write_text(json.dumps({"admin": passwords()["airflow_admin"]}))
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
