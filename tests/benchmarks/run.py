"""The benchmarks: figures, not tests. On the local services (started if not running):

    ./dev bench                         quick: 1 M orders, 3 interleaved repetitions, medians
    ./dev bench --full                  1 M and 5 M orders, the Airflow runs, then cost as the work grows
    ./dev bench --sizes 200000 --repetitions 1 --no-docs
    ./dev bench --full --sizes --no-growth   the Airflow runs only
    ./dev bench --growth-only [--growth-orders 200000] --no-docs
                                        cost as the work grows only (tests/benchmarks/growth.py)
    ./dev bench --sizes 1000000 --repetitions 1 --no-docs --profile
                                        and where the checkpoint's time goes (profile.md beside its logs)

For each size, exactly-once checkpoints phase by phase, beside the limits they are
compared with and the at-least-once and Structured Streaming peers, each repetition
side by side on the same records (tests/benchmarks/throughput.py); the table gives the
median of the repetitions, each ratio the median of the repetitions' own ratios (with
their values). With --full, then an empty run and a 10-interval backfill through
Airflow's scheduler (tests/benchmarks/airflow_runs.py), then cost as the work grows: 1 M
orders over 4, 64 and 512 partitions, checkpoints of 0 and 1,000 records
(tests/benchmarks/growth.py). Prints the tables, writes them to .local/artifacts/bench/,
and into the documentation's Performance page (docs/internals/performance.md), between
the markers of the quick or the full run (not with --growth-only).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time
from contextlib import closing
from datetime import datetime, timezone
from pathlib import Path

import psycopg2

from exactly_once.ledger.migrate import migrate
from exactly_once_stack import lifecycle
from exactly_once_stack.settings import LOCAL, ROOT, process_environment
from tests.benchmarks import airflow_runs, growth, throughput
from tests.benchmarks.airflow_runs import AirflowFigures, Backfill
from tests.benchmarks.throughput import Throughput

ARTIFACTS = LOCAL / "artifacts" / "bench"
PAGE = ROOT / "docs" / "internals" / "performance.md"
QUICK, FULL = [1_000_000], [1_000_000, 5_000_000]
# The largest size run over the warm Spark Connect server too (every size: at 5 M orders the
# server, 1 GiB of heap, died building the attempt's cache in memory until a Connect job cached
# on disk only, issue 63).
CONNECT_UP_TO = 5_000_000


def markers(mode: str) -> tuple[str, str]:
    """The performance page's markers around the figures of a quick or a full run."""
    return (f"<!-- benchmark figures ({mode}): written by ./dev bench, do not edit by hand -->",
            f"<!-- end of benchmark figures ({mode}) -->")


MiB = 1 << 20


def _n(value: float) -> str:
    return f"{value:,.0f}"


def _took(seconds: float, count: int, unit: str) -> str:
    return f"{seconds:.2f} s · {_n(count / seconds)} {unit}/s"


RUNNERS = {"submitted": "spark-submit", "connected": "warm Spark Connect"}  # a column each, per size


