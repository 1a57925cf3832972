"""A PostgreSQL server from Debian's package, in .local/postgres, on a loopback port.

It holds two databases, each owned by a role of the same name: `pipeline`
(the ledger, staging and final tables) and `airflow` (Airflow's metadata).

TCP takes TLS only: the server presents the `postgres` certificate of the stack's CA
(exactly_once_stack.tls; IP 127.0.0.1 and DNS localhost, so clients check it with
`sslmode=verify-full`), and pg_hba.conf has `hostssl` lines only (SCRAM passwords), so a
plaintext connection is refused. The Unix socket is the stack's admin path: the superuser
`postgres`, trusted (`connect_admin`). Both are set at every start, also on a data
directory made by an older checkout: pg_hba.conf is rewritten, the TLS settings are on the
server's command line, and a server still running without them is started again.

Beside the owners, the least-privilege login roles (issue 43): `pipeline_job` (the Spark
job's, member of the group role `exactly_once_job`) and `pipeline_read` (status and the
pipelines view, member of `exactly_once_read`), passwords from settings.passwords(). The
group roles' rights are granted by the ledger's migrations; only these two and the owners
may connect to the pipeline database, only `airflow` to Airflow's.
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import signal
import subprocess
from contextlib import closing
from pathlib import Path

import psycopg2

from exactly_once_stack import process, tls
from exactly_once_stack.private import write_private
from exactly_once_stack.settings import LOCAL, LOOPBACK, TLS, passwords, ports

HOME = LOCAL / "postgres"
DATA = HOME / "data"
SOCKETS = HOME / "run"
LOG = HOME / "server.log"
# The server's certificate chain and key, copied from .local/tls (root's alone when the stack runs
# as root) where the server's user reads them; PostgreSQL refuses a key others may read.
SERVER_TLS = HOME / "tls"
SERVER_CERT = SERVER_TLS / "server.crt"
SERVER_KEY = SERVER_TLS / "server.key"
HBA = DATA / "pg_hba.conf"
HBA_RULES = """\
# Written by exactly_once_stack.postgres at every start: an edit here is undone.
# The Unix socket: the stack's admin path, the superuser only (connect_admin).
local    all  postgres                trust
# TCP: TLS with a SCRAM password, for the pipeline's roles and Airflow's, each to its database.
# No `host` line: a plaintext connection is refused.
hostssl  pipeline  pipeline,pipeline_job,pipeline_read  127.0.0.1/32  scram-sha-256
# The upgrade test's database (tests/upgrade/): a ledger the previous release made, then today's.
hostssl  pipeline_upgrade  pipeline,pipeline_job,pipeline_read  127.0.0.1/32  scram-sha-256
hostssl  airflow   airflow                              127.0.0.1/32  scram-sha-256
# The change feeds' source database (exactly_once_stack/connect.py): its owner writes the rows,
# Debezium's role reads them and their changes (a logical walsender matches this line too).
hostssl  source    source,cdc_capture                   127.0.0.1/32  scram-sha-256
"""
DATABASES = ("pipeline", "airflow", "source")
# Debezium's login: REPLICATION for its slot, the rights to read `source` granted by connect.py.
CAPTURE_ROLE = "cdc_capture"
PRELOADED = "pg_stat_statements"  # shared_preload_libraries
# Group roles (NOLOGIN) that hold a duty's rights, granted by the migrations; a login role per duty.
GROUP_ROLES = ("exactly_once_job", "exactly_once_read")
LOGIN_ROLES = {"pipeline_job": "exactly_once_job", "pipeline_read": "exactly_once_read"}
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
    write_private(pwfile, passwords()["postgres"] + "\n")  # 0600 from its first byte, then given to postgres
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


def _login_role(cur, name: str, *, member_of: str | None = None) -> None:
    """A login role with its password from settings.passwords(): made if missing, else given
    that password again (secrets.json is the one source)."""
    cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,))
    if cur.fetchone() is None:
        cur.execute(f'CREATE ROLE "{name}" LOGIN PASSWORD %s', (passwords()[name],))
    else:
        cur.execute(f'ALTER ROLE "{name}" LOGIN PASSWORD %s', (passwords()[name],))
    if member_of is not None:
        cur.execute("SELECT pg_has_role(%s, %s, 'MEMBER')", (name, member_of))
        if not cur.fetchone()[0]:
            cur.execute(f'GRANT "{member_of}" TO "{name}"')


def _create_databases() -> None:
    """The owners and their databases, the least-privilege roles, and who may connect where."""
    with closing(connect_admin()) as conn, conn.cursor() as cur:
        conn.autocommit = True
        for name in DATABASES:
            _login_role(cur, name)
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{name}" OWNER "{name}"')
        for group in GROUP_ROLES:
            cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (group,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE ROLE "{group}" NOLOGIN')
        for login, group in LOGIN_ROLES.items():
            _login_role(cur, login, member_of=group)
        _login_role(cur, CAPTURE_ROLE)
        cur.execute(f'ALTER ROLE "{CAPTURE_ROLE}" REPLICATION')
        # Only the roles meant to connect can (an owner connects to its own database by owning it).
        cur.execute('REVOKE CONNECT ON DATABASE "pipeline", "airflow", "source" FROM PUBLIC')
        logins = ", ".join(f'"{login}"' for login in LOGIN_ROLES)
        cur.execute(f'GRANT CONNECT ON DATABASE "pipeline" TO {logins}')
        cur.execute(f'GRANT CONNECT ON DATABASE "source" TO "{CAPTURE_ROLE}"')


def _install_certificate() -> None:
    """The server's certificate and key of the stack's CA, copied into SERVER_TLS for the
    server's user, mode 600 from their first byte."""
    SERVER_TLS.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private(SERVER_CERT, TLS.certificate("postgres").read_bytes())
    write_private(SERVER_KEY, TLS.key("postgres").read_bytes())
    _give_to_owner(SERVER_TLS, SERVER_CERT, SERVER_KEY)


