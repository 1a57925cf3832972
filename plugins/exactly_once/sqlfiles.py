"""SQL lives in the package's sql/ folder (package data of the wheel); this reads it."""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files
from pathlib import Path

# A folder beside this module when the package is installed or in a checkout; a folder of the
# code archive (exactly_once.spark.shipping) when the job imported it from its zip.
SQL_DIR = Path(__file__).resolve().with_name("sql") if Path(__file__).is_file() else files("exactly_once") / "sql"


@cache
def text(relative: str) -> str:
    return (SQL_DIR / relative).read_text()


@cache
def named(relative: str) -> dict[str, str]:
    """The statements of a file split at `-- name: <name>` lines."""
    parts = re.split(r"^-- name: (\w+)\s*$", text(relative), flags=re.MULTILINE)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2])}