def throughput_table(results: list[Throughput]) -> str:
    """Two columns per size: the checkpoint with its job by spark-submit, and by a client of
    a warm Spark Connect server. The phases, limits and peers (medians; the limits and peers
    in the first column only, as both checkpoints are compared with the same), then the
    ratios the issue sets targets for (the median of the repetitions' own ratios, and each)."""
    columns = [(t, runner) for t in results for runner in RUNNERS
               if runner == "submitted" or t.repetitions[0].connected is not None]

    def row(label: str, cell, shared: bool = False) -> str:
        """`cell(throughput, runner)`; a `shared` figure only in each size's first column."""
        return f"| {label} | " + " | ".join("" if shared and runner != "submitted" else cell(t, runner)
                                            for t, runner in columns) + " |"

    def checkpoint(value):
        """A figure of the column's checkpoint: `value(CheckpointRun, Repetition)`."""
        return lambda runner: lambda r: value(getattr(r, runner), r)

    def took(label: str, seconds, count, unit: str, shared: bool = False) -> str:
        return row(label, lambda t, runner: _took(t.median(seconds(runner)), count(t), unit), shared)

    def seconds(label: str, value) -> str:
        return row(label, lambda t, runner: f"{t.median(value(runner)):.2f} s")

    def ratio(label: str, value) -> str:
        return row(label, lambda t, runner: f"**{t.median(value(runner)):.2f}** ("
                   + ", ".join(f"{value(runner)(r):.2f}" for r in t.repetitions) + ")")

    def limit(value):
        return lambda runner: value

    def records(t: Throughput) -> int:
        return t.records

    def staged(t: Throughput) -> int:
        return t.repetitions[0].staged_rows

    def sink_rows(t: Throughput) -> int:
        return t.repetitions[0].sink_rows

    def peak_memory(t: Throughput, runner: str) -> str:
        if runner == "connected":
            return "the server's JVM, shared by every job on it"
        return (f"{t.median(lambda r: r.submitted.job.peak_jvm) / MiB:,.0f} / "
                f"{t.median(lambda r: r.submitted.job.peak_python) / MiB:,.0f} MiB")

    def peak_heap(t: Throughput, runner: str) -> str:
        heaps = [getattr(r, runner).job.heap for r in t.repetitions]
        if any(h is None for h in heaps):
            return "not read"
        return (f"{statistics.median(h.used for h in heaps) / MiB:,.0f} / {max(h.most for h in heaps) / MiB:,.0f} MiB"
                + (" (the server's)" if runner == "connected" else ""))

    def batches(peer) -> str:
        return lambda t, runner: _took(t.median(lambda r: peer(r).seconds), t.records, "records") \
            + f" ({max(peer(r).report['batches'] for r in t.repetitions)} batch(es) at most)"

    rows = [
        "| median of the repetitions | " + " | ".join(f"{_n(t.orders)} orders, {RUNNERS[runner]}"
                                                    for t, runner in columns) + " |",
        "|---|" + "---:|" * len(columns),
        row("repetitions (each job's place in them rotates)", lambda t, runner: str(len(t.repetitions))),
        row("committed records read (aborted transactions are skipped)", lambda t, runner: _n(t.records)),
        row("produce once (confluent-kafka, transactions of 50,000, every 7th aborted)",
            lambda t, runner: _took(t.produce, t.orders, "orders"), shared=True),
        took("**exactly-once checkpoint, end to end**", checkpoint(lambda c, r: c.end_to_end), records, "records"),
        seconds("· plan: register, recover, Kafka offsets, freeze ranges", checkpoint(lambda c, r: c.plan)),
        seconds("· increment task around its job: start attempt (fence, clear staging, trial statements, token), "
                "spark-submit or the Connect client's launch", checkpoint(lambda c, r: c.start_attempt)),
        seconds("· Spark application start and stop (JVM, session, ledger read); over Connect, the client's "
                "session", checkpoint(lambda c, r: c.spark_start_stop)),
        took("· Spark read + parse, cached", checkpoint(lambda c, r: c.phase("read")), records, "records"),
        took("· staging write: transform, row checks, sink rows, COPY (all sinks)",
             checkpoint(lambda c, r: c.phase("write_staging")), staged, "rows"),
        seconds("· pre-commit by the task: row counts of staging", checkpoint(lambda c, r: c.pre_commit)),
        seconds("· commit: promote every sink, record offsets (one transaction)", checkpoint(lambda c, r: c.commit)),
        seconds("· staging clean-up after the commit", checkpoint(lambda c, r: c.clean_up)),
        row("Spark driver peak RSS, JVM / Python", peak_memory),
        row("Spark driver's peak heap in use / its most (-Xmx), from the JVM's counters every 0.2 s; over Connect, "
            "the server's while the job ran", peak_heap),
        row("staged rows (all sinks and dead letters)", lambda t, runner: _n(staged(t))),
        took("**limit:** PostgreSQL binary COPY of the staged rows from files, bare tables (no index)",
             limit(lambda r: r.limits.copy_bare), staged, "rows", shared=True),
        took("**limit:** the same into tables like staging (its index)", limit(lambda r: r.limits.copy_like_staging),
             staged, "rows", shared=True),
        took("**limit:** INSERT … SELECT of every sink's rows into tables with the final tables' indexes",
             limit(lambda r: r.limits.insert_select), sink_rows, "rows", shared=True),
        took("**limit:** Spark Kafka read → noop sink, in the application",
             limit(lambda r: r.kafka_read.report["seconds"]), records, "records", shared=True),
        took("**limit:** the same, whole application", limit(lambda r: r.kafka_read.seconds), records, "records",
             shared=True),
        took("**peer:** at-least-once job, the same COPY writer, straight into final tables, whole application",
             limit(lambda r: r.at_least_once.seconds), records, "records", shared=True),
        row("**peer:** Structured Streaming as users write it: AvailableNow + foreachBatch, from_json, the transform, "
            "Spark's JDBC writer (upserts through an unlogged table), bad records dropped, whole application",
            batches(lambda r: r.streaming), shared=True),
        row("**peer:** Structured Streaming with the COPY writer: each batch as the at-least-once job (the increment "
            "job's parse, row checks, sink rows, dead letters)", batches(lambda r: r.streaming_copy), shared=True),
        ratio("staging write / bare binary COPY, time (target ≤ 2.0)",
              checkpoint(lambda c, r: c.phase("write_staging") / r.limits.copy_bare)),
        ratio("staging write / COPY like staging, time",
              checkpoint(lambda c, r: c.phase("write_staging") / r.limits.copy_like_staging)),
        ratio("commit / INSERT … SELECT, time (target ≤ 1.2)",
              checkpoint(lambda c, r: c.commit / r.limits.insert_select)),
        ratio("commit and clean-up / INSERT … SELECT, time",
              checkpoint(lambda c, r: (c.commit + c.clean_up) / r.limits.insert_select)),
        ratio("exactly-once / at-least-once, time (target ≤ 1.05)",
              checkpoint(lambda c, r: c.end_to_end / r.at_least_once.seconds)),
        ratio("exactly-once / Structured Streaming with JDBC, throughput (target ≥ 1.2)",
              checkpoint(lambda c, r: r.streaming.seconds / c.end_to_end)),
        ratio("exactly-once / Structured Streaming with COPY, time (target ≤ 1.05)",
              checkpoint(lambda c, r: c.end_to_end / r.streaming_copy.seconds)),
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
           seconds: float, steps: list[growth.Step] | None = None) -> str:
    parts = [f"`{command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {machine()}; Spark local[2], "
             f"one local Kafka broker and PostgreSQL server; the benchmark took {seconds / 60:.1f} min "
             "(set-up not included)."]
    if results:
        parts += ["", throughput_table(results)]
    if figures is not None:
        parts += ["", airflow_table(figures, intervals)]
    if steps:
        parts += ["", growth.table(steps)]
    return "\n".join(parts)


