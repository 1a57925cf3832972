"""The fault matrix's scenarios (issue: "Fault matrix"). Each produces demo orders
(committed and aborted Kafka transactions, malformed records), runs the pipeline
into one fault against the real services, then normal runs until it has caught
up, and returns what it found wrong beyond the oracle and the ledger invariants,
which `run_scenario` checks for every one of them after normal runs."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from functools import partial

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg2 import sql

from exactly_once.ledger.tables import staging_tables
from exactly_once_stack import kafka, postgres, spark_cluster
from exactly_once_stack.process import alive
from tests.faults.findings import ORDERS, Findings, restart, restarted_during
from tests.faults.publishing import (broker_restarted_mid_publish, commit_rolled_back, publisher_killed_mid_transaction,
                                     publisher_too_slow, zombie_publisher)
from tests.faults.world import ALL_TRIES, JOB_MARKER, TASK_TIMEOUT, Run, Verdict, World, finished, wait_for


def _retried(world: World, task: str, fault: str,
             when: tuple[str, Callable[[Run], None]] | None = None) -> tuple[Findings, Run]:
    """Produces orders and runs with `fault` on try 1 of `task` (and `when` acting on it);
    expects that try to fail and a retry to succeed."""
    found = Findings()
    world.produce(ORDERS)
    run = world.run(faults={(task, 1): fault}, when={(task, 1): when} if when else None)
    codes = [t.returncode for t in run.tries_of(task)]
    found.expect(len(codes) >= 2 and codes[0] != 0 and codes[-1] == 0,
                 f"{task}: expected try 1 to fail and a retry to succeed, exit codes {codes}")
    found.expect(run.state == "success", f"run {run.run_id} {run.state}")
    return found, run


def _expect_attempts(found: Findings, world: World, checkpoint: int, states: list[str]) -> None:
    actual = [s for s, in world.query("SELECT state::text FROM exactly_once.attempts WHERE checkpoint_id = %s "
                                      "ORDER BY attempt", checkpoint)]
    found.expect(actual == states, f"attempts of checkpoint {checkpoint}: {actual}, expected {states}")


def _staged_rows(world: World, checkpoint: int, attempt: int) -> int:
    """Rows of one attempt of a checkpoint across the pipeline's staging tables."""
    return sum(world.query(sql.SQL("SELECT count(*) FROM {} WHERE checkpoint_id = %s AND attempt = %s").format(table),
                           checkpoint, attempt)[0][0]
               for table in staging_tables(world.config).values())


def spark_killed_mid_write(world: World) -> Findings:
    """a. spark-submit (JVM and Python driver) SIGKILLed while the attempt's staging tables are
    written, a write's first task holding once its COPY committed (the writer's fault point).
    The writer's point fires in an executor, which in local mode is the driver's JVM, whose
    output the runner reads; on a cluster (q) the driver is killed once the tables are written."""
    point = "copy.after_task_commit" if world.spark == "local" else "increment.wrote.orders"
    found, run = _retried(world, "increment", f"{point}=sleep:120",
                          (point, lambda r: world.signal_attempt(r.checkpoint, 1, signal.SIGKILL)))
    _expect_attempts(found, world, run.checkpoint, ["aborted", "committed"])
    return found


def job_fails_before_pre_commit(world: World) -> Findings:
    """b. The job dies after writing all staging rows, before pre-commit."""
    found, run = _retried(world, "increment", "increment.before_pre_commit=exit")
    _expect_attempts(found, world, run.checkpoint, ["aborted", "committed"])
    return found


def crash_after_pre_commit(world: World) -> Findings:
    """c. The increment task's process dies after its attempt pre-committed, before the
    commit task: the retry finds the checkpoint pre-committed, runs nothing, commit commits."""
    found, run = _retried(world, "increment", "increment_task.after_job=exit")
    found.expect(run.tries_of("increment")[-1].result == {"attempt": None}, "the retry ran a new attempt")
    _expect_attempts(found, world, run.checkpoint, ["committed"])
    return found


def _terminate_open_transactions(world: World) -> None:
    world.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state = 'idle in transaction' AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()")


def commit_connection_killed(world: World) -> Findings:
    """d. The commit's database connection is terminated inside its transaction, before COMMIT."""
    found, run = _retried(world, "commit", "commit.before_commit=sleep:10",
                          ("commit.before_commit", lambda r: _terminate_open_transactions(world)))
    found.expect(run.tries_of("commit")[-1].result == {"outcome": "committed now"},
                 f"retry: {run.tries_of('commit')[-1].result}")
    return found


