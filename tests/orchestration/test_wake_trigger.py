"""The trigger that wakes a DAG on records (`exactly_once.orchestration.wake.RecordsWaiting`),
polled as Airflow's triggerer polls it, against the stack's Kafka (through kafka_default's
SASL_SSL listener) and the ledger (as the read role): nothing waits, nothing wakes; records
wait, it wakes saying how many; while they wait it wakes again no sooner than its minimum gap;
once a run took them, it stays quiet. (CI's slice: the scheduler's woken runs are the heavy
tests/dags/test_wake.py.)"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from exactly_once.orchestration.wake import RecordsWaiting
from tests.ledger.harness import Pipeline, workload

MIN_GAP = 3.0
POLL_EVERY = 0.2


class Woken:
    """The trigger's events, with when each came, from a loop in a thread of its own."""

    def __init__(self, trigger: RecordsWaiting):
        self.events: list[tuple[float, dict]] = []
        self._loop = asyncio.new_event_loop()
        self._task = self._loop.create_task(self._collect(trigger))
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._task,), daemon=True)
        self._thread.start()

    async def _collect(self, trigger: RecordsWaiting) -> None:
        try:
            async for event in trigger.run():
                self.events.append((time.monotonic(), event.payload))
        except asyncio.CancelledError:  # stop(): the triggerer cancels a trigger so
            pass

    def wait_for(self, count: int, timeout: float = 30) -> list[tuple[float, dict]]:
        deadline = time.monotonic() + timeout
        while len(self.events) < count:
            assert time.monotonic() < deadline, f"{count} event(s) expected within {timeout} s: {self.events}"
            time.sleep(POLL_EVERY)
        return self.events

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(10)


@pytest.fixture
def pipeline(ledger_db, kafka_servers, topic) -> Pipeline:
    return Pipeline(ledger_db, kafka_servers, topic)


def test_records_wake_the_trigger_at_most_once_a_gap_and_a_run_that_took_them_quiets_it(pipeline, stack_env):
    woken = Woken(RecordsWaiting(pipeline.config.model_dump_json(), MIN_GAP, POLL_EVERY))
    try:
        time.sleep(10 * POLL_EVERY)
        assert woken.events == []  # a topic with nothing in it, a pipeline that starts at the earliest offsets

        pipeline.produce(workload(0))
        [(first, payload)] = woken.wait_for(1)
        assert payload["pipeline"] == pipeline.config.name
        assert payload["reason"].endswith(" records wait"), payload

        # Nothing took them: it wakes again, once the minimum gap has passed, not every poll.
        [_, (second, again)] = woken.wait_for(2)[:2]
        assert second - first >= MIN_GAP and again["reason"].endswith(" records wait"), (second - first, again)

        pipeline.run_once()  # the woken run plans and commits what waited
        settled = len(woken.wait_for(2))
        time.sleep(MIN_GAP + 10 * POLL_EVERY)
        assert len(woken.events) <= settled + 1, woken.events  # at most the poll racing the commit
        quiet = len(woken.events)
        time.sleep(MIN_GAP + 10 * POLL_EVERY)
        assert len(woken.events) == quiet, woken.events[quiet:]
    finally:
        woken.stop()
    pipeline.assert_exact()
