"""A PostgreSQL server from Debian's package, in .local/postgres, on a loopback port.

It holds two databases, each owned by a role of the same name: `pipeline`
(the ledger, staging and final tables) and `airflow` (Airflow's metadata).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
from contextlib import closing
from pathlib import Path

import psycopg2

from exactly_once_stack import process
from exactly_once_stack.settings import LOCAL, LOOPBACK, passwords, ports

HOME = LOCAL / "postgres"
DATA = HOME / "data"
SOCKETS = HOME / "run"
LOG = HOME / "server.log"
DATABASES = ("pipeline", "airflow")
MARKER = "postgres"


def bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise RuntimeError("PostgreSQL server not installed (no /usr/lib/postgresql/*/bin/initdb): "
                           "run exactly_once_stack/setup.sh")
    return Path(found[-1]).parent


def _as_owner(cmd: list[str]) -> list[str]:
    # initdb and the server refuse to run as root: run them as Debian's postgres user.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _give_to_owner(*paths: Path) -> None:
    if os.geteuid() == 0:
        for path in paths:
            shutil.chown(path, "postgres", "postgres")


def pid() -> int | None:
    found = process.read_pid(DATA / "postmaster.pid")
    return found if found and process.alive(found, MARKER) else None


def _initdb() -> None:
    HOME.mkdir(parents=True, exist_ok=True)
    SOCKETS.mkdir(exist_ok=True)
    pwfile = HOME / "initdb.pw"
    pwfile.write_text(passwords()["postgres"] + "\n")
    _give_to_owner(HOME, SOCKETS, pwfile)
    try:
        subprocess.run(_as_owner([
            str(bin_dir() / "initdb"), "-D", str(DATA), "-U", "postgres", f"--pwfile={pwfile}",
            "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8",
        ]), check=True, stdout=subprocess.DEVNULL)
    finally:
        pwfile.unlink()


def connect_admin(database: str = "postgres"):
    """A superuser connection over the server's Unix socket (trusted locally)."""
    return psycopg2.connect(host=str(SOCKETS), port=ports()["postgres"], user="postgres", dbname=database)


def _create_databases() -> None:
    with closing(connect_admin()) as conn, conn.cursor() as cur:
        conn.autocommit = True
        for name in DATABASES:
            cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE ROLE "{name}" LOGIN PASSWORD %s', (passwords()[name],))
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{name}" OWNER "{name}"')


def start() -> bool:
    """Starts the server (initialising it first if needed). False if it already ran."""
    if pid() is not None:
        return False
    if not initialised():
        _initdb()
    port = ports()["postgres"]
    subprocess.run(_as_owner([
        str(bin_dir() / "pg_ctl"), "start", "-D", str(DATA), "-l", str(LOG), "-w", "-t", "60",
        "-o", f"-c port={port} -c listen_addresses={LOOPBACK} -c unix_socket_directories={SOCKETS}"
              " -c max_connections=200",
    ]), check=True, stdout=subprocess.DEVNULL)
    _create_databases()
    return True


def stop() -> None:
    running = pid()
    if running is not None:
        # SIGINT is PostgreSQL's "fast" shutdown: roll back open transactions, then exit cleanly.
        process.stop(running, MARKER, signal.SIGINT, timeout=60)


def initialised() -> bool:
    return (DATA / "PG_VERSION").exists()


def version() -> str:
    with closing(connect_admin()) as conn, conn.cursor() as cur:
        cur.execute("SHOW server_version")
        return cur.fetchone()[0]
