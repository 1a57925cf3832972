"""The warm daemon of Python workers (exactly_once.spark.warm_daemon, issue 63): a job
spark-submitted to a local master gets its Python workers from it, with pyarrow imported
before a UDF asks for it, and a worker lost to a UDF raising is replaced by another of
its forks, which imports the package from the job's code archive; it is named only where the
workers are sure to import it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest

from exactly_once.spark.warm_daemon import DAEMON_MODULE, MODULE, settings
from exactly_once_stack.settings import ROOT

PLUGINS = str(ROOT / "plugins")
LOCAL = {"spark.master": "local[2]"}
OURS = {"PYSPARK_PYTHON": sys.executable}

PROBE = """
import json, os, sys
from pyspark.sql import functions as F
from exactly_once.spark.job import submitted_session


def daemon(_):
    forker = f"/proc/{os.getppid()}"  # the process that forked this worker
    with open(f"{forker}/cmdline", "rb") as cmdline:
        return json.dumps([cmdline.read().decode().split(chr(0)), "pyarrow" in sys.modules,
                           len(os.listdir(f"{forker}/task")), "exactly_once" in sys.modules])


def raises(_):
    raise ValueError("raised on purpose")


spark = submitted_session("warm daemon probe")
asked = F.udf(daemon, "string", useArrow=False)  # pickled rows: such a worker never imports pyarrow itself
first = spark.range(1).select(asked("id")).first()[0]
try:
    spark.range(1).select(F.udf(raises, "string", useArrow=False)("id")).collect()
    raised = False
except Exception:
    raised = True
after = spark.range(1).select(asked("id")).first()[0]
print("PROBE " + json.dumps({"setting": spark.sparkContext.getConf().get("%s", None), "first": first,
                             "raised": raised, "after": after}))
spark.stop()
""" % DAEMON_MODULE


def test_a_local_job_gets_its_workers_from_the_warm_daemon_with_pyarrow_imported(stack_env, tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {**os.environ, **OURS, "PYTHONPATH": PLUGINS}
    done = subprocess.run(["spark-submit", "--master", "local[1]", str(script)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    probe = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("PROBE "))[6:])
    assert probe["setting"] == MODULE and probe["raised"] is True
    for asked in (probe["first"], probe["after"]):  # before and after a worker was lost to the UDF raising
        command, pyarrow, threads, package = json.loads(asked)
        assert command[1:3] == ["-m", MODULE] and pyarrow is True
        assert package is False  # a worker imports the package from the job's code archive, not the daemon's
        assert threads == 1  # as PySpark's own daemon: no thread of a library runs when it forks


def test_a_daemon_that_runs_a_second_thread_becomes_pysparks_own(tmp_path):
    """Were a library to start a thread anyway, the daemon forks no worker: it runs PySpark's
    daemon in its place, which says on its output where it listens, as Spark expects."""
    threaded = ("import runpy, threading, time; threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); "
                f"runpy.run_module({MODULE!r}, run_name='__main__')")
    env = {**os.environ, "PYTHONPATH": PLUGINS}
    daemon = subprocess.Popen([sys.executable, "-c", threaded, "pyspark.worker"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=env)
    try:
        port = int.from_bytes(daemon.stdout.read(4), "big")
        assert 0 < port < 65536
        with open(f"/proc/{daemon.pid}/cmdline", "rb") as cmdline:
            assert cmdline.read().split(b"\0")[1:4] == [b"-m", b"pyspark.daemon", b"pyspark.worker"]
    finally:
        daemon.stdin.close()  # the daemon's signal to end
        daemon.wait(timeout=30)


@pytest.fixture
def installed(tmp_path):
    """A folder holding a copy of the package's daemon module, as an install would."""
    spark = tmp_path / "site" / "exactly_once" / "spark"
    spark.mkdir(parents=True)
    for package in (spark.parent, spark):
        (package / "__init__.py").write_text("")
    (spark / "warm_daemon.py").write_text("")
    return str(tmp_path / "site")


def test_the_daemon_is_named_for_a_local_master_whose_workers_import_it(installed):
    assert settings(LOCAL, OURS, [installed]) == {DAEMON_MODULE: MODULE}
    assert settings({"spark.master": "local", "spark.pyspark.python": sys.executable}, {}, [installed]) \
        == {DAEMON_MODULE: MODULE}


@pytest.mark.parametrize("conf, environment, why", [
    ({"spark.master": "spark://127.0.0.1:7077"}, OURS, "a cluster's executors may not have the package"),
    ({"spark.master": "yarn"}, OURS, "a cluster's executors may not have the package"),
    ({"spark.master": "local-cluster[2,1,1024]"}, OURS, "executors of their own"),
    ({**LOCAL, DAEMON_MODULE: "custom.daemon"}, OURS, "the job's settings name a daemon of their own"),
    ({**LOCAL, "spark.pyspark.python": "/usr/bin/env"}, OURS, "the workers run another interpreter"),
    (LOCAL, {"PYSPARK_PYTHON": "/usr/bin/env"}, "the workers run another interpreter"),
])
def test_no_daemon_is_named_where_the_workers_may_not_import_it(installed, conf, environment, why):
    assert settings(conf, environment, [installed]) == {}, why


def test_no_daemon_is_named_for_another_virtual_environment_of_the_same_python(installed, tmp_path):
    other = tmp_path / "venv" / "bin"
    other.mkdir(parents=True)
    (other / "python").symlink_to(sys.executable)  # what `python -m venv` makes: a link to the same Python
    assert settings(LOCAL, {"PYSPARK_PYTHON": str(other / "python")}, [installed]) == {}


def test_no_daemon_is_named_when_the_package_is_only_in_the_code_archive_or_lacks_it(installed, tmp_path):
    archive = tmp_path / "code.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        for name in ("exactly_once/__init__.py", "exactly_once/spark/__init__.py", "exactly_once/spark/warm_daemon.py"):
            zipped.writestr(name, "")
    assert settings(LOCAL, OURS, [str(archive)]) == {}  # the daemon starts before the archive is on its path
    os.remove(os.path.join(installed, "exactly_once", "spark", "warm_daemon.py"))  # an older install
    assert settings(LOCAL, OURS, [installed]) == {}
