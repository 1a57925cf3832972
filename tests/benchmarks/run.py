"""The benchmarks: figures, not tests. On the local services (started if not running):

    ./dev bench                         1 M and 5 M orders, then the Airflow runs; README updated
    ./dev bench --sizes 200000 --no-airflow --no-readme
    ./dev bench --sizes --no-readme     the Airflow runs only

For each size, one exactly-once checkpoint phase by phase, beside the limits it is
compared with and the at-least-once and Structured Streaming peers
(tests/benchmarks/throughput.py); then an empty run and a 10-interval backfill through
Airflow's scheduler (tests/benchmarks/airflow_runs.py). Prints the tables, writes them to
.local/artifacts/bench/, and into the README's "Performance" section between its markers.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from contextlib import closing
from datetime import datetime, timezone
from pathlib import Path

import psycopg2

from exactly_once.migrate import migrate
from exactly_once_stack import lifecycle
from exactly_once_stack.settings import LOCAL, ROOT, process_environment
from tests.benchmarks import airflow_runs, throughput
from tests.benchmarks.airflow_runs import AirflowFigures, Backfill
from tests.benchmarks.throughput import Throughput

ARTIFACTS = LOCAL / "artifacts" / "bench"
README = ROOT / "README.md"
BEGIN = "<!-- benchmark figures: written by ./dev bench, do not edit by hand -->"
END = "<!-- end of benchmark figures -->"
MiB = 1 << 20


def _n(value: float) -> str:
    return f"{value:,.0f}"


def _took(seconds: float, count: int, unit: str) -> str:
    return f"{seconds:.2f} s · {_n(count / seconds)} {unit}/s"


def _versus_limits(r: Throughput, end_to_end: float, kafka_read: float) -> float:
    """End-to-end records/s over the slower limit's rate (Kafka records/s or COPY rows/s)."""
    return (r.records / end_to_end) / min(r.records / kafka_read, r.staged_rows / r.copy)


def throughput_table(results: list[Throughput]) -> str:
    """One column per size; the phases, limits, peers and the ratios the issue sets targets for."""
    def row(label: str, cell) -> str:
        return f"| {label} | " + " | ".join(cell(r) for r in results) + " |"

    def ratio(label: str, value) -> str:
        return row(label, lambda r: f"{value(r):.2f}")

    rows = [
        "| | " + " | ".join(f"{_n(r.orders)} orders" for r in results) + " |",
        "|---|" + "---:|" * len(results),
        row("committed records read (aborted transactions are skipped)", lambda r: _n(r.records)),
        row("produce (confluent-kafka, transactions of 50,000, every 7th aborted)",
            lambda r: _took(r.produce, r.orders, "orders")),
        row("**exactly-once checkpoint, end to end**", lambda r: _took(r.end_to_end, r.records, "records")),
        row("· plan: register, recover, Kafka offsets, freeze ranges", lambda r: f"{r.plan:.2f} s"),
        row("· increment task around its job: start attempt (fence, clear staging), spark-submit", lambda r: f"{r.start_attempt:.2f} s"),
        row("· Spark application start and stop (JVM, session, ledger read)",
            lambda r: f"{r.spark_start_stop:.2f} s"),
        row("· Spark read + parse, cached", lambda r: _took(r.phase("read"), r.records, "records")),
        row("· staging write: transform, sink rows, JDBC (all sinks)",
            lambda r: _took(r.phase("write_staging"), r.staged_rows, "rows")),
        row("· pre-commit: row counts and checksums of staging", lambda r: f"{r.phase('pre_commit'):.2f} s"),
        row("· commit: promote, record offsets, clear staging (one transaction)", lambda r: f"{r.commit:.2f} s"),
        row("Spark driver peak RSS, JVM / Python", lambda r: f"{r.job.peak_jvm // MiB:,} / "
                                                            f"{r.job.peak_python // MiB:,} MiB"),
        row("staged rows (all sinks and dead letters) / append rows", lambda r: f"{_n(r.staged_rows)} / "
                                                                                f"{_n(r.append_rows)}"),
        row("**limit:** PostgreSQL COPY of the staged rows from files", lambda r: _took(r.copy, r.staged_rows, "rows")),
        row("**limit:** INSERT … SELECT of the append rows (final table's indexes)",
            lambda r: _took(r.insert_select, r.append_rows, "rows")),
        row("**limit:** Spark Kafka read → noop sink, in the application",
            lambda r: _took(r.kafka_read.report["seconds"], r.records, "records")),
        row("**limit:** the same, whole application", lambda r: _took(r.kafka_read.seconds, r.records, "records")),
        row("**peer:** at-least-once job, straight into final tables, whole application",
            lambda r: _took(r.at_least_once.seconds, r.records, "records")),
        row("**peer:** Structured Streaming, AvailableNow + foreachBatch, whole application",
            lambda r: _took(r.streaming.seconds, r.records, "records")
            + f" ({r.streaming.report['batches']} batch{'es' if r.streaming.report['batches'] > 1 else ''})"),
        ratio("staging write / COPY, time", lambda r: r.phase("write_staging") / r.copy),
        ratio("commit / INSERT … SELECT, time (target ≤ 1.3)", lambda r: r.commit / r.insert_select),
        ratio("end-to-end / min(Kafka read, COPY), throughput, whole applications (target ≥ 0.8)",
              lambda r: _versus_limits(r, r.end_to_end, r.kafka_read.seconds)),
        ratio("the same without the Spark application's start and stop on either side",
              lambda r: _versus_limits(r, r.end_to_end - r.spark_start_stop, r.kafka_read.report["seconds"])),
        ratio("exactly-once / at-least-once, time (target ≤ 1.2)", lambda r: r.end_to_end / r.at_least_once.seconds),
        ratio("exactly-once / Structured Streaming, throughput (target ≥ 1.0)",
              lambda r: r.streaming.seconds / r.end_to_end),
    ]
    return "\n".join(rows)