def _configure() -> None:
    """pg_hba.conf as this checkout has it: TLS only over TCP (HBA_RULES)."""
    write_private(HBA, HBA_RULES)
    _give_to_owner(HBA)


def _runs_as_configured() -> bool:
    """The running server has SSL on, this checkout's pg_hba.conf and the current
    certificate, and preloads what the server options name."""
    try:
        with closing(connect_admin()) as conn, conn.cursor() as cur:
            cur.execute("SELECT current_setting('ssl') = 'on', current_setting('shared_preload_libraries') = %s, "
                        "current_setting('wal_level') = 'logical'", (PRELOADED,))
            ssl_on, preloads, logical = cur.fetchone()
    except psycopg2.OperationalError:
        return False
    current = TLS.certificate("postgres")
    return (ssl_on and preloads and logical and HBA.exists() and HBA.read_text() == HBA_RULES and SERVER_CERT.exists()
            and current.exists() and SERVER_CERT.read_bytes() == current.read_bytes())


def _server_options() -> str:
    """The server's settings on its command line (pg_ctl -o), above postgresql.conf and
    postgresql.auto.conf: a data directory of any age serves TLS."""
    settings = {
        "port": ports()["postgres"], "listen_addresses": LOOPBACK, "unix_socket_directories": SOCKETS,
        "max_connections": 200, "ssl": "on", "ssl_cert_file": SERVER_CERT, "ssl_key_file": SERVER_KEY,
        "ssl_min_protocol_version": "TLSv1.2", "password_encryption": "scram-sha-256",
        # The socket trusts the superuser: only the server's OS user (and root) may open it.
        "unix_socket_permissions": "0700",
        # Statement statistics for `./dev bench --profile` (tests/benchmarks/profiling.py), which
        # turns tracking on for the pipeline database while it profiles: off otherwise.
        "shared_preload_libraries": PRELOADED, "pg_stat_statements.track": "none",
        # Debezium's PostgreSQL connector decodes the log with pgoutput (./dev up --cdc). A slot
        # whose connector stays stopped is given up past 1 GB of WAL rather than filling the
        # disk: connect.py drops it, and the connector takes a new snapshot.
        "wal_level": "logical", "max_slot_wal_keep_size": "1GB",
    }
    # pg_ctl runs the server through a shell: quoted for it.
    return " ".join(f"-c {shlex.quote(f'{name}={value}')}" for name, value in settings.items())


def start() -> bool:
    """Starts the server (initialising it first if needed), its roles and databases made if
    missing. False if it already ran as this checkout configures it; a server that runs
    without TLS or the preloaded library (started by an older checkout) is stopped and
    started again."""
    tls.ensure(TLS)  # the stack's CA and the server's certificate, made if missing or due for renewal
    if pid() is not None:
        if _runs_as_configured():
            _create_databases()  # roles a newer checkout adds, on a server that already runs
            return False
        stop()
    if not initialised():
        _initdb()
    _install_certificate()
    _configure()
    subprocess.run(_as_owner([
        str(bin_dir() / "pg_ctl"), "start", "-D", str(DATA), "-l", str(LOG), "-w", "-t", "60",
        "-o", _server_options(),
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
