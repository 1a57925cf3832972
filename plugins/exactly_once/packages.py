"""The files that make the code a pipeline's Spark job runs: the library's package and the
top-level package of the pipeline's transform, found without importing them. The job
ships them (exactly_once.spark.shipping) and a configuration's version hashes them
(exactly_once.ledger.versions). The COPY staging writer's jar is in the package too, for
Spark's classpath (`python -m exactly_once jar`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from exactly_once.config import PipelineConfig
from exactly_once.errors import ConfigError

LIBRARY = Path(__file__).resolve().parent  # the library's package, subpackages and all
COPY_WRITER_JAR = LIBRARY / "jars" / "exactly-once-copy.jar"  # built from jvm/ by ./dev build and ./dev setup


def transform_package(config: PipelineConfig) -> tuple[Path, str]:
    """The folder and name of the transform module's top-level package (or the module alone)."""
    top = config.transform.partition(":")[0].split(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.origin:
        raise ConfigError(f"pipeline {config.name!r}: the transform's module {top!r} is not importable here, so "
                          "it cannot be shipped to the Spark job")
    origin = Path(spec.origin)
    return (origin.parent, top) if origin.name == "__init__.py" else (origin, top)


def package_files(location: Path, name: str) -> list[tuple[str, Path]]:
    """(name in the archive, file) of a package's modules and data (no caches), or of one module."""
    if location.is_file():
        return [(f"{name}.py", location)]
    return [(f"{name}/{p.relative_to(location)}", p) for p in sorted(location.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")]
