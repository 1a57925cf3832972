"""A pipeline's configuration version: what the first task checks once (the preflight) and
what tells one configuration from the next."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from exactly_once.config import PipelineConfig


def config_version(config: PipelineConfig) -> str:
    """A hash of the configuration as loaded and of its transform module's source: a deploy that
    changes either is a new version. Found without importing the module itself."""
    digest = hashlib.sha256(config.model_dump_json().encode())
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
