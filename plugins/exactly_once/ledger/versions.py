"""A pipeline's configuration version: what the first task checks once (the preflight),
what each attempt records it ran with, and what tells one configuration from the next."""

from __future__ import annotations

import hashlib
from functools import cache

from exactly_once.config import PipelineConfig
from exactly_once.errors import ConfigError
from exactly_once.packages import LIBRARY, package_files, transform_package
from exactly_once.sqlfiles import SQL_DIR


def config_version(config: PipelineConfig) -> str:
    """A hash of the configuration as loaded, of the transform's code as the job ships it
    (its whole top-level package: a helper module it imports is the transform too) and of
    the library's version: a deploy that changes any of them is a new version. Found
    without importing the transform."""
    digest = hashlib.sha256(config.model_dump_json().encode())
    digest.update(f"\0{library_version()}\0".encode())
    if config.transform:
        digest.update(_shipped_transform(config))
    return digest.hexdigest()[:16]


def _shipped_transform(config: PipelineConfig) -> bytes:
    try:
        files = package_files(*transform_package(config))
    except (ConfigError, ImportError, ValueError):  # not importable here: the preflight names it
        return b"\0not found"
    return b"".join(f"\0{name}\0".encode() + path.read_bytes() for name, path in files)


@cache
def library_version() -> str:
    """The library's code version: a hash of its modules and SQL files as deployed (a
    checkout has no package version to read)."""
    digest = hashlib.sha256()
    for folder, pattern in ((LIBRARY, "*.py"), (SQL_DIR, "*.sql")):
        for path in sorted(folder.rglob(pattern)):
            digest.update(f"{path.relative_to(folder)}\0".encode() + path.read_bytes())
    return digest.hexdigest()[:12]
