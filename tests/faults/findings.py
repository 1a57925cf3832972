"""What a fault scenario found wrong, and steps the scenarios share (tests/faults/scenarios.py,
tests/faults/publishing.py)."""

from __future__ import annotations

from collections.abc import Callable

from tests.faults.world import World

ORDERS = 4000  # a scenario's batch: 8 transactions of 500 (the 7th aborted), 4 malformed orders


class Findings(list):
    """What a scenario found wrong, and which records retention took from the oracle."""

    def __init__(self):
        super().__init__()
        self.lost_to_retention: Callable[[object], bool] = lambda record: False

    def expect(self, holds: bool, what: str) -> None:
        if not holds:
            self.append(what)


def restart(service) -> None:
    """Stops and starts a local service (exactly_once_stack.kafka, .postgres)."""
    service.stop()
    service.start()


def restarted_during(world: World, task: str, point: str, service, wait: float) -> Findings:
    """Orders produced, then a run whose `task` waits `wait` seconds at fault `point` on its first
    try while `service` restarts; the run must succeed (the task, or its retry, gets through)."""
    found = Findings()
    world.produce(ORDERS)
    run = world.run(faults={(task, 1): f"{point}=sleep:{wait}"}, when={(task, 1): (point, lambda r: restart(service))})
    found.expect(run.state == "success", f"run {run.run_id} {run.state}")
    return found