def crash_after_commit(world: World) -> Findings:
    """e. The commit task dies after COMMIT, before reporting success: its retry is a no-op."""
    found, run = _retried(world, "commit", "commit_task.try1.after_commit=exit")
    found.expect(run.tries_of("commit")[-1].result == {"outcome": "already committed"},
                 f"retry: {run.tries_of('commit')[-1].result}")
    return found


def _restart_later(service, down_for: float) -> threading.Thread:
    """Stops the service now and starts it again `down_for` seconds later, in the background."""
    service.stop()
    thread = threading.Thread(target=lambda: (time.sleep(down_for), service.start()), daemon=True)
    thread.start()
    return thread


def postgres_restarted_during_write(world: World) -> Findings:
    """f1. PostgreSQL stopped as the Spark job starts writing staging, up again 3 s later."""
    found = Findings()
    world.produce(ORDERS)
    restarts: list[threading.Thread] = []
    run = world.run(faults={("increment", 1): "increment.before_write=sleep:0"},
                    when={("increment", 1): ("increment.before_write",
                                             lambda r: restarts.append(_restart_later(postgres, 3)))})
    for thread in restarts:
        thread.join(120)
    found.expect(bool(restarts), "the job never reached its staging write")
    found.expect(run.state == "success", f"run {run.run_id} {run.state}")
    return found


def postgres_restarted_during_commit(world: World) -> Findings:
    """f2. PostgreSQL restarted while the commit's transaction is open."""
    found, _ = _retried(world, "commit", "commit.before_commit=sleep:10",
                        ("commit.before_commit", lambda r: restart(postgres)))
    return found


def kafka_restarted_during_read(world: World) -> Findings:
    """g. The Kafka broker restarted as the Spark job starts reading its ranges."""
    return restarted_during(world, "increment", "increment.before_read", kafka, 0)


def runs_planning_at_once(world: World) -> Findings:
    """h. Two runs plan at once: the first holds the pipeline's planning lock (paused inside
    its planning transaction) while the second, with a later interval end, waits on it; then
    both run their Spark jobs and commits in parallel."""
    found = Findings()
    world.produce(ORDERS)
    first_end = datetime.now(timezone.utc)
    world.produce(ORDERS)
    runs: dict[str, Run] = {}

    def run(run_id: str, **options) -> threading.Thread:
        thread = threading.Thread(target=lambda: runs.__setitem__(run_id, world.run(run_id=run_id, **options)))
        thread.start()
        return thread

    threads = [run("early", interval_end=first_end, faults={("begin", 1): "begin.before_commit=sleep:3"})]
    wait_for(world.folder / "early-begin-try1.log", "fault injected at begin.before_commit")
    threads.append(run("late"))
    for thread in threads:
        thread.join()
    found.expect(all(r.state == "success" and not r.empty for r in runs.values()),
                 f"both runs should read records: { {i: (r.state, r.empty) for i, r in runs.items()} }")
    return found