def into_page(text: str, page: str, mode: str) -> str:
    """The page with `text` between the mode's benchmark markers (which must be there, once)."""
    begin, end = markers(mode)
    if page.count(begin) != 1 or page.count(end) != 1 or page.index(begin) > page.index(end):
        raise ValueError(f"{PAGE.name}: needs the markers {begin!r} and {end!r}, once each, in that order")
    head, rest = page.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{text}\n{end}{tail}"


def _positive(text: str) -> int:
    if int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text}: at least 1")
    return int(text)


def main() -> int:
    parser = argparse.ArgumentParser(prog="./dev bench", description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="1 M and 5 M orders, then the runs through Airflow")
    parser.add_argument("--sizes", nargs="*", type=int, help="orders per checkpoint (default: 1 M; with --full "
                                                             "1 M and 5 M)")
    parser.add_argument("--repetitions", type=_positive, default=3, help="interleaved repetitions per size")
    parser.add_argument("--intervals", type=int, default=10, help="intervals of the Airflow backfill (--full)")
    parser.add_argument("--no-airflow", action="store_true", help="with --full: without the runs through Airflow")
    parser.add_argument("--no-growth", action="store_true", help="with --full: without cost as the work grows")
    parser.add_argument("--growth-only", action="store_true",
                        help="cost as the work grows only (the Performance page is left as it is)")
    parser.add_argument("--growth-orders", type=_positive, default=1_000_000,
                        help="orders over each topic of cost as the work grows")
    parser.add_argument("--no-docs", action="store_true", help="do not write the documentation's Performance page")
    parser.add_argument("--profile", action="store_true",
                        help="also write where each checkpoint's time goes (its Spark event log, its job's CPU "
                             "by thread, PostgreSQL's statements) to profile.md beside its logs; the Performance "
                             "page is left as it is")
    args = parser.parse_args()
    sizes = [] if args.growth_only else args.sizes if args.sizes is not None else FULL if args.full else QUICK
    airflow = args.full and not args.no_airflow and not args.growth_only
    grows = args.growth_only or (args.full and not args.no_growth)
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
        for size in sizes:
            results.append(throughput.measure(size, servers, db_url, ARTIFACTS, args.repetitions,
                                              args.profile, connect=size <= CONNECT_UP_TO))
            print(throughput_table(results[-1:]), flush=True)
        figures = None if not airflow else airflow_runs.measure(servers, db_url, ARTIFACTS, args.intervals)
        steps = growth.measure(args.growth_orders, servers, db_url, ARTIFACTS) if grows else None
    finally:
        lifecycle.down(started)
    text = report(command, results, figures, args.intervals, time.monotonic() - began, steps)
    written = ARTIFACTS / f"bench-{time.strftime('%Y%m%dT%H%M%S')}.md"
    written.write_text(text + "\n")
    print(f"\n{text}\n\nwritten to {written}")
    # profiled figures carry the profiler's own cost; growth alone would replace the run's tables
    if not args.no_docs and not args.profile and not args.growth_only:
        PAGE.write_text(into_page(text, PAGE.read_text(), "full" if args.full else "quick"))
        print(f"and to {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
