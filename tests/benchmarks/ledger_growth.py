"""The ledger's growth: a three-sink pipeline (append, upsert, aggregate) driven directly,
no Spark and no Kafka, through 1 k, 10 k and 100 k checkpoints, without and with retention.
At each size it prints the ledger's size on disk by table and, as medians over `--real`
checkpoints run through the protocol's own steps on top of that history: plan (begin),
start attempt, pre-commit, commit, the status command's read, the pipelines view's read, the
metrics scrape, and with retention its step after each commit.

The history is **bulk-written**: SQL writes, per checkpoint, exactly what the protocol
leaves of a committed one (the checkpoint with its phases' seconds, its attempt, frozen and
committed ranges, its contribution to each keyed sink, one dead letter), one checkpoint
every 5 minutes, so 100 k of them span 347 days and the clock stands a year in; the append
sink's final rows of that history are not written (a final table is the user's, not the
ledger). With retention it is written a day at a time, each day followed by retention's
steps until one finds nothing to do, as a step after each commit would keep it. Each chunk
written is then vacuumed (plain VACUUM ANALYZE): what autovacuum would have done in the
days the chunk stands for, which the bulk write compresses into seconds.

    ./dev bench-ledger [--sizes 1000 10000 100000] [--real 20] [--no-retention]
                       [--bloat-checkpoints 1000] [--bloat-rows 1000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import closing
from datetime import datetime, timezone

from psycopg2 import sql

from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.retention import prune
from exactly_once.ledger.tables import contributions_table, staging_name
from exactly_once.operate.metrics import exposition, read_samples
from exactly_once.operate.overview import read_overviews
from exactly_once.operate.status import pipelines, read_status
from exactly_once.operate.status_report import render
from exactly_once_stack import lifecycle
from exactly_once_stack.settings import LOCAL
from tests.benchmarks import staging_bloat
from tests.benchmarks.ledger_bench import (EVERY, KEYS_PER_CHECKPOINT, ORIGIN, PARTITIONS, Q, TOPIC, Clock, Offsets,
                                           checkpoint, database, pipeline, row_of, table, vacuum)
from tests.benchmarks.stopwatch import Stopwatch

FOLDER = LOCAL / "artifacts" / "bench-ledger"
PER_PARTITION = 40  # offsets per partition per checkpoint: 120 records, 119 rows per sink and a dead letter
DAY = 288           # checkpoints a day, one every 5 minutes
# Retention short enough that 1 k checkpoints (3.5 days) already reach its steady state.
RETENTION = {"reprocess_horizon": "P1D", "history": "P2D", "dead_letters": "P2D"}
STEPS = ("plan", "start_attempt", "pre_commit", "commit", "status", "view", "metrics", "retention_step")
LABELS = {"plan": "plan (begin)", "start_attempt": "start attempt", "pre_commit": "pre-commit", "commit": "commit",
          "status": "status command (read + render)", "view": "pipelines view (read_overviews)",
          "metrics": "metrics scrape (read + exposition)", "retention_step": "retention step after the commit"}
COUNTED = ("checkpoints", "attempts", "checkpoint_ranges", "committed_ranges", "dead_letters")


def write_history(ledger: Ledger, first: int, last: int) -> None:
    """Checkpoints g = first … last, committed, in one transaction (sql/benchmarks.sql `history`)."""
    config = ledger.config
    staged = {**{s.name: {"rows": PARTITIONS * PER_PARTITION - 1} for s in config.sinks}, "_dead_letters": {"rows": 1}}
    with ledger.rows() as rows:
        version = rows.record_version()
    with closing(ledger.connect()) as conn, conn, conn.cursor() as cur:
        cur.execute(Q["last_id"])
        params = {"pipeline": config.name, "topic": TOPIC, "first": first, "last": last, "origin": ORIGIN,
                  "every": EVERY, "per_partition": PER_PARTITION, "staged": json.dumps(staged),
                  "version": version, "after": cur.fetchone()[0], "keys_per_checkpoint": KEYS_PER_CHECKPOINT}
        cur.execute(Q["history"], params)
        for sink in config.sinks[1:]:
            table_ = contributions_table(config, sink)
            cur.execute(sql.SQL(Q["history_contributions"]).format(
                contributions=table_, **row_of(cur, ".".join(table_.strings))), params)


def grow(ledger: Ledger, clock: Clock, first: int, last: int, retention: bool) -> None:
    """History up to checkpoint `last`: in chunks of 10,000, or with retention a day at a
    time, retention's steps after each until it is idle; each chunk then vacuumed, as
    autovacuum would have in the time it stands for (ledger_bench.vacuum)."""
    chunk = DAY if retention else 10_000
    for start in range(first, last + 1, chunk):
        end = min(start + chunk - 1, last)
        write_history(ledger, start, end)
        clock.at = ORIGIN + (end + 1) * EVERY
        while retention and not prune(ledger).idle:
            pass
        vacuum(ledger)


def reads(ledger: Ledger) -> dict[str, float]:
    """The status command's, the pipelines view's and the metrics scrape's reads of the
    pipeline, each on a connection of its own (Kafka not asked: its answers do not grow)."""
    name, seconds = ledger.config.name, {}
    offsets = Offsets()
    with closing(ledger.connect()) as conn:
        with Stopwatch() as s:
            assert name in pipelines(conn)
            render(read_status(conn, offsets, name, history=10))
        seconds["status"] = s.seconds
        conn.rollback()
        with Stopwatch() as s:
            exposition(read_samples(conn, None, ledger.now(), only=[name]))
        seconds["metrics"] = s.seconds
    with Stopwatch() as s:
        read_overviews(ledger.connect, "not asked in this benchmark", history=20, dead_letters=10,
                       visible=lambda _dag_id: True, only=[name])
    seconds["view"] = s.seconds
    return seconds


def measure(ledger: Ledger, clock: Clock, g: int, real: int, retention: bool) -> dict[str, list[float]]:
    """`real` checkpoints from g on through the protocol, each followed by the reads (and
    with retention its step); every step's seconds."""
    found = {step: [] for step in STEPS if retention or step != "retention_step"}
    for n in range(g, g + real):
        for step, took in checkpoint(ledger, clock, n, PER_PARTITION).items():
            found[step].append(took)
        if retention:
            with Stopwatch() as s:
                prune(ledger)
            found["retention_step"].append(s.seconds)
        for step, took in reads(ledger).items():
            found[step].append(took)
    return found