def _backfill(b: Backfill) -> str:
    empty = f"; {b.empty_runs} of {b.runs} runs found their interval's records held by another run" \
        if b.empty_runs else ""
    return f"{b.seconds:.0f} s ({b.per_run:.1f} s per run, {_n(b.records)} records{empty})"


def airflow_table(figures: AirflowFigures, intervals: int) -> str:
    seq, par = figures.sequential, figures.parallel
    orders = intervals * airflow_runs.ORDERS_PER_INTERVAL
    return "\n".join([
        "| through Airflow (scheduler, LocalExecutor) | time |",
        "|---|---:|",
        f"| empty run, no new records: trigger → run ended, no Spark job (target < 10 s) "
        f"| {figures.empty_run:.1f} s |",
        f"| backfill of {intervals} intervals ({_n(orders)} orders), one run at a time | {_backfill(seq)} |",
        f"| the same, 3 runs at a time | {_backfill(par)} |",
        f"| 3 at a time / one at a time, time | {par.seconds / seq.seconds:.2f} |",
    ])


def machine() -> str:
    cpu = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((line.split(":", 1)[1].strip() for line in cpu if line.startswith("model name")), platform.processor())
    memory = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal")) * 1024
    return f"{os.cpu_count()} cores ({model}), {memory / (1 << 30):.0f} GiB RAM, Linux {platform.release()}"


def report(command: str, results: list[Throughput], figures: AirflowFigures | None, intervals: int,
           seconds: float) -> str:
    parts = [f"`{command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {machine()}; Spark local[2], "
             f"one local Kafka broker and PostgreSQL server; the benchmark took {seconds / 60:.1f} min "
             "(set-up not included)."]
    if results:
        parts += ["", throughput_table(results)]
    if figures is not None:
        parts += ["", airflow_table(figures, intervals)]
    return "\n".join(parts)


def into_readme(text: str, readme: str) -> str:
    """The README with `text` between the benchmark markers (which must be there, once)."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise ValueError(f"{README.name}: needs the markers {BEGIN!r} and {END!r}, once each, in that order")
    head, rest = readme.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{text}\n{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(prog="./dev bench", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", type=int, default=[1_000_000, 5_000_000], help="orders per run")
    parser.add_argument("--intervals", type=int, default=10, help="intervals of the Airflow backfill")
    parser.add_argument("--no-airflow", action="store_true", help="skip the runs through Airflow")
    parser.add_argument("--no-readme", action="store_true", help="do not write the README's Performance section")
    args = parser.parse_args()
    command = shlex.join(["./dev", "bench", *sys.argv[1:]])
    began = time.monotonic()
    started = lifecycle.up()
    try:
        env = process_environment()
        os.environ.update(env)
        servers, db_url = env["KAFKA_BOOTSTRAP_SERVERS"], env["PIPELINE_DB_URL"]
        with closing(psycopg2.connect(db_url)) as conn:
            migrate(conn)  # a new checkout's database has no ledger yet
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        results = []
        for size in args.sizes:
            results.append(throughput.measure(size, servers, db_url, ARTIFACTS))
            print(throughput_table(results[-1:]), flush=True)
        figures = None if args.no_airflow else airflow_runs.measure(servers, db_url, ARTIFACTS, args.intervals)
    finally:
        lifecycle.down(started)
    text = report(command, results, figures, args.intervals, time.monotonic() - began)
    written = ARTIFACTS / f"bench-{time.strftime('%Y%m%dT%H%M%S')}.md"
    written.write_text(text + "\n")
    print(f"\n{text}\n\nwritten to {written}")
    if not args.no_readme:
        README.write_text(into_readme(text, README.read_text()))
        print(f"and to {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
