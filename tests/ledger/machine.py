"""Support for the ledger's stateful property test (tests/ledger/test_protocol_machine.py):
a topic read once, a clock the test moves, the ledger's state as the checks read it, the
checks on pre-commits, and the drive to quiescence at the end of each example (the
operations' threads and pauses: tests/ledger/paused_steps.py).
"""

from __future__ import annotations

from contextlib import closing
from datetime import datetime, timedelta, timezone

import psycopg2

from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.checkpoints import Outcome, State, TaskTry
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.planning import OffsetRange, PartitionOffsets
from exactly_once.operate import stalls
from exactly_once.orchestration import tasks
from tests import oracle
from tests.ledger.harness import Driver, row_of
from tests.oracle import Record

AWAITING = (State.PRECOMMITTED.value, State.STALLED.value, State.COMMITTED.value)  # a recorded pre-commit holds
SNAPSHOT = """
SELECT k.id, k.state::text, k.attempt, k.precommitted_attempt, k.staged, k.replays,
       EXISTS (SELECT FROM exactly_once.checkpoint_ranges r
               WHERE r.checkpoint_id = coalesce(k.replays, k.id) AND r.from_offset < r.to_offset)
FROM exactly_once.checkpoints k WHERE k.pipeline = %(pipeline)s ORDER BY k.id;
"""
ATTEMPTS = """
SELECT a.checkpoint_id, a.attempt, a.state::text FROM exactly_once.attempts a
JOIN exactly_once.checkpoints k ON k.id = a.checkpoint_id WHERE k.pipeline = %(pipeline)s ORDER BY 1, 2;
"""


class Clock:
    """The ledger's clock: the test moves it (a second per step, a lease's length to expire one)."""

    def __init__(self):
        self.at = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.at

    def advance(self, by: timedelta) -> None:
        self.at += by


class Topic:
    """The module's topic as Kafka answers planning (it never changes after it was produced)
    and every committed record in it, read once: records are immutable, so slicing them by
    offset is what a read of a checkpoint's ranges returns."""

    def __init__(self, servers: str, name: str):
        self.name = name
        with KafkaOffsets(KafkaClient.at(servers)) as kafka:
            self._offsets = kafka.topic_offsets(name, None, None)
        whole = tuple(OffsetRange(name, p, o.log_start, o.last_stable) for p, o in self._offsets.items())
        self.records = Driver(None, servers, None)._read(whole)

    # -- exactly_once.ledger.planning.OffsetSource ------------------------------------------

    def offsets(self, topic: str, partition: int, interval_start, interval_end, start_time=None) -> PartitionOffsets:
        return self.topic_offsets(topic, interval_start, interval_end, start_time)[partition]

    def topic_offsets(self, topic: str, interval_start, interval_end, start_time=None) -> dict[int, PartitionOffsets]:
        assert (topic, interval_start, interval_end, start_time) == (self.name, None, None, None)
        return self._offsets

    def within(self, ranges) -> list[Record]:
        return [r for r in self.records if oracle.in_ranges(r, ranges)]


class SlicingDriver(Driver):
    """The harness's driver (it writes staging rows as the job does), reading from `Topic`."""

    def __init__(self, ledger, topic: Topic, servers: str, db_url: str):
        super().__init__(ledger, servers, db_url)
        self.topic = topic

    def read(self, ranges) -> list[Record]:
        return self.topic.within(ranges)

    def report(self, records: list[Record]) -> dict[str, int]:
        """The rows per staging table the job counts as it writes `records` once."""
        expected = oracle.expected(self.ledger.config, records, row_of)
        return {name: len(rows) for name, rows in expected.tables.items()}


def counts(staged) -> dict[str, int]:
    """Row counts per staging table, from a Committable's `staged` or the ledger's JSON."""
    return {name: s["rows"] if isinstance(s, dict) else s.rows for name, s in (staged or {}).items()}


def checkpoint_ranges(conn, checkpoint_id: int) -> list[OffsetRange]:
    """The ranges a checkpoint reads (a reprocessing: those of the checkpoint it replays)."""
    with conn.cursor() as cur:
        cur.execute("SELECT topic, partition, from_offset, to_offset FROM exactly_once.checkpoint_ranges "
                    "WHERE checkpoint_id = coalesce((SELECT replays FROM exactly_once.checkpoints WHERE id = %s), %s)",
                    (checkpoint_id, checkpoint_id))
        found = cur.fetchall()
    conn.rollback()
    return [OffsetRange(*r) for r in found]