def sizes(ledger: Ledger) -> tuple[dict[str, int], dict[str, int]]:
    """The ledger's tables' sizes on disk (staging and contributions named by their sink), and
    rows of the tables that grow with each checkpoint."""
    config = ledger.config
    names = {staging_name(config.name, s.name): f"staging: {s.name}" for s in config.sinks}
    names |= {staging_name(config.name, s.name, "ctb"): f"contributions: {s.name}" for s in config.sinks[1:]}
    with closing(ledger.connect()) as conn, conn, conn.cursor() as cur:
        cur.execute(Q["ledger_tables"])
        on_disk = {names.get(name, name): size for name, size in cur.fetchall()}
        counted = {}
        for name in (*COUNTED, *(n for n in names if n.startswith("ctb"))):
            cur.execute(sql.SQL(Q["count_rows"]).format(table=sql.Identifier("exactly_once", name)))
            counted[names.get(name, name)] = cur.fetchone()[0]
    return on_disk, counted


def series(db: str, checkpoints: list[int], real: int, retention: bool) -> dict[int, dict]:
    """One pipeline grown through the sizes; per size its sizes, rows and steps' seconds."""
    clock = Clock()
    ledger = pipeline(db, clock, **({"retention": RETENTION} if retention else {}))
    found, g = {}, 0
    for size in checkpoints:
        began = time.monotonic()
        if size - real > g:
            grow(ledger, clock, g, size - real - 1, retention)
            g = size - real
        bulk = time.monotonic() - began
        steps = measure(ledger, clock, g, real, retention)
        g += real
        on_disk, counted = sizes(ledger)
        found[size] = {"on_disk": on_disk, "rows": counted, "steps": steps, "bulk_seconds": bulk}
        print(f"{'with' if retention else 'without'} retention, {size:,} checkpoints: history written in "
              f"{bulk:.0f} s; {sum(on_disk.values()) / 2**20:.1f} MiB", flush=True)
    return found


