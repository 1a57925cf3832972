"""Where a Spark application's CPU goes (`./dev bench --profile`): the CPU time of each thread
of its processes (the driver JVM, the Python driver, PySpark's daemon and workers), read from
/proc while it runs and summed by what the threads do. A thread's last reading counts, so a
thread that ends between two readings loses what it ran since the earlier one."""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
JIT = "the JIT compiler (HotSpot's C1 and C2 compiler threads)"
TASKS = "Spark's tasks"
GC = "garbage collection (and the JVM's VM thread)"
OTHER_JVM = "the driver's other JVM threads (planning, code generation, scheduling)"
PYTHON_DRIVER = "the Python driver"
WORKERS = "Python workers (PySpark's daemon and the workers it forks)"
OTHER = "other processes (spark-submit's launcher JVM, shells)"
# The driver JVM's threads by name (Linux shows their first 15 characters), tried in order.
JVM_THREADS = ((JIT, re.compile(r"C\d CompilerThre")), (TASKS, re.compile(r"Executor task")),
               (GC, re.compile(r"GC Thread|G1 |VM Thread")))


class JobCpu:
    """The CPU of an application's threads, read by `sample` while it runs, as a table."""

    def __init__(self, every: float) -> None:
        self.every = every  # seconds between two readings
        self.threads: dict[tuple[int, int], tuple[str, float]] = {}  # (pid, tid) -> (group, CPU seconds)
        self.reading = 0.0  # the CPU seconds this process spent reading them

    def sample(self, jvm: int, processes: list[int]) -> None:
        """Reads every thread of `processes`: the driver JVM `jvm` and the processes below it."""
        began = time.process_time()
        for pid in processes:
            kind = None if pid == jvm else _kind(pid)
            for tid, comm, cpu in _threads(pid):
                self.threads[(pid, tid)] = (kind or _jvm_group(comm), cpu)
        self.reading += time.process_time() - began

    def table(self, seconds: float) -> str:
        by_group = Counter()
        for group, cpu in self.threads.values():
            by_group[group] += cpu
        total = sum(by_group.values())
        cores = len(os.sched_getaffinity(0))
        lines = [f"{total:.1f} CPU seconds in the application's {seconds:.1f} s ({cores} cores give "
                 f"{cores * seconds:.1f}), read from /proc every {self.every} s (which took the reader "
                 f"{self.reading:.1f} CPU s):", "", "| threads | CPU (s) | share |", "|---|---:|---:|"]
        lines += [f"| {group} | {cpu:.1f} | {cpu / total:.0%} |" for group, cpu in by_group.most_common() if total]
        return "\n".join(lines)


def _jvm_group(comm: str) -> str:
    return next((group for group, pattern in JVM_THREADS if pattern.match(comm)), OTHER_JVM)


def _kind(pid: int) -> str:
    """What a process below the driver JVM is: PySpark's daemon (`-m pyspark.daemon`, or the
    module `spark.python.daemon.module` names) or a worker it forked, which keeps its command
    line; the Python driver; or another (spark-submit's launcher JVM, a shell)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return OTHER
    if any(part.endswith(b"daemon") for part in command):
        return WORKERS
    return PYTHON_DRIVER if Path(command[0].decode(errors="replace")).name.startswith("python") else OTHER


def _threads(pid: int) -> list[tuple[int, str, float]]:
    found = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        found.append((int(stat.parent.name), text[text.index("(") + 1:text.rindex(")")],
                      (int(fields[11]) + int(fields[12])) / TICK))
    return found
