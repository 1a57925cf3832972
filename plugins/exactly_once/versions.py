"""A pipeline's configuration version: what the first task checks once (the preflight),
what each attempt records it ran with, and what tells one configuration from the next."""

from __future__ import annotations

import hashlib
import importlib.util
from functools import cache
from pathlib import Path

from exactly_once.config import PipelineConfig
from exactly_once.sqlfiles import SQL_DIR


def config_version(config: PipelineConfig) -> str:
    """A hash of the configuration as loaded, of its transform module's source and of the
    library's version: a deploy that changes any of them is a new version. Found without
    importing the transform's module."""
    digest = hashlib.sha256(config.model_dump_json().encode())
    digest.update(f"\0{library_version()}\0".encode())
    if config.transform:
        digest.update(_source(config.transform.partition(":")[0]))
    return digest.hexdigest()[:16]


def _source(module: str) -> bytes:
    try:
        spec = importlib.util.find_spec(module)
    except Exception:  # a parent package that does not import: the preflight names it
        spec = None
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        return b"\0not found"
    return Path(spec.origin).read_bytes()


@cache
def library_version() -> str:
    """The library's code version: a hash of its modules and SQL files as deployed (a
    checkout has no package version to read)."""
    digest = hashlib.sha256()
    for folder, pattern in ((Path(__file__).parent, "*.py"), (SQL_DIR, "*.sql")):
        for path in sorted(folder.rglob(pattern)):
            digest.update(f"{path.relative_to(folder)}\0".encode() + path.read_bytes())
    return digest.hexdigest()[:12]