def tables(found: dict[int, dict], real: int, retention: bool) -> str:
    sizes_ = sorted(found)
    header = ["", *(f"{s:,}" for s in sizes_), f"{sizes_[-1]:,} / {sizes_[0]:,}"]
    first, last = found[sizes_[0]], found[sizes_[-1]]
    title = (f"with retention ({', '.join(f'{k} {v}' for k, v in RETENTION.items())}; a day of checkpoints "
             "bulk-written, then retention's steps until idle)" if retention else "without retention")
    steps = [[LABELS[step], *(f"{1000 * statistics.median(found[s]['steps'][step]):.1f}" for s in sizes_),
              ratio(statistics.median(last["steps"][step]), statistics.median(first["steps"][step]))]
             for step in first["steps"]]
    names = sorted({n for f in found.values() for n, size in f["on_disk"].items() if size})
    on_disk = [[n, *(f"{found[s]['on_disk'].get(n, 0) / 2**20:.2f}" for s in sizes_),
                ratio(last["on_disk"].get(n, 0), first["on_disk"].get(n, 0))] for n in names]
    on_disk.append(["**the ledger**", *(f"**{sum(found[s]['on_disk'].values()) / 2**20:.2f}**" for s in sizes_),
                    ratio(sum(last["on_disk"].values()), sum(first["on_disk"].values()))])
    rows = [[n, *(f"{found[s]['rows'][n]:,}" for s in sizes_), ratio(last["rows"][n], first["rows"][n])]
            for n in first["rows"]]
    return "\n\n".join([
        f"### {title}",
        f"Milliseconds, medians of the {real} checkpoints run through the protocol at each size "
        "(on top of the bulk-written history)", table(header, steps),
        "The ledger on disk (MiB, `pg_total_relation_size`: indexes and TOAST included), by table",
        table(header, on_disk), "Rows", table(header, rows)])


def ratio(last: float, first: float) -> str:
    return f"{last / first:.2f}×" if first else "–"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="./dev bench-ledger", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000], help="checkpoints")
    parser.add_argument("--real", type=int, default=20, help="checkpoints run through the protocol at each size")
    parser.add_argument("--no-retention", action="store_true", help="the series without retention only")
    parser.add_argument("--bloat-checkpoints", type=int, default=1000,
                        help="checkpoints of the staging tables' bloat run (0: none)")
    parser.add_argument("--bloat-rows", type=int, default=1000, help="rows per sink per checkpoint there")
    args = parser.parse_args(argv)
    began = time.monotonic()
    lifecycle.up()
    FOLDER.mkdir(parents=True, exist_ok=True)
    checkpoints = sorted(args.sizes)
    if checkpoints[0] <= args.real:
        parser.error(f"every size must be more than --real ({args.real})")
    out = [f"`./dev bench-ledger` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; history **bulk-written** "
           f"(each checkpoint {PARTITIONS * PER_PARTITION} records: {PARTITIONS * PER_PARTITION - 1} rows per sink "
           f"and a dead letter, {KEYS_PER_CHECKPOINT} keys of the keyed sinks), one checkpoint every 5 minutes"]
    for retention in (False,) if args.no_retention else (False, True):
        with database("retention" if retention else "forever") as db:
            out.append(tables(series(db, checkpoints, args.real, retention), args.real, retention))
        print("\n\n".join(out[-1:]), flush=True)
    if args.bloat_checkpoints:
        out.append(staging_bloat.run(args.bloat_checkpoints, args.bloat_rows))
        print(out[-1], flush=True)
    out.append(f"took {(time.monotonic() - began) / 60:.1f} min")
    report = "\n\n".join(out) + "\n"
    (FOLDER / "ledger-growth.md").write_text(report)
    print(f"\n{report}\n(written to {FOLDER / 'ledger-growth.md'})")
    return report

if __name__ == "__main__":
    main()