def zombie_attempt(world: World, reprocess: bool = False) -> Findings:
    """i. Attempt 1's task and Spark driver paused (SIGSTOP) before it writes, the task given
    up for dead and retried: attempt 2 pre-commits and commits; then attempt 1 resumes
    (SIGCONT), writes staging late and is fenced: the final tables do not change.
    With `reprocess`, all of this on a reprocessing of the run's committed checkpoint."""
    found = Findings()
    world.produce(ORDERS)
    run = Run("zombie")
    if reprocess:
        found.expect(world.run(run_id=run.run_id).state == "success", "the run to reprocess failed")
    begun = world.task("begin", ["--run-id", run.run_id, "--interval-end", datetime.now(timezone.utc).isoformat(),
                                 *(["--reprocess"] if reprocess else [])], run, 1)
    run.checkpoint = begun.result["checkpoint"]
    checkpoint = ["--checkpoint-id", str(run.checkpoint)]
    zombie, log = world.start("increment", checkpoint, run, 1, "increment.before_write=sleep:5")
    wait_for(log, "fault injected at increment.before_write", zombie)
    # The task and its job's processes paused (the driver, or the Spark Connect client's
    # process): given up for dead, as a worker that stopped heartbeating is; the task keeps
    # reading the job's output once resumed.
    drivers = world.signal_attempt(run.checkpoint, 1, signal.SIGSTOP)
    paused = [(pid, JOB_MARKER) for pid in drivers]
    os.kill(zombie.pid, signal.SIGSTOP)
    paused.append((zombie.pid, "tests.faults.task"))
    retry = world.task("increment", checkpoint, run, 2)
    commit = world.task("commit", [*checkpoint, "--try", "1"], run, 1)
    found.expect(retry.result == {"attempt": 2} and commit.result == {"outcome": "committed now"},
                 f"retry {retry.result}, commit {commit.result}")
    committed = world.tables()
    for pid, _ in paused:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 300
    while any(alive(pid, marker) for pid, marker in paused) and time.monotonic() < deadline:
        time.sleep(0.5)
    zombie.wait(30)
    found.expect(not any(alive(pid, marker) for pid, marker in paused),
                 "the resumed attempt 1 did not end within 300 s")
    found.expect("fenced: attempt 1 of checkpoint" in log.read_text(errors="replace"),
                 "the resumed attempt 1 was not fenced (no 'fenced:' in its log)")
    found.expect(world.tables() == committed, "the resumed zombie changed the final tables")
    late = _staged_rows(world, run.checkpoint, 1)
    found.expect(late > 0, f"the resumed attempt 1 left no staging rows of checkpoint {run.checkpoint}: "
                           "the scenario did not test a late write")
    world.run()
    left = _staged_rows(world, run.checkpoint, 1)
    found.expect(left == 0, f"the next run's recovery left {left} of {late} late staging rows of attempt 1 "
                            f"of checkpoint {run.checkpoint}")
    return found


def worker_killed_mid_write(world: World) -> Findings:
    """p. On the standalone cluster, a worker and its executor SIGKILLed once the attempt's
    records are read and cached, before any is staged: the executor held part of the cached
    records, which Spark reads again from Kafka for the staging writes, on the worker left."""
    found = Findings()
    world.produce(ORDERS)
    point, killed = "increment.before_write", []
    run = world.run(faults={("increment", 1): f"{point}=sleep:3"},
                    when={("increment", 1): (point, lambda r: killed.extend(spark_cluster.kill_a_worker()))})
    spark_cluster.start("standalone")  # the killed worker again, for what follows
    found.expect(bool(killed), "no worker with an executor to kill")
    found.expect(run.state == "success", f"run {run.run_id} {run.state}")
    return found


def connect_server_restarted(world: World) -> Findings:
    """r. The Spark Connect server restarted once the attempt's records are read and cached: the
    attempt fails (its session and cached records are gone with the server), a retry on
    the new server commits."""
    point = "increment.before_write"
    found, run = _retried(world, "increment", f"{point}=sleep:1",
                          (point, lambda r: (spark_cluster.stop("connect"), spark_cluster.start("connect"))))
    _expect_attempts(found, world, run.checkpoint, ["aborted", "committed"])
    return found


def _reprocessing_of(world: World, run: Run) -> tuple[int, dict]:
    """(checkpoint it replays, rows it replaced per sink) of a reprocessing run's checkpoint."""
    [(replays, replaced)] = world.query("SELECT replays, replaced FROM exactly_once.checkpoints WHERE id = %s",
                                        run.checkpoint)
    return replays, replaced or {}


def _expect_same_rows_replaced(found: Findings, world: World, run: Run, replays: int) -> None:
    """A reprocessing with the configuration it replays puts in what it took back."""
    replayed, replaced = _reprocessing_of(world, run)
    found.expect(replayed == replays, f"checkpoint {run.checkpoint} replays {replayed}, not {replays}")
    found.expect(bool(replaced) and all(r["old"] == r["new"] for r in replaced.values()),
                 f"a reprocessing with the same configuration replaced {replaced}")


def reprocess_crash_after_pre_commit(world: World) -> Findings:
    """m. A reprocessing's increment task dies after its attempt pre-committed: the retry
    runs nothing, commit replaces the checkpoint's rows once."""
    found = Findings()
    world.produce(ORDERS)
    first = world.run()
    run = world.run(run_id=first.run_id, reprocess=True, faults={("increment", 1): "increment_task.after_job=exit"})
    found.expect(run.state == "success" and run.tries_of("increment")[-1].result == {"attempt": None},
                 f"run {run.state}; the retry: {run.tries_of('increment')[-1].result}")
    _expect_attempts(found, world, run.checkpoint, ["committed"])
    _expect_same_rows_replaced(found, world, run, first.checkpoint)
    return found


