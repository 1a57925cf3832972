"""SQL lives in the project's sql/ folder; this reads it."""

from __future__ import annotations

import os
import re
from functools import cache
from importlib.resources import files
from pathlib import Path

CHECKOUT_SQL = Path(__file__).resolve().parents[2] / "sql"
# Beside plugins/ in a checkout; inside the package when it was imported from the job's code
# archive (exactly_once.spark.shipping: a driver without the checkout); EXACTLY_ONCE_SQL_DIR where
# the package is installed alone.
SQL_DIR = Path(os.environ["EXACTLY_ONCE_SQL_DIR"]) if "EXACTLY_ONCE_SQL_DIR" in os.environ else \
    CHECKOUT_SQL if Path(__file__).is_file() and CHECKOUT_SQL.is_dir() else files("exactly_once") / "sql"


@cache
def text(relative: str) -> str:
    return (SQL_DIR / relative).read_text()


@cache
def named(relative: str) -> dict[str, str]:
    """The statements of a file split at `-- name: <name>` lines."""
    parts = re.split(r"^-- name: (\w+)\s*$", text(relative), flags=re.MULTILINE)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2])}
