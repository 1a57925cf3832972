"""Spark beyond local[2] on the local stack, from the installed pyspark, on loopback:
`standalone` (a master and two workers of 1 core and 1 GiB each, each worker on a loopback
address of its own) or `connect` (a long-running Spark Connect server, itself on local[2],
with the connector jars of spark-defaults.conf).
`./dev up` starts the one STACK_SPARK names and points spark_default at it; tests start
them by `start(mode)`. Each is stopped by PID.

The services run without the project's PYTHONPATH: their executors and Python workers can
import the library and the transform only from what the job ships (exactly_once.spark.shipping).
"""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.request import urlopen

from exactly_once_stack import process
from exactly_once_stack.settings import LOCAL, LOCAL_CLIENTS, LOOPBACK, VENV, ports, process_environment

HOME = LOCAL / "spark"
WORKERS = 2
SPARK_CLASS = "org.apache.spark.deploy"
CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"


@dataclass(frozen=True)
class Service:
    name: str
    command: list[str]
    marker: str  # in the JVM's command line: its PID file is not trusted alone (PID reuse)

    @property
    def pid_file(self) -> Path:
        return HOME / f"{self.name}.pid"

    @property
    def log(self) -> Path:
        return HOME / f"{self.name}.log"

    def pid(self) -> int | None:
        found = process.read_pid(self.pid_file)
        return found if found and process.alive(found, self.marker) else None


def master_url() -> str:
    return f"spark://{LOOPBACK}:{ports()['spark_master']}"


def worker_host(n: int) -> str:
    """Worker n's address, 127.0.0.n: each worker a host of its own to Spark, as on machines of
    their own (Spark starts a speculative copy of a task only on a host the task is not on)."""
    return f"127.0.0.{n}"


def services(mode: str, conf: Mapping[str, str] | None = None) -> list[Service]:
    """The mode's services; `conf`: Spark settings of a Connect server (its application's)."""
    bin_dir = _pyspark_home() / "bin"
    if mode == "standalone":
        master = Service("master", [str(bin_dir / "spark-class"), f"{SPARK_CLASS}.master.Master", "--host", LOOPBACK,
                                    "--port", str(ports()["spark_master"]),
                                    "--webui-port", str(ports()["spark_master_ui"])],
                         f"master.Master --host {LOOPBACK} --port {ports()['spark_master']}")
        workers = [Service(f"worker-{n}", [str(bin_dir / "spark-class"), f"{SPARK_CLASS}.worker.Worker", "--host",
                                           worker_host(n), "--cores", "1", "--memory", "1g", "--webui-port", "0",
                                           "--work-dir", str(HOME / f"worker-{n}"), master_url()],
                           f"worker.Worker --host {worker_host(n)} --cores 1 --memory 1g --webui-port 0 --work-dir "
                           f"{HOME / f'worker-{n}'}") for n in range(1, WORKERS + 1)]
        return [master, *workers]
    if mode == "connect":
        port = ports()["spark_connect"]
        return [Service("connect", [str(bin_dir / "spark-submit"), "--class", CONNECT_SERVER, "--name",
                                    "Spark Connect server", "--master", "local[2]",
                                    "--conf", f"spark.connect.grpc.binding.address={LOOPBACK}",
                                    "--conf", f"spark.connect.grpc.binding.port={port}",
                                    *(part for k, v in (conf or {}).items() for part in ("--conf", f"{k}={v}"))],
                        f"spark.connect.grpc.binding.port={port}")]
    return []


def start(mode: str, conf: Mapping[str, str] | None = None) -> list[str]:
    """Starts the mode's services that are not running, waits until they serve; their names.
    Stops what it started if one does not come up. `conf`: a Connect server's Spark settings
    (one already running keeps its own)."""
    started = []
    # Not the stack's Airflow settings and connections, nor its clients' URLs: they hold
    # credentials, and a cluster's processes (its executors, a Connect server's Python
    # workers) get only what a job sends them.
    env = {k: v for k, v in process_environment().items()
           if k != "PYTHONPATH" and k not in LOCAL_CLIENTS and not k.startswith("AIRFLOW")}
    env["SPARK_MASTER_OPTS"] = "-Dspark.master.rest.enabled=false"  # its fixed port 6066 is of no use here
    HOME.mkdir(parents=True, exist_ok=True)
    try:
        for service in services(mode, conf):
            if service.pid() is None:
                service.log.unlink(missing_ok=True)
                process.spawn(service.command, service.log, service.pid_file, env=env, cwd=HOME)
                started.append(service.name)
        for service in services(mode):
            process.wait_until(lambda: service.pid() is not None and _serving(mode, service), 120,
                               f"Spark {service.name}", service.log)
    except BaseException:
        stop_named(started)
        raise
    return started


def stop(mode: str | None = None) -> None:
    """Stops the mode's services (every mode's by default), workers before their master."""
    stop_named([s.name for m in ([mode] if mode else ["connect", "standalone"]) for s in services(m)])


def stop_named(names: list[str]) -> None:
    for service in reversed(services("standalone") + services("connect")):
        running = service.pid() if service.name in names else None
        if running is not None:
            process.stop(running, service.marker)


def kill_a_worker() -> list[int]:
    """SIGKILLs the first standalone worker running an executor, with its executor (its
    process group): the PIDs killed."""
    for service in services("standalone")[1:]:
        pid = service.pid()
        group = _group(pid) if pid else []
        if any("CoarseGrainedExecutorBackend" in process.command_line(p) for p in group):
            os.killpg(pid, signal.SIGKILL)
            return group
    return []


def _group(pgid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def running() -> dict[str, int]:
    return {s.name: pid for mode in ("standalone", "connect") for s in services(mode) if (pid := s.pid())}


def _serving(mode: str, service: Service) -> bool:
    if mode == "connect":
        return _accepts(ports()["spark_connect"])
    return _accepts(ports()["spark_master"]) and (service.name == "master" or alive_workers() >= WORKERS)


def alive_workers() -> int:
    """The workers registered with the master, from its web UI's JSON."""
    try:
        with urlopen(f"http://{LOOPBACK}:{ports()['spark_master_ui']}/json/", timeout=2) as answer:
            return json.load(answer)["aliveworkers"]
    except (OSError, ValueError, KeyError):
        return 0


def _accepts(port: int) -> bool:
    try:
        socket.create_connection((LOOPBACK, port), timeout=1).close()
        return True
    except OSError:
        return False


def _pyspark_home() -> Path:
    found = sorted((VENV / "lib").glob("python3*/site-packages/pyspark"))
    if not found:
        raise RuntimeError(f"no pyspark in {VENV}: run exactly_once_stack/setup.sh")
    return found[0]

