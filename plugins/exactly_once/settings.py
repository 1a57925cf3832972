"""Settings the library reads from the environment (credentials never live in code)."""

from __future__ import annotations

import os


def required(variable: str, meaning: str) -> str:
    found = os.environ.get(variable)
    if not found:
        raise RuntimeError(f"{variable} is not set: it must hold {meaning} "
                           "(`source .local/env.sh` for the local stack)")
    return found
