"""Staging tables are filled and emptied every checkpoint: their dead tuples and size on disk
over N checkpoints run through the protocol (begin, start attempt, ~1,000 synthetic staged
rows per sink, pre-commit, commit and its clean-up), sampled every N/10, under the stack's
autovacuum settings. Twice: a pipeline whose checkpoints run one at a time, so the clean-up
truncates each table; and one beside a checkpoint left running with rows staged, so every
clean-up finds another checkpoint's rows and DELETEs instead (exactly_once.ledger.clean_up).
Part of `./dev bench-ledger` (ledger_growth.py).
"""

from __future__ import annotations

import time
from contextlib import closing


from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.tables import DEAD_LETTER_STAGING, staging_table
from tests.benchmarks.ledger_bench import (PARTITIONS, Q, Clock, Offsets, checkpoint, database, pipeline, stage,
                                           table)

SETTINGS = ("autovacuum_naptime", "autovacuum_vacuum_threshold", "autovacuum_vacuum_scale_factor",
            "autovacuum_vacuum_insert_threshold", "autovacuum_vacuum_insert_scale_factor",
            "autovacuum_vacuum_cost_delay", "autovacuum_vacuum_cost_limit")
OTHERS = ("checkpoints", "attempts")  # ledger tables every checkpoint updates


def watched(ledger: Ledger) -> dict[str, str]:
    """The tables sampled, by what they are: each sink's staging table, the dead letters' and
    the checkpoints' and attempts'."""
    config = ledger.config
    return {**{f"staging: {s.name}": ".".join(staging_table(config, s.name).strings) for s in config.sinks},
            "staging: dead letters": ".".join(DEAD_LETTER_STAGING.strings),
            **{f"ledger: {name}": f"exactly_once.{name}" for name in OTHERS}}


def sample(ledger: Ledger) -> dict[str, tuple[int, int, int]]:
    """Per table: dead tuples, size on disk, autovacuum runs so far."""
    found = {}
    with closing(ledger.connect()) as conn, conn, conn.cursor() as cur:
        for label, name in watched(ledger).items():
            cur.execute(Q["table_stats"], {"table": name})
            dead, _live, size, _last, runs = cur.fetchone()
            found[label] = (dead, size, runs)
    return found


def settings(ledger: Ledger) -> str:
    with closing(ledger.connect()) as conn, conn, conn.cursor() as cur:
        cur.execute("SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s) ORDER BY name", (list(SETTINGS),))
        return ", ".join(f"{name.removeprefix('autovacuum_')} {value}{unit or ''}" for name, value, unit in cur.fetchall())


def bloat(db: str, checkpoints: int, per_partition: int, beside_open: bool) -> tuple[list[list[str]], str]:
    """The samples' table rows (dead tuples / MiB per table, every checkpoints/10), and the
    autovacuum settings they ran under."""
    clock = Clock()
    ledger = pipeline(db, clock, **({"lease": "P30D"} if beside_open else {}))
    first = 0
    if beside_open:  # checkpoint 0 stays running, its rows staged: no clean-up may truncate
        offsets = Offsets()
        offsets.end = per_partition
        parked = ledger.begin("parked", None, None, offsets).checkpoint.id
        stage(ledger, parked, ledger.start_attempt(parked).attempt, 0, per_partition)
        first = 1
    every = max(1, checkpoints // 10)
    rows, began = [], time.monotonic()
    for g in range(first, first + checkpoints):
        checkpoint(ledger, clock, g, per_partition)
        done = g - first + 1
        if done % every == 0:
            found = sample(ledger)
            rows.append([f"{done:,}", f"{time.monotonic() - began:.0f}",
                         *(f"{dead:,} / {size / 2**20:.2f} ({runs})" for dead, size, runs in found.values())])
    return rows, settings(ledger)


def run(checkpoints: int, rows_per_sink: int) -> str:
    per_partition = max(1, round((rows_per_sink + 1) / PARTITIONS))
    out = []
    for beside_open in (False, True):
        with database("delete" if beside_open else "truncate") as db:
            samples, shown = bloat(db, checkpoints, per_partition, beside_open)
        labels = ["staging: events", "staging: latest", "staging: totals", "staging: dead letters",
                  *(f"ledger: {name}" for name in OTHERS)]
        how = ("beside a checkpoint left running with rows staged: every clean-up DELETEs" if beside_open else
               "checkpoints one at a time: every clean-up TRUNCATEs")
        out += [f"### Staging bloat, {how}",
                f"{checkpoints:,} checkpoints of {PARTITIONS * per_partition - 1:,} rows per sink; each cell: dead "
                f"tuples / MiB on disk (autovacuum runs so far); the stack's autovacuum settings: {shown}",
                table(["checkpoints", "s", *labels], samples)]
        print("\n\n".join(out[-3:]), flush=True)
    return "\n\n".join(out)
