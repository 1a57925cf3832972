"""Named fault points: inert unless switched on, so tests can crash a run exactly there.

EXACTLY_ONCE_FAULTS="commit.before_commit=raise,increment.before_pre_commit=exit"
switches points on; an action is `raise` (InjectedFault), `exit` (the process dies
at once, as in a crash) or `sleep:<seconds>` (time for a test to kill, pause or
restart something while the process waits there). A point that fires says so on
stderr first, so a test watching the process's output knows where it is.
"""

from __future__ import annotations

import os
import sys
import time

ENV = "EXACTLY_ONCE_FAULTS"


class InjectedFault(RuntimeError):
    pass


def point(name: str) -> None:
    for item in filter(None, os.environ.get(ENV, "").split(",")):
        where, _, action = item.strip().partition("=")
        if where != name:
            continue
        print(f"fault injected at {name}: {action}", file=sys.stderr, flush=True)
        if action == "raise":
            raise InjectedFault(f"fault injected at {name}")
        if action == "exit":
            os._exit(197)
        if action.startswith("sleep:"):
            time.sleep(float(action.removeprefix("sleep:")))
        else:
            raise ValueError(f"{ENV}: unknown action {action!r} for point {name!r}")
