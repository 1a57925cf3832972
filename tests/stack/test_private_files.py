"""Secrets at rest (issue 43, item 4): every file of the running local stack that holds a
secret is 0600, no file others can read holds one, and `write_private` — what the stack
writes its secret files with — makes a file that is 0600 before its first byte, even under
umask 0, and never chmods one."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from exactly_once_stack import airflow, connect, private, schema_registry, settings
from exactly_once_stack.kafka import DATA as KAFKA_DATA
from exactly_once_stack.postgres import HOME as POSTGRES_HOME
from exactly_once_stack.postgres import SERVER_KEY as POSTGRES_KEY
from exactly_once_stack.settings import AIRFLOW_HOME, ENV_SH, LOCAL, TLS, passwords

# The stack's files that hold a secret: passwords, the exported environment (passwords, the
# Fernet key, the JWT secret), the simple auth manager's passwords file, Airflow's own
# configuration (keys it generated), the schema registry's users, the private keys (the stack
# CA's, and PostgreSQL's copy of its server key).
NAMED = (LOCAL / "secrets.json", ENV_SH, AIRFLOW_HOME / "passwords.json", AIRFLOW_HOME / "airflow.cfg",
         schema_registry.CONFIG, POSTGRES_KEY)
TOO_BIG = 64 << 20  # bytes: no secret file is that large (WAL segments, jars, logs of days)
# Not searched: the broker's log segments (the tests' records, and the cluster's metadata, which
# keeps the SCRAM credential salted and hashed, never the password), tens of GB of sparse indexes;
# the upgrade test's git worktrees of earlier releases (their tests' own throwaway keys).
NOT_SEARCHED = (KAFKA_DATA, LOCAL / "upgrade")


def secret_files() -> list[Path]:
    # Kafka Connect's (Debezium's password, the REST API's users) once `./dev up --cdc` or a
    # change-feed test started it.
    connect_files = [path for path in (connect.CAPTURE_SECRET, connect.REST_USERS) if path.exists()]
    return [*NAMED, *connect_files, *sorted(TLS.folder.glob("*.key")), *sorted(TLS.folder.glob("*.keystore.pem"))]


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_every_secret_file_of_the_running_stack_is_0600(stack_env):
    files = secret_files()
    assert TLS.ca_key in files and len(files) >= len(NAMED) + 2
    assert {str(path.relative_to(LOCAL)): oct(mode(path)) for path in files} == \
           {str(path.relative_to(LOCAL)): "0o600" for path in files}
    assert not (POSTGRES_HOME / "initdb.pw").exists()  # removed once initdb read it


def test_no_file_others_can_reach_holds_a_password_or_a_private_key(stack_env):
    """Everything under .local that group or others may read (every folder on its way open to
    them) is searched for the stack's passwords and keys; a folder closed to them is not."""
    needles = {name: value.encode() for name, value in passwords().items()} | {"a private key": b"PRIVATE KEY-----"}
    exposed = []
    for folder, folders, files in os.walk(LOCAL):
        folders[:] = [f for f in folders if stat.S_IMODE(os.lstat(os.path.join(folder, f)).st_mode) & 0o011
                      and Path(folder, f) not in NOT_SEARCHED]
        for name in files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            if not stat.S_ISREG(info.st_mode) or not info.st_mode & 0o044 or info.st_size > TOO_BIG:
                continue
            with open(path, "rb") as file:
                data = file.read()
            exposed += [f"{os.path.relpath(path, LOCAL)} ({oct(stat.S_IMODE(info.st_mode))}) holds {what}"
                        for what, needle in needles.items() if needle in data]
    assert exposed == []


@pytest.fixture
def umask_0():
    """A umask that takes nothing away: a file's mode is the one it was created with."""
    saved = os.umask(0)
    yield
    os.umask(saved)


@pytest.fixture
def writes(monkeypatch, umask_0) -> list[tuple[str, int]]:
    """Each os.write: the file it writes to and that file's mode at that instant; chmod refused."""
    seen = []
    write = os.write

    def spy(fd: int, data) -> int:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            seen.append((os.readlink(f"/proc/self/fd/{fd}"), stat.S_IMODE(os.fstat(fd).st_mode)))
        return write(fd, data)

    def refuse(*args, **kwargs):
        raise AssertionError(f"a secret file is chmod-ed after it was created: {args}")

    monkeypatch.setattr(os, "write", spy)
    for module, name in ((os, "chmod"), (os, "fchmod"), (os, "lchmod"), (Path, "chmod")):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, refuse)
    return seen


def test_write_private_makes_a_file_0600_before_its_first_byte_even_under_umask_0(tmp_path, writes):
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    old.write_text("an older secret")
    assert mode(old) == 0o666  # what a plain write makes under umask 0
    private.write_private(new, "s3cret\n")
    private.write_private(old, b"a new secret")  # a file of a wider mode is replaced, not truncated
    assert writes and all(m == 0o600 for _, m in writes), writes
    assert all(Path(p).parent == tmp_path and Path(p).name.startswith((".new.json.", ".old.json.")) for p, _ in writes)
    assert (new.read_text(), mode(new), old.read_bytes(), mode(old)) == ("s3cret\n", 0o600, b"a new secret", 0o600)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json", "old.json"]  # no temporary file left


def test_the_stacks_secret_files_are_written_0600_from_their_first_byte(stack_env, tmp_path, writes):
    """The writers themselves, under umask 0: `_json_file` (secrets.json, ports.json), the
    exported environment, the simple auth manager's passwords file."""
    kept = settings._json_file(tmp_path / "secrets.json", ("a", "b"), lambda name, _kept: f"secret-{name}")
    settings.write_env_sh()
    # Writes the passwords file; `airflow db migrate` (a child under umask 0) is not run again:
    # the stack's start migrated this Airflow version already.
    assert airflow.migrate() is False
    written = {Path(p).with_name(Path(p).name[1:].rsplit(".", 2)[0]) for p, _ in writes}  # .NAME.XXXXXXXX.tmp
    assert {tmp_path / "secrets.json", ENV_SH, AIRFLOW_HOME / "passwords.json"} <= written, writes
    assert all(m == 0o600 for _, m in writes), writes
    assert kept == {"a": "secret-a", "b": "secret-b"} == json.loads((tmp_path / "secrets.json").read_text())
    assert {mode(path) for path in (tmp_path / "secrets.json", ENV_SH, AIRFLOW_HOME / "passwords.json")} == {0o600}
