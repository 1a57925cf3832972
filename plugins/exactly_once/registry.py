"""Plug-ins found by name: a package's modules, each exposing one object (a sink mode's
`MODE`, a value format's `FORMAT`). Adding one is adding a module; nothing else is edited."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any


class Registry:
    def __init__(self, package: str, attribute: str, kind: str):
        self.package, self.attribute, self.kind = package, attribute, kind

    def names(self) -> list[str]:
        path = importlib.import_module(self.package).__path__
        return sorted(m.name for m in pkgutil.iter_modules(path) if not m.name.startswith("_"))

    def get(self, name: str) -> Any:
        if name not in self.names():
            raise ValueError(f"unknown {self.kind} {name!r}: the {self.kind}s are {', '.join(self.names())}")
        return getattr(importlib.import_module(f"{self.package}.{name}"), self.attribute)
