"""Background processes tracked by PID files: start, liveness, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable


def wait_until(ready: Callable[[], bool], timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.2)
    tail = ""
    if log is not None and log.exists():
        tail = "\n--- last lines of %s ---\n%s" % (log, "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
    raise RuntimeError(f"{what} not ready after {timeout:.0f} s{tail}")


def start_ready(cmd: list[str], log: Path, pid_file: Path, cwd: Path, ready: Callable[[], bool], timeout: float,
                what: str, stop: Callable[[], None], then: Callable[[], None] = lambda: None,
                env: dict[str, str] | None = None) -> None:
    """Spawns `cmd` (in `env`, this process's environment by default), waits until `ready()`,
    then runs `then()` (its set-up through its API); stops it with `stop` if any of that fails,
    so that no later start takes a half-started service for a running one."""
    spawn(cmd, log, pid_file, env=env, cwd=cwd)
    try:
        wait_until(ready, timeout, what, log)
        then()
    except BaseException:
        stop()
        raise


def alive(pid: int, marker: str) -> bool:
    """True if `pid` runs and its command line contains `marker` (guards against PID reuse)."""
    cmdline = command_line(pid)
    if not cmdline:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z" and marker in cmdline


def command_line(pid: int) -> str:
    """The process's command line, its arguments joined by spaces; "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def spawn(cmd: list[str], log: Path, pid_file: Path, env: dict[str, str] | None, cwd: Path) -> int:
    """Starts `cmd` in its own session (so it outlives the caller) and records its PID."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, cwd=cwd, start_new_session=True,
        )
    pid_file.write_text(f"{proc.pid}\n")
    return proc.pid


def stop(pid: int, marker: str, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    """Sends `sig`, waits for the process to exit, and kills it if it does not."""
    if not alive(pid, marker):
        return
    os.kill(pid, sig)
    try:
        wait_until(lambda: not alive(pid, marker), timeout, f"exit of pid {pid}")
    except RuntimeError:
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not alive(pid, marker), 10, f"exit of pid {pid} after SIGKILL")
