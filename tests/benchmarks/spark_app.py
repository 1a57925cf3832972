"""A Spark application run as a user runs it: spark-submit, timed from launch to exit,
with the peak memory of its driver (the JVM and, for a PySpark application, the Python
process it starts), read from the kernel's high-water marks while it runs, and the largest heap
its JVM's counters showed (tests/benchmarks/jvm_heap.py); and, when asked, the CPU of its
processes' threads (tests/benchmarks/job_cpu.py). The increment job over a warm Spark Connect
server, timed, with the server's heap read the same way."""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from exactly_once_stack.settings import ROOT, SPARK_MASTER, process_environment
from tests.benchmarks.job_cpu import JobCpu
from tests.benchmarks.jvm_heap import Heap, HeapPeak

SAMPLE_EVERY = 0.2  # seconds; the high-water marks only grow, so a sample never misses a peak of a live process


@dataclass(frozen=True)
class SparkRun:
    seconds: float        # spark-submit launch to exit: JVM start, session, the work, stop
    peak_jvm: int         # bytes: VmHWM of the driver JVM
    peak_python: int      # bytes: VmHWM of the Python driver
    report: dict          # what the application wrote to its --report file
    cpu: JobCpu | None = None  # its threads' CPU, when asked
    heap: Heap | None = None   # the largest heap in use its driver's JVM (a Connect server's) showed, and its most


def submit(application: Path, arguments: list[str], log: Path, conf: Mapping[str, str] | None = None,
           cpu: bool = False) -> SparkRun:
    """Runs the application with `--report <file>` appended, and Spark settings `conf`, reading
    its threads' CPU if `cpu`; raises with the log's tail if it fails."""
    report = log.with_suffix(".json")
    report.unlink(missing_ok=True)
    settings = [f"--conf={name}={value}" for name, value in (conf or {}).items()]
    command = ["spark-submit", "--master", SPARK_MASTER, *settings, str(application), *arguments,
               "--report", str(report)]
    peaks = {"java": 0, "python": 0}
    heap = HeapPeak()
    threads = JobCpu(SAMPLE_EVERY) if cpu else None
    started = time.perf_counter()
    with log.open("wb") as out:
        # spark-submit execs the JVM, so the child is the driver JVM; the Python driver is its child.
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=process_environment(),
                                   cwd=ROOT)
        while process.poll() is None:
            below = _descendants(process.pid)  # each with its parent
            # the JVM and the processes it started: the Python driver, PySpark's daemon
            for pid in [process.pid, *(child for child, parent in below.items() if parent == process.pid)]:
                kind, peak = _high_water_mark(pid)
                if kind in peaks:
                    peaks[kind] = max(peaks[kind], peak)
            heap.sample(process.pid)
            if threads is not None:
                threads.sample(process.pid, [process.pid, *below])
            time.sleep(SAMPLE_EVERY)
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"{application.name} {' '.join(arguments)} exited {process.returncode}; "
                           f"log {log}:\n{tail}")
    return SparkRun(seconds, peaks["java"], peaks["python"], json.loads(report.read_text()), threads, heap.peak())


def _descendants(pid: int) -> dict[int, int]:
    """The live processes below `pid` (the Python driver, PySpark's daemon and its workers),
    each with its parent."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found, above = {}, [pid]
    while above:
        parent = above.pop()
        children = [child for child, its in parents.items() if its == parent]
        found.update(dict.fromkeys(children, parent))
        above += children
    return found


def _high_water_mark(pid: int) -> tuple[str, int]:
    """('java' | 'python' | other, peak resident bytes) of a live process; ('', 0) if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "", 0
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    name = fields.get("Name", "").strip()
    kind = "python" if name.startswith("python") else name
    return kind, int(fields.get("VmHWM", "0 kB").split()[0]) * 1024


def increment_job(job: Path, settings: Path, log: Path, runs: list[SparkRun], conf: Mapping[str, str] | None = None,
                  cpu: bool = False):
    """An `execute` for `tasks.run_increment`: the increment job submitted with its settings
    file (and Spark settings `conf`; its threads' CPU read if `cpu`), its run kept in `runs`,
    what it staged returned for the task to pre-commit."""
    from exactly_once.spark.report import AttemptReport

    def execute(arguments: list[str]) -> AttemptReport:
        run = submit(job, [*arguments, "--settings", str(settings)], log, conf, cpu)
        runs.append(run)
        return AttemptReport(**run.report)
    return execute


def connect_job(runner, log: Path, runs: list[SparkRun], server: int):
    """An `execute` for `tasks.run_increment`: the increment job as the task runs it on a
    `spark_connect` connection (`exactly_once.spark.runners.ConnectRunner`, a Python client
    of a warm server, whose JVM is process `server`), its output in `log`, its run kept in
    `runs`, timed from the client's launch to its exit. Its driver is the server's JVM, which
    every job on the server shares: no peak resident memory is read (0), but the largest heap
    the server's JVM showed while the job ran is."""
    from exactly_once.spark.report import AttemptReport

    def execute(arguments: list[str]) -> AttemptReport:
        output = logging.FileHandler(log, mode="w")
        runner_log = logging.getLogger("exactly_once.spark.runners")  # where the runner writes the job's lines
        runner_log.addHandler(output)
        runner_log.setLevel(logging.INFO)
        runner_log.propagate = False  # the job's lines go to its log, not to the benchmark's output
        started = time.perf_counter()
        try:
            with sampled_heap(server) as heap:
                report = runner(arguments)
        except Exception as failed:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
            raise RuntimeError(f"the increment job over Spark Connect failed; log {log}:\n{tail}") from failed
        finally:
            runner_log.removeHandler(output)
            runner_log.propagate = True
            output.close()
        runs.append(SparkRun(time.perf_counter() - started, 0, 0, asdict(report), heap=heap.peak()))
        return report
    return execute


@contextmanager
def sampled_heap(pid: int) -> Iterator[HeapPeak]:
    """The JVM `pid`'s heap sampled every SAMPLE_EVERY from a thread while the block runs."""
    peak, done = HeapPeak(), threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak.sample(pid)
            done.wait(SAMPLE_EVERY)
    sampler = threading.Thread(target=sample, name=f"heap of {pid}", daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()
        peak.sample(pid)
