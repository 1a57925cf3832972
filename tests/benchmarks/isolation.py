"""Isolation's cost: k orders that the transform's Python UDF raises on, among N demo orders,
each found by record isolation and set aside as a dead letter while the rest commits; beside a
checkpoint of the same orders with none raising (k = 0). Each checkpoint is a fresh copy of the
demo pipeline with the transform tests/benchmarks/raising.py, run as its tasks run it (plan,
spark-submit of the job, commit); repetitions interleaved (the k that runs first
rotates), medians printed with each repetition's value in brackets. A run fails unless the
dead letters with the transform's reason are exactly the k raising orders.

    ./dev bench-isolation [--orders 1000000] [--raising 1 10] [--repetitions 3] [--profile]
                          [--udf-seconds 0.15]

With --profile, each checkpoint's Spark event log is written beside its log, and read into
`<pipeline>-profile.md`: its SQL executions (each probe is one) with their stages' tasks,
run, CPU and GC seconds, and the job's CPU by thread (tests/benchmarks/profiling.py). With
--udf-seconds, the UDF takes that long an order (a UDF calling a model or a service): what
running the transform again costs shows.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import time
from contextlib import closing
from datetime import datetime, timezone
from pathlib import Path

import psycopg2

from exactly_once import connections
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.checkpoints import Outcome
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.migrate import migrate
from exactly_once.ledger.protocol import Ledger
from exactly_once.orchestration import tasks
from exactly_once.spark.settings import JobSettings
from exactly_once.spark.shipping import code_archive, launcher
from exactly_once_demo.pipeline import config as demo_config
from exactly_once_demo.produce import ABORT_EVERY, MALFORMED_EVERY, POISON_EVERY, order, produce
from exactly_once_stack import lifecycle
from exactly_once_stack.settings import LOCAL, process_environment
from tests.benchmarks import copies, profiling
from tests.benchmarks.raising import MARK
from tests.benchmarks.spark_app import increment_job
from tests.benchmarks.throughput import PER_TRANSACTION

TRANSFORM = "tests.benchmarks.raising:prepare_raising"
PROBE = re.compile(r"exactly_once\.spark\.(staging|rows_step): probe: ")  # a probe's job, or a sweep's


def raising_at(orders: int, k: int) -> set[int]:
    """k order numbers spread evenly over the orders, each moved on to the next one that the
    demo's producer writes as a valid order in a committed transaction."""
    chosen = set()
    for j in range(k):
        i = (2 * j + 1) * orders // (2 * k)
        while (i // PER_TRANSACTION) % ABORT_EVERY == ABORT_EVERY - 1 or i % MALFORMED_EVERY == MALFORMED_EVERY - 1 \
                or i % POISON_EVERY == POISON_EVERY - 1:
            i += 1
        chosen.add(i)
    return chosen


def raising_orders(chosen: set[int]):
    """`produce`'s encoder: the demo's orders, those numbered in `chosen` with an id the UDF raises on."""
    def encoded(i: int, rng: random.Random, when: datetime) -> tuple[bytes, bytes]:
        key, value = order(i, rng, when)
        return key, value.replace(b'"order_id": "', f'"order_id": "{MARK}'.encode(), 1) if i in chosen else value
    return encoded


def checkpoint(k: int, topic: str, repetition: int, servers: str, db_url: str, folder: Path,
               profile: bool = False) -> dict:
    """One checkpoint of a fresh copy of the demo over the whole topic: its job's figures (and
    with `profile`, its Spark timeline and CPU by thread in `<name>-profile.md`)."""
    name = f"iso_{k}_{repetition}"
    config = demo_config(name, topic, name, transform=TRANSFORM)
    copies.forget(db_url, config, [name])
    copies.create_demo_tables(db_url, name)
    ledger = Ledger(config, lambda: psycopg2.connect(db_url))
    ledger.register()
    settings = JobSettings(connections.pipeline_db_url(connections.PIPELINE_DB_JOB), KafkaClient.at(servers))
    with KafkaOffsets(KafkaClient.at(servers)) as kafka:
        checkpoint_id = tasks.begin_checkpoint(ledger, kafka, "benchmark", None, datetime.now(timezone.utc)
                                               ).checkpoint.id
    jobs, log = [], folder / f"{name}.log"
    shipped = {"spark.submit.pyFiles": str(code_archive(config))}  # the transform's package, as the task ships it
    event_logs = folder / f"{name}-event-logs"
    if profile:
        shutil.rmtree(event_logs, ignore_errors=True)
        shipped.update(profiling.event_log_conf(event_logs))
    with settings.written() as settings_file:
        job = increment_job(launcher(), settings_file, log, jobs, shipped, cpu=profile)
        tasks.run_increment(ledger, checkpoint_id, job)
    if tasks.commit_checkpoint(ledger, checkpoint_id, try_number=1) is not Outcome.COMMITTED:
        raise AssertionError(f"{name}: checkpoint {checkpoint_id} not committed")
    raised = copies.execute(db_url, "SELECT value FROM exactly_once.dead_letters WHERE pipeline = %(p)s "
                                    "AND reason LIKE %(r)s", {"p": name, "r": f"transform {TRANSFORM}: %"})
    copies.forget(db_url, config, [name])
    marked = f'"order_id": "{MARK}'.encode()
    if len(raised) != k or not all(marked in bytes(value) for value, in raised):
        raise AssertionError(f"{name}: the transform's dead letters are not the {k} raising orders; log {log}")
    if profile:
        profiling.write_profile(folder / f"{name}-profile.md", event_logs, {}, name, jobs[0])
    report = jobs[0].report
    seconds = report["seconds"]
    return {"job": jobs[0].seconds, "read": seconds["read"], "write_staging": seconds["write_staging"],
            "isolate": seconds.get("isolate", 0.0), "probes": len(PROBE.findall(log.read_text(errors="replace"))),
            "java_peak_gib": jobs[0].peak_jvm / 2**30}


def table(orders: int, runs: dict[int, list[dict]]) -> str:
    ks = sorted(runs)
    lines = [f"{orders:,} orders; k of them raise in the transform's UDF; medians of {len(runs[ks[0]])} "
             "[each repetition]", "",
             "| | " + " | ".join(f"k = {k}" for k in ks) + " |", "|---|" + "---:|" * len(ks)]
    for figure, label, shown in (("job", "job, spark-submit to exit (s)", ".1f"),
                                 ("read", "· read + parse (s)", ".1f"),
                                 ("write_staging", "· staging writes, failed rounds included (s)", ".1f"),
                                 ("isolate", "· isolating (s)", ".1f"), ("probes", "probes", ".0f"),
                                 ("java_peak_gib", "driver JVM peak (GiB)", ".2f")):
        cells = []
        for k in ks:
            values = [r[figure] for r in runs[k]]
            cells.append(f"{statistics.median(values):{shown}} [{', '.join(f'{v:{shown}}' for v in values)}]")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="./dev bench-isolation", description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--raising", type=int, nargs="+", default=[1, 10], help="how many orders raise (k)")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--profile", action="store_true",
                        help="and each checkpoint's Spark timeline and CPU by thread, beside its log")
    parser.add_argument("--udf-seconds", type=float, default=0.0,
                        help="how long the UDF takes an order (tests/benchmarks/raising.py)")
    args = parser.parse_args()
    began = time.monotonic()
    os.environ["EXACTLY_ONCE_BENCH_UDF_SECONDS"] = str(args.udf_seconds)  # the jobs' Python workers read it
    lifecycle.up()
    os.environ.update(process_environment())
    servers, db_url = os.environ["KAFKA_BOOTSTRAP_SERVERS"], os.environ["PIPELINE_DB_URL"]
    with closing(psycopg2.connect(db_url)) as conn:
        migrate(conn)
    folder = LOCAL / "artifacts" / "bench-isolation"
    folder.mkdir(parents=True, exist_ok=True)
    ks = [0, *args.raising]
    topics = {k: f"bench_iso_{args.orders}_{k}" for k in ks}
    try:
        for k, topic in topics.items():
            copies.delete_topic(servers, topic)
            produce(servers, args.orders, seed=args.orders, topic=topic, per_transaction=PER_TRANSACTION,
                    encoded=raising_orders(raising_at(args.orders, k)))
        runs = {k: [] for k in ks}
        for repetition in range(args.repetitions):
            for k in ks[repetition % len(ks):] + ks[:repetition % len(ks)]:
                runs[k].append(checkpoint(k, topics[k], repetition, servers, db_url, folder, args.profile))
                print(f"k={k} repetition {repetition}: {runs[k][-1]}", flush=True)
    finally:
        for topic in topics.values():
            copies.delete_topic(servers, topic)
    slow = f", the UDF {args.udf_seconds} s an order" if args.udf_seconds else ""
    print(f"\n`./dev bench-isolation` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, Spark local[2]{slow}; "
          f"took {(time.monotonic() - began) / 60:.1f} min\n\n{table(args.orders, runs)}")


if __name__ == "__main__":
    main()
