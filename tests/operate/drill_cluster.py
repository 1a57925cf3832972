"""The restore drill's own PostgreSQL: a cluster from the stack's binaries (Debian's, as
exactly_once_stack.postgres finds them) in a directory of the drill, never the stack's
server. It archives its WAL into a local archive (`archive_command`), takes a base backup
(`pg_basebackup`), names restore points (`pg_create_restore_point`), and restores: a copy
of the base backup that replays the archive up to a named point (`restore_command`,
`recovery_target_name`), then is promoted. It listens on a Unix socket of its own only,
with local trust for its superuser: no password anywhere. Every server it starts it stops
by its PID (`stop`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from contextlib import closing
from pathlib import Path

import psycopg2

from exactly_once_stack import process
from exactly_once_stack.postgres import bin_dir
from exactly_once_stack.settings import LOCAL, LOOPBACK

HOME = LOCAL / "restore-drill"
DATABASE = "pipeline"
MARKER = "postgres"


def _as_owner(cmd: list[str]) -> list[str]:
    # initdb and the server refuse to run as root: Debian's postgres user runs them.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _owned(*paths: Path) -> None:
    for path in paths:
        path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(path, "postgres", "postgres")


def _run(*cmd: str) -> None:
    subprocess.run(_as_owner(list(cmd)), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _free_port() -> int:
    with socket.socket() as s:  # a port number for the socket's name; the server listens on no TCP port
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class Cluster:
    """One data directory of the drill, its server started and stopped by PID."""

    def __init__(self, home: Path, name: str, port: int | None = None):
        self.home, self.name = home, name
        self.data, self.sockets, self.archive = home / name, home / "run", home / "wal-archive"
        self.log = home / f"{name}.log"
        self.port = port or _free_port()

    def dsn(self, database: str = DATABASE) -> str:
        """A libpq URI over the drill's socket, as its superuser (trusted locally; no password)."""
        return f"postgresql://postgres@/{database}?host={self.sockets}&port={self.port}"

    def connect(self, database: str = DATABASE):
        return psycopg2.connect(host=str(self.sockets), port=self.port, user="postgres", dbname=database)

    def init(self) -> None:
        """A new cluster that archives every WAL segment it completes into the archive."""
        _owned(self.home, self.sockets, self.archive)
        _run(str(bin_dir() / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth-local=trust",
             "-E", "UTF8", "--locale=C.UTF-8")
        with open(self.data / "postgresql.auto.conf", "a") as conf:
            conf.write("wal_level = replica\narchive_mode = on\n"
                       f"archive_command = 'test ! -f {self.archive}/%f && cp %p {self.archive}/%f'\n")

    def start(self) -> None:
        options = (f"-c port={self.port} -c listen_addresses='' -c unix_socket_directories={self.sockets} "
                   "-c unix_socket_permissions=0700 -c max_connections=40")
        _run(str(bin_dir() / "pg_ctl"), "start", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "120",
             "-o", options)

    def pid(self) -> int | None:
        found = process.read_pid(self.data / "postmaster.pid")
        return found if found and process.alive(found, MARKER) else None

    def stop(self) -> None:
        """SIGINT, PostgreSQL's fast shutdown, to the server this cluster's postmaster.pid names."""
        running = self.pid()
        if running is not None:
            process.stop(running, MARKER, signal.SIGINT, timeout=60)

    def create_database(self) -> None:
        with closing(self.connect("postgres")) as conn, conn.cursor() as cur:
            conn.autocommit = True
            cur.execute(f'CREATE DATABASE "{DATABASE}"')

    def base_backup(self, into: Path) -> None:
        """pg_basebackup of the running server (its WAL of the backup streamed beside it)."""
        _owned(into.parent)
        _run(str(bin_dir() / "pg_basebackup"), "-h", str(self.sockets), "-p", str(self.port), "-U", "postgres",
             "-D", str(into), "-X", "stream", "-c", "fast")

    def restore_point(self, name: str) -> str:
        """A named restore point in the WAL; its LSN."""
        with closing(self.connect()) as conn, conn.cursor() as cur:
            conn.autocommit = True
            cur.execute("SELECT pg_catalog.pg_create_restore_point(%s)::text", (name,))
            return cur.fetchone()[0]

    def archive_current_wal(self, timeout: float = 60) -> None:
        """The segment being written, switched and archived: the archive holds every record so far."""
        with closing(self.connect()) as conn, conn.cursor() as cur:
            conn.autocommit = True
            cur.execute("SELECT pg_catalog.pg_walfile_name(pg_catalog.pg_switch_wal())")
            segment = cur.fetchone()[0]
        process.wait_until(lambda: (self.archive / segment).exists(), timeout, f"archive of WAL {segment}", self.log)

    def restored(self, backup: Path, name: str, target: str) -> Cluster:
        """A new data directory from the base backup that replays the archive up to the restore
        point `target`, then is promoted (not started yet)."""
        restored = Cluster(self.home, name, self.port)
        _run("cp", "-a", str(backup), str(restored.data))
        with open(restored.data / "postgresql.auto.conf", "a") as conf:
            conf.write(f"restore_command = 'cp {self.archive}/%f %p'\nrecovery_target_name = '{target}'\n"
                       "recovery_target_action = 'promote'\n"
                       # The restored server archives into an archive of its own, not over the old timeline's.
                       f"archive_command = 'test ! -f {self.home}/wal-archive-{name}/%f && "
                       f"cp %p {self.home}/wal-archive-{name}/%f'\n")
        _owned(self.home / f"wal-archive-{name}")
        _run("touch", str(restored.data / "recovery.signal"))
        return restored

    def wait_promoted(self, timeout: float = 120) -> None:
        def promoted() -> bool:
            try:
                with closing(self.connect()) as conn, conn.cursor() as cur:
                    cur.execute("SELECT NOT pg_catalog.pg_is_in_recovery()")
                    return cur.fetchone()[0]
            except psycopg2.OperationalError:
                return False
        process.wait_until(promoted, timeout, "the restored server's promotion", self.log)


def fresh_home(home: Path = HOME) -> Path:
    """The drill's directory, emptied of a previous drill's (whose servers must be stopped)."""
    for pid_file in home.glob("*/postmaster.pid"):
        running = process.read_pid(pid_file)
        if running and process.alive(running, MARKER) and str(home) in process.command_line(running):
            raise RuntimeError(f"a server of an earlier drill still runs (pid {running}, {pid_file.parent}): "
                               "stop it first")
    shutil.rmtree(home, ignore_errors=True)
    _owned(home)
    return home
