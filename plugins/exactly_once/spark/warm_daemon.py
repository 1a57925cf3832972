"""PySpark's daemon of Python workers (`pyspark.daemon`) with what an Arrow-optimized UDF's
evaluation imports — pandas, pyarrow, PySpark's Arrow serializers — imported before it forks
them. A task whose UDF raises loses its worker, and the next task gets a fresh one from the
daemon: record isolation fails a job at each step of its search. A fresh worker of PySpark's
own daemon imported them itself: a probe after a failing one took 0.5–1.2 s longer on a
2-core machine than with this daemon's workers, which have them (`tests/benchmarks/udf_workers.py`,
issue 63).

Spark starts it as `python -m exactly_once.spark.warm_daemon` (`spark.python.daemon.module`)
before any task, so without the job's code archive on its path: `settings` names it only
where the workers are sure to import it.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from collections.abc import Mapping
from contextlib import suppress
from importlib.machinery import PathFinder

DAEMON_MODULE = "spark.python.daemon.module"
MODULE = "exactly_once.spark.warm_daemon"
PRELOADED = ("pandas", "pyarrow", "pyspark.sql.pandas.serializers")
# Read as the libraries load: numpy's OpenBLAS starts a pool of threads unless told one, and
# pyarrow's jemalloc a thread that purges memory. Their workers inherit what was loaded.
SINGLE_THREADED = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}
THREADS = "/proc/self/task"  # Linux: one entry per thread of the process


def settings(conf: Mapping[str, str], environment: Mapping[str, str] = os.environ,
             path: list[str] | None = None) -> dict[str, str]:
    """The Spark setting that makes this module the daemon, given the job's Spark `conf` (before
    its context starts): for a local master (`local`, `local[N]`) on Linux whose Python workers
    run this interpreter's environment (the same `bin` folder: two virtual environments of one
    Python are not the same), when the package is importable from a folder of its path (not
    only from the code archive, a zip). Not for a cluster's executors, whose Python may not
    have it, nor when the job's settings name a daemon already."""
    master = conf.get("spark.master", "")
    if not (master == "local" or master.startswith("local[")) or DAEMON_MODULE in conf \
            or not os.path.isdir(THREADS):
        return {}
    python = conf.get("spark.pyspark.python") or environment.get("PYSPARK_PYTHON") or "python3"
    if _environment(shutil.which(python) or python) != _environment(sys.executable):
        return {}
    folders = [p for p in (sys.path if path is None else path) if p and os.path.isdir(p)]
    package = PathFinder.find_spec("exactly_once", folders)
    if package is None or not any(os.path.isfile(os.path.join(where, "spark", "warm_daemon.py"))
                                  for where in package.submodule_search_locations or ()):
        return {}
    return {DAEMON_MODULE: MODULE}


def _environment(python: str) -> str:
    """The folder an interpreter runs from, its links resolved but its own: a virtual
    environment's `bin/python` links to the Python it was made from, which has other packages."""
    return os.path.realpath(os.path.dirname(os.path.abspath(python)))


def _preload() -> bool:
    """Imports PRELOADED, their libraries' own threads off while they load; whether the daemon
    still runs a single thread. PySpark's daemon imports nothing of them before it forks, as a
    thread running at a fork (a lock it holds) can hang the forked worker."""
    saved = {name: os.environ.get(name) for name in SINGLE_THREADED}
    os.environ.update(SINGLE_THREADED)
    try:
        for module in PRELOADED:
            with suppress(ImportError):  # without pandas and pyarrow no UDF is Arrow-optimized
                importlib.import_module(module)
    except Exception:  # a broken build (numpy's dtype size changed, ...): PySpark's daemon fails only Arrow UDFs
        return False
    finally:
        for name, value in saved.items():  # the workers' environment is Spark's
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return len(os.listdir(THREADS)) == 1


def _forget_the_package() -> None:
    """Starting this module imported `exactly_once` from the installed folder; a worker must
    import it from the job's code archive, which it puts on its path, as PySpark's daemon's do."""
    for name in [name for name in sys.modules if name == "exactly_once" or name.startswith("exactly_once.")]:
        del sys.modules[name]


if __name__ == "__main__":
    if not _preload():  # a thread of some library runs: PySpark's own daemon, as if this one were not named
        os.execv(sys.executable, [sys.executable, "-m", "pyspark.daemon", *sys.argv[1:]])
    _forget_the_package()
    from pyspark import daemon

    daemon.manager()
