"""A pipeline's transform, found from its configured 'module:function'."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from exactly_once.config import PipelineConfig
from exactly_once.errors import ConfigError


def find_transform(spec: str) -> Callable:
    """The function of a 'module:function'; ConfigError saying why not (no retry fixes it) when
    the module does not import or has no such function."""
    module, _, name = spec.partition(":")
    try:
        found = importlib.import_module(module)
    except Exception as error:  # a SyntaxError or whatever the module raises is the user's to see
        raise ConfigError(f"module {module!r} does not import: {type(error).__name__}: {error}") from error
    function = getattr(found, name, None)
    if not callable(function):
        raise ConfigError(f"module {module!r} has no function {name!r}")
    return function


def load_transform(config: PipelineConfig) -> Callable | None:
    """The pipeline's transform function; None when it has none. ConfigError naming the pipeline
    and the transform when it cannot be loaded."""
    if config.transform is None:
        return None
    try:
        return find_transform(config.transform)
    except ConfigError as error:
        raise ConfigError(f"pipeline {config.name!r}: transform {config.transform!r}: {error}") from error