def committed_records(topic: Topic, db_url: str, pipeline: str) -> list[Record]:
    """The committed Kafka records inside the pipeline's committed ranges."""
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT topic, partition, from_offset, to_offset FROM exactly_once.committed_ranges "
                    "WHERE pipeline = %s", (pipeline,))
        ranges = [OffsetRange(*r) for r in cur.fetchall()]
    return topic.within(ranges)


def quiesce(pipeline, clock: Clock, rounds: int = 40) -> None:
    """Drives the pipeline through the run path until nothing is left: what is pre-committed
    or stalled at commit is committed, other stalls are retried by an operator, open
    checkpoints are run by their (cleared) increment and commit tasks, and new runs begin
    until one finds nothing to read; then every committed record counts exactly once."""
    ledger, driver = pipeline.ledger, pipeline.driver
    with KafkaOffsets(KafkaClient.at(pipeline.servers)) as kafka:
        for n in range(rounds):
            for checkpoint_id, state, precommitted in _open(pipeline):
                if state == "stalled" and precommitted is None:
                    stalls.retry(ledger, checkpoint_id)
                    continue
                cleared = ledger.now()  # the tasks' tries, cleared by an operator where it stalled
                if state in ("planned", "running"):
                    tasks.run_increment(ledger, checkpoint_id, driver.execute, TaskTry(2, cleared))
                assert tasks.commit_checkpoint(ledger, checkpoint_id, 2, cleared) is Outcome.COMMITTED
            clock.advance(timedelta(seconds=1))
            begun = tasks.begin_checkpoint(ledger, kafka, f"quiescence{n}", None, None)
            if begun.checkpoint.is_empty and not _open(pipeline):
                break
        else:
            raise AssertionError(f"the pipeline did not come to rest in {rounds} runs: {_open(pipeline)}")
    pipeline.assert_exact()


def _open(pipeline) -> list[tuple]:
    with closing(psycopg2.connect(pipeline.db_url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, state::text, precommitted_attempt FROM exactly_once.checkpoints "
                    "WHERE pipeline = %s AND state NOT IN ('committed', 'aborted') ORDER BY id",
                    (pipeline.config.name,))
        return cur.fetchall()


def ledger_state(conn, pipeline: str) -> tuple[dict[int, tuple], list[tuple]]:
    """checkpoint → (state, current attempt, pre-committed attempt, its counts, replays, has
    records), and every attempt as (checkpoint, attempt, state)."""
    with conn.cursor() as cur:
        cur.execute(SNAPSHOT, {"pipeline": pipeline})
        checkpoints = {row[0]: (row[1], row[2], row[3], counts(row[4]), row[5], row[6]) for row in cur.fetchall()}
        cur.execute(ATTEMPTS, {"pipeline": pipeline})
        attempts = cur.fetchall()
    conn.rollback()
    return checkpoints, attempts


def assert_pre_commits_kept(cps: dict[int, tuple], attempts: list[tuple], precommits: dict[int, tuple],
                            released_by_operator: set[int]) -> None:
    """What `pre_commit` recorded (`precommits`: checkpoint → (attempt, counts)) is what an
    awaiting or committed checkpoint holds, a pre-commit is never discarded (but by an
    operator's retry), and only the pre-committed attempt commits."""
    for cp, (state, _, pa, staged, _, _) in cps.items():
        if pa is not None and state in AWAITING:
            assert precommits.get(cp) == (pa, staged), \
                f"checkpoint {cp} is {state} with attempt {pa} and counts {staged}, but its pre-commit " \
                f"recorded {precommits.get(cp)}"
    for cp, (attempt, staged) in precommits.items():
        state, _, pa, _, _, _ = cps[cp]
        assert cp in released_by_operator or (state in AWAITING and pa == attempt), \
            f"checkpoint {cp} was pre-committed with attempt {attempt}, and is {state} now (attempt {pa})"
    for cp, attempt, state in attempts:
        assert state != "committed" or cps[cp][2] == attempt, \
            f"attempt {attempt} of checkpoint {cp} committed, but attempt {cps[cp][2]} pre-committed"
