"""The ledger's protocol as a stateful property test on real PostgreSQL (issue 44, part 1):
hypothesis draws sequences of begin / start attempt / stage rows (the current attempt's, a
fenced zombie's, a late insert by an attempt already pre-committed) / pre-commit (right and
wrong counts) / commit / abort / crash / lease expiry / reprocess / operator actions /
retention's prune (the clock moved past the reprocess horizon, or not, then one step folding
at most two checkpoints), the harness's driver playing the Spark job, over one pipeline with
a sink of each mode.

Operations also run concurrently at the ledger's own isolation (READ COMMITTED): one may
pause at a fault point inside its transaction, holding its locks, while other steps run
on other connections; a later step resumes or crashes it (tests/ledger/paused_steps.py says how
a step blocked by a paused one goes on). This is where a count and a later statement in
two snapshots would show.

After every step: the final tables equal the oracle over the records of the committed
ranges, each once; `sql/invariants.sql` holds whenever nothing is paused; a pre-committed
checkpoint is never discarded (only an operator's retry releases one stalled at commit),
and only the attempt recorded at pre-commit is committed, with the row counts recorded
then. At the end of each example everything is resumed and the pipeline is driven to
quiescence through the run path: every committed Kafka record counts exactly once.

The default run (CI) is 5 examples, the same every run; EXACTLY_ONCE_MACHINE_EXAMPLES=500 (say)
runs deeper, drawing new ones each time.
"""

from __future__ import annotations

import os
import sys
import uuid
from datetime import timedelta

import psycopg2
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from exactly_once.errors import AttemptFailed
from exactly_once.ledger import replays, retention
from exactly_once.ledger.checkpoints import TaskTry
from exactly_once.ledger.invariants import violations
from exactly_once.ledger.refusals import (Fenced, NotPreCommitted, NotReprocessable, NotRunnable, SentBack,
                                          StagingIncomplete, Stalled)
from exactly_once.operate import stalls
from exactly_once.orchestration import tasks
from tests import oracle
from tests.kafka_records import create_topic, produce_transactions
from tests.ledger.harness import Pipeline, row_of, workload
from tests.ledger.machine import (AWAITING, Clock, SlicingDriver, Topic, assert_pre_commits_kept, checkpoint_ranges,
                                  committed_records, counts, ledger_state, quiesce)
from tests.ledger.paused_steps import Steps, fault_hook

EXAMPLES = int(os.environ.get("EXACTLY_ONCE_MACHINE_EXAMPLES", "5"))
FIXED = "EXACTLY_ONCE_MACHINE_EXAMPLES" not in os.environ  # CI draws the same examples every run
LEASE = timedelta(minutes=10)
HORIZON = timedelta(hours=1)
# Folds of checkpoints beyond the horizon, two per step at most; nothing deleted (history and
# dead letters kept forever), so the oracle still sees every committed range and dead letter.
RETENTION = {"reprocess_horizon": "PT1H", "history": None, "dead_letters": None, "batch": 2}
INDEX = st.integers(0, 5)  # which of the checkpoints (or attempts) a rule acts on, modulo their number
PAUSES = [("begin", "begin.before_commit"), ("start_attempt", "start_attempt.before_commit"),
          ("pre_commit", "pre_commit.before_commit"), ("begin", "commit.before_promote")] + [
    ("commit", f"commit.{point}") for point in ("before_promote", "before_commit", "before_clean_up")]