def _waits_on_an_advisory_lock(world: World, process) -> bool:
    """Whether a session of the pipeline database waits on an advisory lock before `process` ends."""
    while process.poll() is None:
        if world.query("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock' AND wait_event = 'advisory'")[0][0]:
            return True
        time.sleep(0.2)
    return False


def reprocess_races_a_run(world: World) -> Findings:
    """n. A reprocessing's commit while a scheduled run's commit holds its merged rows
    uncommitted (60 s inside its transaction): the reprocessing's recompute waits for it
    (it commits alone) instead of missing its contribution; both commit."""
    found = Findings()
    world.produce(ORDERS)
    first = world.run()
    world.produce(ORDERS)
    again = Run(first.run_id)
    begun = world.task("begin", ["--run-id", again.run_id, "--interval-end", datetime.now(timezone.utc).isoformat(),
                                 "--reprocess"], again, 1)
    again.checkpoint = begun.result["checkpoint"]
    runs: dict[str, Run] = {}
    scheduled = threading.Thread(target=lambda: runs.__setitem__("scheduled", world.run(
        run_id="scheduled", faults={("commit", 1): "commit.before_commit=sleep:60"})))
    scheduled.start()
    wait_for(world.folder / "scheduled-commit-try1.log", "fault injected at commit.before_commit")
    checkpoint = ["--checkpoint-id", str(again.checkpoint)]
    increment = world.task("increment", checkpoint, again, 1)
    committing, log = world.start("commit", [*checkpoint, "--try", "1"], again, 1, None)
    waited = _waits_on_an_advisory_lock(world, committing)
    commit = finished("commit", 1, committing.wait(TASK_TIMEOUT), log)
    scheduled.join()
    found.expect(increment.result == {"attempt": 1} and commit.result == {"outcome": "committed now"},
                 f"reprocessing: increment {increment.result}, commit {commit.result}")
    found.expect(waited, "the reprocessing's commit never waited on the commit lock: the race did not happen")
    found.expect(runs["scheduled"].state == "success" and not runs["scheduled"].empty,
                 f"the scheduled run: {runs['scheduled'].state}, empty {runs['scheduled'].empty}")
    _expect_same_rows_replaced(found, world, again, first.checkpoint)
    return found


def retries_exhausted_taken_over(world: World) -> Findings:
    """j. Every try of a run's increment fails; once its lease runs out, the next run's
    recovery aborts its checkpoint and plans exactly its ranges again."""
    found = Findings()
    world.produce(ORDERS)
    run = world.run(faults={("increment", ALL_TRIES): "increment.before_pre_commit=exit"}, retries={"increment": 1})
    found.expect(run.state == "failed", f"run {run.run_id} {run.state}")
    lease_until, = world.query("SELECT lease_until FROM exactly_once.checkpoints WHERE id = %s", run.checkpoint)[0]
    time.sleep(max(0.0, (lease_until - datetime.now(timezone.utc)).total_seconds()) + 1)
    world.normal_runs()
    found.expect(world.state(run.checkpoint) == "aborted", f"checkpoint {run.checkpoint} {world.state(run.checkpoint)}")
    taken = world.query("SELECT DISTINCT replanned_by FROM exactly_once.checkpoint_ranges WHERE checkpoint_id = %s "
                        "AND to_offset > from_offset", run.checkpoint)
    found.expect(len(taken) == 1 and taken[0][0] is not None and world.state(taken[0][0]) == "committed",
                 f"ranges of checkpoint {run.checkpoint} replanned by {taken}")
    return found


def retention_deleted_unprocessed(world: World) -> Findings:
    """k. Retention deletes offsets of partition 0 that no run has read: the next run fails
    naming them; allowed to lose data, the pipeline records the gap and goes on."""
    found = Findings()
    world.produce(ORDERS)
    world.normal_runs()
    frontier, = world.query("SELECT frontier FROM exactly_once.partitions WHERE pipeline = %s AND partition = 0",
                            world.name)[0]
    world.produce(ORDERS)
    cut = frontier + 100
    admin = AdminClient({"bootstrap.servers": world.servers})
    [deleted] = admin.delete_records([TopicPartition(world.name, 0, cut)]).values()
    deleted.result(timeout=30)
    refused = world.run()
    message = f"{world.name}[0]: offsets {frontier}..{cut - 1} ({cut - frontier} records) were deleted"
    found.expect(refused.state == "failed" and message in refused.tries_of("begin")[0].output,
                 f"expected the run to fail with {message!r}")
    world.register(allow_data_loss=True)
    world.normal_runs()
    gaps = world.query("SELECT partition, from_offset, to_offset FROM exactly_once.gaps WHERE pipeline = %s",
                       world.name)
    found.expect(gaps == [(0, frontier, cut)], f"gaps {gaps}, expected {[(0, frontier, cut)]}")
    found.lost_to_retention = lambda m: m.partition() == 0 and frontier <= m.offset() < cut
    return found


