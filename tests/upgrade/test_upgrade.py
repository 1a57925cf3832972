"""Issue 60, item 1, promise 13: an upgrade never strands a checkpoint, whatever state it was in
when the upgrade landed. The previous release runs for real: its checkout (a git worktree of
the release commit, `EXACTLY_ONCE_UPGRADE_FROM`, with the environment its lock gives) migrates
a ledger database of its own and leaves a pipeline per state (tests/upgrade/leave_open.py):
a checkpoint planned, running (its job died with the upgrade, its rows staged), running with a
live job (its task goes on across the upgrade), pre-committed, sent back, stalled at commit on
its dead-letter budget, stalled by a failed attempt, and a reprocessing pre-committed. Then
today's code: its migrations, the live task's pre-commit, cleared tasks where a checkpoint
stalled, and runs until nothing is left. Every checkpoint left open ends committed, or aborted
with its ranges planned again and committed; the oracle compares every table to the row.

`./dev upgrade-test` runs it (from another release: `EXACTLY_ONCE_UPGRADE_FROM=COMMIT`); CI
runs it with the driver of tests/ledger/harness.py as the job, the Spark job's own upgrade
path being the same ledger statements.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import psycopg2
import pytest

from exactly_once.config import load_config
from exactly_once.ledger.invariants import violations
from exactly_once.ledger.migrate import migrate_through
from exactly_once_stack import postgres
from tests.kafka_records import Produced
from tests.ledger.harness import Pipeline
from tests.ledger.machine import quiesce

ROOT = Path(__file__).resolve().parents[2]
PREVIOUS = os.environ.get("EXACTLY_ONCE_UPGRADE_FROM", "fbca86b")
DATABASE = "pipeline_upgrade"  # the stack's pg_hba.conf lets the pipeline's roles in
STATES = {"planned", "running", "live", "precommitted", "sent_back", "stalled_at_commit", "stalled", "reprocessing"}


def git(*arguments: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *arguments], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture(scope="module")
def previous_release() -> tuple[Path, str]:
    """(the release's checkout, the Python of its locked environment): this checkout's
    environment when the release's test lock is this one's, else one of its own."""
    commit = git("rev-parse", "--verify", f"{PREVIOUS}^{{commit}}")
    checkout = ROOT / ".local" / "upgrade" / commit[:12]
    if not (checkout / "plugins").exists():
        git("worktree", "prune")
        git("worktree", "add", "--force", "--detach", str(checkout), commit)
    lock = checkout / "requirements-test.lock"
    if lock.read_bytes() == (ROOT / "requirements-test.lock").read_bytes():
        return checkout, sys.executable
    venv = ROOT / ".local" / "upgrade" / f"venv-{commit[:12]}"
    uv = str(ROOT / ".local" / "tools" / "bin" / "uv")
    if not (venv / "bin" / "python").exists():
        subprocess.run([uv, "venv", "--python", sys.executable, str(venv)], check=True)
    subprocess.run([uv, "pip", "sync", "--compile-bytecode", "--python", str(venv / "bin" / "python"), str(lock)],
                   check=True)  # compiled as setup.sh compiles .venv
    return checkout, str(venv / "bin" / "python")


@pytest.fixture
def upgrade_db(stack_env) -> str:
    """A database of its own for the ledger the previous release makes, new each time."""
    with closing(postgres.connect_admin()) as conn, conn.cursor() as cur:
        conn.autocommit = True
        cur.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{DATABASE}" OWNER "pipeline"')
    return stack_env["PIPELINE_DB_URL"].replace("/pipeline?", f"/{DATABASE}?", 1)


class Unmoved:
    """quiesce's clock: the ledger runs on the real one here."""

    def advance(self, _step) -> None:
        pass


def pipeline_of(left: dict, db_url: str, servers: str) -> Pipeline:
    pipeline = Pipeline(db_url, servers, left["topic"], existing=load_config(left["config"]))
    pipeline.produced = [Produced(p["partition"], p["offset"], None if p["key"] is None else base64.b64decode(p["key"]),
                                  base64.b64decode(p["value"]), p["committed"], p["timestamp"])
                         for p in left["produced"]]
    return pipeline


def test_every_checkpoint_the_previous_release_left_open_ends_exactly_once(previous_release, upgrade_db,
                                                                           kafka_servers):
    checkout, python = previous_release
    env = {**os.environ, "PYTHONPATH": f"{checkout}:{checkout / 'plugins'}"}
    release = subprocess.Popen([python, str(Path(__file__).with_name("leave_open.py")), upgrade_db, kafka_servers],
                               env=env, cwd=checkout, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    left = {}
    try:
        for line in release.stdout:  # the release's own output may come between
            if line.strip() == "ready":
                break
            if line.startswith("left "):
                found = json.loads(line.removeprefix("left "))
                left[found["state"]] = found
        assert set(left) == STATES, f"the previous release left {sorted(left)}"

        assert migrate_through(lambda: psycopg2.connect(upgrade_db)), "today's migrations, on its ledger"
        release.stdin.write("go\n")  # the live job stages; its task (the release's code) pre-commits
        release.stdin.flush()
        assert "live pre-committed" in release.stdout.read()
        assert release.wait(120) == 0
    finally:
        if release.poll() is None:
            release.kill()

    for state, found in left.items():
        pipeline = pipeline_of(found, upgrade_db, kafka_servers)
        quiesce(pipeline, Unmoved())  # today's run path; cleared tasks where it stalled; the oracle
        with closing(psycopg2.connect(upgrade_db)) as conn, conn.cursor() as cur:
            assert violations(conn, pipeline.config) == [], state
            cur.execute("SELECT state::text FROM exactly_once.checkpoints WHERE id = %s", (found["checkpoint_id"],))
            [(ended,)] = cur.fetchall()
            assert ended in ("committed", "aborted"), f"{state}: checkpoint {found['checkpoint_id']} is {ended}"
