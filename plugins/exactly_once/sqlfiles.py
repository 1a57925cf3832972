"""SQL lives in the project's sql/ folder; this reads it."""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path

# Beside plugins/ in a checkout; EXACTLY_ONCE_SQL_DIR where the package is shipped alone.
SQL_DIR = Path(os.environ.get("EXACTLY_ONCE_SQL_DIR", Path(__file__).resolve().parents[2] / "sql"))


@cache
def text(relative: str) -> str:
    return (SQL_DIR / relative).read_text()


@cache
def named(relative: str) -> dict[str, str]:
    """The statements of a file split at `-- name: <name>` lines."""
    parts = re.split(r"^-- name: (\w+)\s*$", text(relative), flags=re.MULTILINE)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2])}