def commit_retries_exhausted(world: World) -> Findings:
    """l. Every try of the commit task fails: the checkpoint stays pre-committed and the
    next run's recovery commits it before planning."""
    found = Findings()
    world.produce(ORDERS)
    run = world.run(faults={("commit", ALL_TRIES): "commit.before_commit=raise"}, retries={"commit": 1})
    found.expect(run.state == "failed" and world.state(run.checkpoint) == "precommitted",
                 f"run {run.state}, checkpoint {world.state(run.checkpoint)}")
    world.produce(ORDERS)
    world.run()
    found.expect(world.state(run.checkpoint) == "committed",
                 f"after the next run, checkpoint {run.checkpoint} {world.state(run.checkpoint)}, expected committed")
    return found


SCENARIOS: dict[str, tuple[str, Callable[[World], Findings], dict]] = {
    "a": ("spark-submit killed mid-write", spark_killed_mid_write, {}),
    "b": ("job fails before pre-commit", job_fails_before_pre_commit, {}),
    "c": ("crash after pre-commit", crash_after_pre_commit, {}),
    "d": ("commit connection killed", commit_connection_killed, {}),
    "e": ("crash after COMMIT", crash_after_commit, {}),
    "f1": ("PostgreSQL restart in write", postgres_restarted_during_write, {}),
    "f2": ("PostgreSQL restart in commit", postgres_restarted_during_commit, {}),
    "g": ("Kafka restart in read", kafka_restarted_during_read, {}),
    "h": ("two runs plan at once", runs_planning_at_once, {}),
    "i": ("zombie attempt resumed", zombie_attempt, {}),
    "j": ("increment retries exhausted", retries_exhausted_taken_over, {"lease": timedelta(seconds=20)}),
    "k": ("retention deleted offsets", retention_deleted_unprocessed, {}),
    "l": ("commit retries exhausted", commit_retries_exhausted, {}),
    "m": ("reprocess: crash after pre-commit", reprocess_crash_after_pre_commit, {}),
    "n": ("reprocess racing a scheduled run", reprocess_races_a_run, {}),
    "o": ("reprocess: zombie attempt", partial(zombie_attempt, reprocess=True), {}),
    # Spark beyond local[2] (exactly_once_stack.spark_cluster), with the demo's UDF variant
    "p": ("standalone: worker killed mid-write", worker_killed_mid_write, {"spark": "standalone"}),
    "q": ("standalone: driver killed mid-write", spark_killed_mid_write, {"spark": "standalone"}),
    "r": ("connect: server restarted mid-job", connect_server_restarted, {"spark": "connect"}),
    "s": ("connect: zombie task resumed", zombie_attempt, {"spark": "connect"}),
    # a kafka sink (tests/faults/publishing.py)
    "t": ("publisher killed mid-transaction", publisher_killed_mid_transaction, {"publishes": True}),
    "u": ("zombie publisher fenced", zombie_publisher, {"publishes": True}),
    "v": ("Kafka restart in publish", broker_restarted_mid_publish, {"publishes": True}),
    "w": ("commit rolled back: nothing published", commit_rolled_back, {"publishes": True}),
    "x": ("publisher slower than its timeout", publisher_too_slow, {"publishes": True}),
}


def run_scenario(key: str, seed: int, servers: str, db_url: str) -> tuple[World, Verdict]:
    _, scenario, options = SCENARIOS[key]
    started = spark_cluster.start(options.get("spark", "local"))
    try:
        world = World(key, seed, servers, db_url, **options)
        findings = scenario(world)
        world.normal_runs()  # whatever the fault left behind, normal runs must catch up
        return world, world.verdict(findings, findings.lost_to_retention)
    finally:
        spark_cluster.stop_named(started)