class LedgerMachine(RuleBasedStateMachine):
    db_url = servers = topic = produced = None  # set by the test from its fixtures
    pruned: list = []  # every prune step's result, over the examples

    def __init__(self):
        super().__init__()
        self.clock, self.steps = Clock(), Steps(self.db_url)
        self.pipeline = Pipeline(self.db_url, self.servers, self.topic.name, connect=self.steps.connect,
                                 clock=self.clock, fault=fault_hook, max_records_per_run=4, lease="PT10M",
                                 stall_after=2, retention=RETENTION)
        self.pipeline.produced = self.produced
        self.ledger = self.pipeline.ledger
        self.driver = self.pipeline.driver = SlicingDriver(self.ledger, self.topic, self.servers, self.db_url)
        self.ledger.pre_commit = self._recording(self.ledger.pre_commit)
        self.ledger.register()  # its staging tables, which the invariants read from the first check
        self.checker = psycopg2.connect(self.db_url)
        self.precommits: dict[int, tuple[int, dict]] = {}  # checkpoint → (attempt, counts) its pre-commit recorded
        self.released_by_operator: set[int] = set()
        self.stale_rows_possible = False  # a zombie's late rows or a crashed clean-up, until a recovery
        self.runs: list[str] = []
        self.cps: dict[int, tuple] = {}
        self.attempts: list[tuple] = []

    def _recording(self, pre_commit):
        def recorded(checkpoint_id, attempt, rows_written, records, spark_seconds=None):
            committable = pre_commit(checkpoint_id, attempt, rows_written, records, spark_seconds)
            self.precommits[checkpoint_id] = (committable.attempt, counts(committable.staged))
            return committable
        return recorded

    # -- what the rules pick from ----------------------------------------------------------------

    def ids(self, *states: str) -> list[int]:
        return [i for i, row in self.cps.items() if not states or row[0] in states]

    def pick(self, ids: list, i: int):
        return ids[i % len(ids)]

    def zombies(self) -> list[tuple[int, int]]:
        """Attempts fenced off: neither a running checkpoint's current one nor the pre-committed one."""
        return [(cp, a) for cp, a, _ in self.attempts
                if not (self.cps[cp][0] == "running" and self.cps[cp][1] == a) and self.cps[cp][2] != a]

    def late(self) -> list[tuple[int, int]]:
        return [(cp, row[2]) for cp, row in self.cps.items() if row[2] is not None and row[0] in AWAITING]

    def step(self, name, work, allowed=(), pause_at=None):
        self.clock.advance(timedelta(seconds=1))
        return self.steps.run(name, work, allowed, pause_at)

    def recovering(self, name, work, allowed):
        """A step that recovers: stale staging rows are gone after it, if nothing was paused
        and it ran to its end (a begin refused by a stall returns before recovering)."""
        quiet, finished = not self.steps.paused, []
        self.step(name, lambda: finished.append(work()), allowed)
        if quiet and finished and not self.steps.paused:
            self.stale_rows_possible = False

    def _ranges(self, checkpoint_id: int):
        return checkpoint_ranges(self.checker, checkpoint_id)

    # -- the rules ---------------------------------------------------------------------------------

    @precondition(lambda self: len(self.ids("planned", "running", "precommitted")) < 2)  # else act on those
    @rule(again=st.booleans(), i=INDEX)
    def begin(self, again, i):
        run = self.pick(self.runs, i) if again and self.runs else f"run{len(self.runs)}"
        self.runs += [] if run in self.runs else [run]
        self.recovering("begin", lambda: self.ledger.begin(run, None, None, self.topic), (Stalled,))

    @precondition(lambda self: self.ids("planned", "running", "stalled"))
    @rule(i=INDEX)
    def start_attempt(self, i):
        cp = self.pick(self.ids("planned", "running", "stalled"), i)
        # A stalled one refuses a try that is no operator's (operator_resume is one).
        self.step("start_attempt", lambda: self.ledger.start_attempt(cp), (NotRunnable, Stalled))

    @precondition(lambda self: self.ids("planned", "running", "stalled"))
    @rule(i=INDEX)
    def run_increment(self, i):
        """A whole attempt through the run path's increment task (start, stage, pre-commit)."""
        cp = self.pick(self.ids("planned", "running", "stalled"), i)
        self.step("run_increment", lambda: tasks.run_increment(self.ledger, cp, self.driver.execute),
                  (NotRunnable, Fenced, AttemptFailed, Stalled))

    @precondition(lambda self: self.ids("running"))
    @rule(i=INDEX)
    def stage_current(self, i):
        cp = self.pick(self.ids("running"), i)
        self.stage(cp, self.cps[cp][1])

    @precondition(lambda self: self.zombies())
    @rule(i=INDEX)
    def stage_zombie(self, i):
        self.stage(*self.pick(self.zombies(), i))

    @precondition(lambda self: self.late())
    @rule(i=INDEX)
    def stage_late(self, i):
        """An attempt writes after it pre-committed: the staging trigger refuses it."""
        cp, attempt = self.pick(self.late(), i)
        records = self.driver.read(self._ranges(cp))
        if not any(self.driver.report(records).values()):
            return  # nothing to insert
        with pytest.raises(psycopg2.errors.InsufficientPrivilege, match="rows are frozen"):
            self.step("stage_late", lambda: self.driver.write_staging(cp, attempt, records))

    def stage(self, cp: int, attempt: int) -> None:
        records = self.driver.read(self._ranges(cp))
        self.step("stage", lambda: self.driver.write_staging(cp, attempt, records),
                  (psycopg2.errors.InsufficientPrivilege,))
        with self.checker.cursor() as cur:
            cur.execute("SELECT state::text = 'running' AND attempt = %s FROM exactly_once.checkpoints WHERE id = %s",
                        (attempt, cp))
            current = cur.fetchone()[0]
        self.checker.rollback()
        self.stale_rows_possible |= not current  # a zombie's rows: recovery deletes them

    @precondition(lambda self: self.ids("running"))
    @rule(i=INDEX, right=st.booleans())
    def pre_commit(self, i, right, pause_at=None):
        cp = self.pick(self.ids("running"), i)
        rows = self.driver.report(self.driver.read(self._ranges(cp)))
        if not right:
            rows["events"] += 1
        work = lambda: self.ledger.pre_commit(cp, self.cps[cp][1], rows, records=sum(rows.values()))  # noqa: E731
        result = self.step("pre_commit", work, (Fenced, StagingIncomplete), pause_at)
        assert right or result is None, f"pre-commit of checkpoint {cp} with wrong counts {rows} was accepted"

    def awaiting(self) -> list[int]:
        """Pre-committed, or stalled at commit."""
        return [i for i, row in self.cps.items() if row[2] is not None and row[0] in AWAITING[:2]]

    @precondition(lambda self: self.awaiting())
    @rule(i=INDEX)
    def commit(self, i, pause_at=None):
        cp = self.pick(self.awaiting(), i)
        self.step("commit", lambda: self.ledger.commit(cp), (NotPreCommitted, Stalled, SentBack), pause_at)

    @precondition(lambda self: self.ids("running"))
    @rule(i=INDEX, retryable=st.booleans())
    def abort_attempt(self, i, retryable):
        cp = self.pick(self.ids("running"), i)
        self.step("abort_attempt", lambda: self.ledger.abort_attempt(cp, self.cps[cp][1], "executor lost", retryable))

    @precondition(lambda self: self.ids("planned", "running", "stalled"))
    @rule(i=INDEX)
    def abort(self, i):
        cp = self.pick(self.ids("planned", "running", "stalled"), i)
        self.step("abort", lambda: self.ledger.abort(cp, "aborted by the test"))

    @precondition(lambda self: len(self.steps.paused) < 2)
    @rule(what=st.sampled_from(PAUSES), i=INDEX, new_run=st.booleans())
    def pause(self, what, i, new_run):
        """Starts an operation that stops at a fault point inside its transaction."""
        kind, point = what
        if kind == "begin":
            run = f"run{len(self.runs)}" if new_run or not self.runs else self.pick(self.runs, i)
            self.runs += [] if run in self.runs else [run]
            self.step("begin", lambda: self.ledger.begin(run, None, None, self.topic), (Stalled,), point)
        elif kind == "start_attempt" and self.ids("planned", "running", "stalled"):
            cp = self.pick(self.ids("planned", "running", "stalled"), i)
            self.step("start_attempt", lambda: self.ledger.start_attempt(cp), (NotRunnable, Stalled), point)
        elif kind == "pre_commit" and self.ids("running"):
            cp = self.pick(self.ids("running"), i)
            attempt, records = self.cps[cp][1], self.driver.read(self._ranges(cp))

            def job_and_pre_commit():  # the attempt's job stages its rows, its task pre-commits them
                rows = self.driver.write_staging(cp, attempt, records)
                return self.ledger.pre_commit(cp, attempt, rows, records=len(records))
            # A write behind another pre-commit of the attempt, paused and then resumed, is refused: frozen.
            self.step("pre_commit", job_and_pre_commit,
                      (Fenced, StagingIncomplete, psycopg2.errors.InsufficientPrivilege), point)
        elif kind == "commit" and self.awaiting():
            self.commit(i, pause_at=point)

    @precondition(lambda self: self.steps.paused)
    @rule(i=INDEX, crash=st.booleans())
    def resume(self, i, crash):
        """Lets a paused operation finish, or crashes it there (its connections terminated)."""
        operation = self.pick(self.steps.paused, i)
        self.stale_rows_possible |= crash and operation.pause_at == "commit.before_clean_up"
        self.steps.resume(operation, crash)

    @precondition(lambda self: self.ids("planned", "running"))
    @rule()
    def expire_leases(self):
        self.clock.advance(LEASE + timedelta(minutes=1))
        self.recovering("recover", self.ledger.recover, (Stalled,))

    def reprocessable(self) -> list[int]:
        return [i for i, row in self.cps.items() if row[0] == "committed" and row[5]]

    @precondition(lambda self: self.reprocessable())
    @rule(i=INDEX)
    def reprocess(self, i):
        """A committed checkpoint replayed with the same configuration: the oracle still holds."""
        cp = self.pick(self.reprocessable(), i)
        self.recovering("reprocess", lambda: replays.reprocess(self.ledger, cp, f"reprocess{cp}"),
                        (NotReprocessable, Stalled))

    @precondition(lambda self: self.ids("committed"))
    @rule(past_horizon=st.booleans())
    def prune(self, past_horizon):
        """Retention's step, between the others (a commit or a reprocessing may be paused
        beside it): the clock moved past the reprocess horizon first, so that every checkpoint
        committed so far is beyond it, or not. The final tables do not change; a reprocessing
        of a folded checkpoint is refused from then on (the reprocess rule allows that)."""
        if past_horizon:
            self.clock.advance(HORIZON + timedelta(minutes=1))
        pruned = self.step("prune", lambda: retention.prune(self.ledger))  # a paused step it waits for goes on
        type(self).pruned.append(pruned)
        assert pruned.folded <= RETENTION["batch"], pruned

    @precondition(lambda self: self.ids("stalled"))
    @rule(i=INDEX)
    def operator_retry(self, i):
        cp = self.pick(self.ids("stalled"), i)
        released = self.step("stalls.retry", lambda: stalls.retry(self.ledger, cp))
        self.released_by_operator |= set(released)

    @precondition(lambda self: self.ids("stalled"))
    @rule(i=INDEX)
    def operator_resume(self, i):
        """A cleared task: the commit of one stalled at commit, else a new attempt."""
        cp = self.pick(self.ids("stalled"), i)
        if self.cps[cp][2] is not None:
            self.step("resume commit", lambda: self.ledger.commit(cp, TaskTry(2, self.ledger.now())), (Stalled,))
        else:
            self.step("resume attempt", lambda: self.ledger.start_attempt(cp, TaskTry(2, self.ledger.now())), (NotRunnable,))

    # -- the checks ----------------------------------------------------------------------------------

    @invariant()
    def checks(self):
        config = self.pipeline.config
        self.cps, self.attempts = ledger_state(self.checker, config.name)
        expected = oracle.expected(config, committed_records(self.topic, self.db_url, config.name), row_of)
        oracle.assert_exact(expected, self.pipeline.actual())
        if not self.steps.paused:
            found = [v for v in violations(self.checker, config)
                     if not (self.stale_rows_possible and v.startswith("staging_left_behind"))]
            assert found == [], found
        assert_pre_commits_kept(self.cps, self.attempts, self.precommits, self.released_by_operator)

    def teardown(self):
        try:
            if sys.exc_info()[0] is None:  # a failed step is reported as it is
                for operation in list(self.steps.paused):
                    self.steps.resume(operation)
                quiesce(self.pipeline, self.clock)
                assert violations(self.checker, self.pipeline.config) == []
        finally:
            self.steps.close()
            self.checker.close()


@pytest.fixture(scope="module")
def records(kafka_servers):
    """A topic of committed and aborted transactions and malformed values, read once."""
    name = f"t_machine_{uuid.uuid4().hex[:8]}"
    create_topic(kafka_servers, name, partitions=3)
    produced = produce_transactions(kafka_servers, name, workload(0, rounds=1))
    return Topic(kafka_servers, name), produced


def test_every_interleaving_of_protocol_steps_keeps_each_committed_record_once(ledger_db, kafka_servers, records):
    LedgerMachine.db_url, LedgerMachine.servers = ledger_db, kafka_servers
    LedgerMachine.topic, LedgerMachine.produced = records
    LedgerMachine.pruned = []
    run_state_machine_as_test(LedgerMachine, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=30, deadline=None, database=None, derandomize=FIXED,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
    assert sum(p.folded for p in LedgerMachine.pruned) > 0, LedgerMachine.pruned  # the examples folded some
