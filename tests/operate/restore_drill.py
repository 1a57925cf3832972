"""The restore drill (issue 62): a point-in-time restore of the pipeline database, then the
pipeline run again.

    ./dev restore-drill [--records 1000]

On a PostgreSQL cluster of its own (tests/operate/drill_cluster.py: the stack's binaries,
WAL archived, in .local/restore-drill/, left there for a look and emptied by the next
drill; the stack's server is not touched) and the stack's Kafka: a base backup; checkpoint 1 committed and published; a named restore point;
checkpoint 2 committed and published; the primary lost; a restore from the base backup and
the archive to the restore point; the pipeline run again (new records too); then the
runbook's way out for the kafka sink. It checks, and prints as a table with each step's
wall time, that

- the restored tables and ledger are those of checkpoint 1, and after the run again every
  record is in the tables exactly once (the oracle), the ledger's committed ranges cover
  every offset once and its invariants hold: the pipeline re-read from the restored frontier;
- a read_committed consumer of the kafka sink's topic sees no record twice: the records of
  checkpoint 2 stay as published before the restore (header exactly_once.checkpoint = 2),
  and publishing stops (`OutboxMismatch`, which status shows as STALLED) rather than
  publish them again; after the way out (the outbox rows the topic holds deleted, the
  sink's progress started over) the rest is published once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections import Counter
from contextlib import closing, contextmanager
from dataclasses import dataclass

from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.operate.status import read_status
from exactly_once.operate.status_report import render_refusal, table
from exactly_once.publishing.progress import OutboxMismatch
from tests.operate.drill_cluster import HOME, Cluster, fresh_home
from tests.operate.drill_pipeline import DrillPipeline

RESTORE_POINT = "restore_drill"


class DrillFailed(AssertionError):
    pass


def check(holds: bool, what: str) -> None:
    if not holds:
        raise DrillFailed(what)


@dataclass
class Step:
    name: str
    seconds: float
    shows: str = ""


@dataclass
class Report:
    steps: list[Step]
    status: str  # what status prints of the kafka sink after the run again

    def __str__(self) -> str:
        rows = [[s.name, f"{s.seconds:.1f}", s.shows] for s in self.steps]
        total = sum(s.seconds for s in self.steps)
        return f"{table(['step', 'wall s', 'shown'], rows)}\nthe steps' wall time {total:.1f} s"


def once(seen: list[tuple[int, int, int]]) -> bool:
    """No source record (partition, offset) published twice."""
    return all(n == 1 for n in Counter((p, o) for p, o, _ in seen).values())


def headers(seen: list[tuple[int, int, int]]) -> str:
    return ", ".join(f"{n} with checkpoint {c}" for c, n in sorted(Counter(c for _, _, c in seen).items())) or "none"


def drill(servers: str, records: int = 1000, home=HOME) -> Report:
    steps: list[Step] = []

    @contextmanager
    def step(name: str):
        started, shown = time.monotonic(), Step(name, 0.0)
        yield shown
        shown.seconds = time.monotonic() - started
        steps.append(shown)

    home = fresh_home(home)
    primary, restored = Cluster(home, "primary"), None
    try:
        with step("primary: initdb, archive_mode on, ledger migrated") as s:
            primary.init()
            primary.start()
            primary.create_database()
            pipeline = DrillPipeline(primary.connect, servers)
            ledger, driver = pipeline.at(primary.connect, primary.dsn())
            s.shows = f"pipeline {pipeline.name}: 3 tables and a kafka sink"
        with step("base backup (pg_basebackup)") as s:
            primary.base_backup(home / "base")
            s.shows = str(home / "base")
        with step("checkpoint 1: commit, publish") as s:
            first = pipeline.produce(0, records)
            one, failed = pipeline.run(ledger, driver)
            check(failed is None, f"checkpoint {one}'s publish failed: {failed}")
            s.shows = f"checkpoint {one}: {len(first)} records (1 a dead letter); topic: {headers(pipeline.published())}"
        with step("restore point (pg_create_restore_point)") as s:
            s.shows = f"{RESTORE_POINT!r} at LSN {primary.restore_point(RESTORE_POINT)}"
        with step("checkpoint 2: commit, publish") as s:
            second = pipeline.produce(records, records)
            two, failed = pipeline.run(ledger, driver)
            check(failed is None, f"checkpoint {two}'s publish failed: {failed}")
            before = pipeline.published()
            check(once(before), "a record published twice before the restore")
            s.shows = f"checkpoint {two}: {len(second)} records (1 a dead letter); topic: {headers(before)}"
        with step("primary lost (WAL archived, stopped)") as s:
            primary.archive_current_wal()
            primary.stop()
            s.shows = f"{sum(1 for _ in primary.archive.iterdir())} WAL files archived"
        with step("restore to the restore point, promote") as s:
            restored = primary.restored(home / "base", "restored", RESTORE_POINT)
            restored.start()
            restored.wait_promoted()
            ledger, driver = pipeline.at(restored.connect, restored.dsn())
            comparison = pipeline.tables_exact(first)
            check(comparison.exact, f"restored tables are not checkpoint {one}'s: {comparison}")
            s.shows = f"tables and ledger as of checkpoint {one}: exact"
        with step("run again: begin, commit, publish") as s:
            third = pipeline.produce(2 * records, records)
            again, failed = pipeline.run(ledger, driver)
            check(isinstance(failed, OutboxMismatch), f"publishing after the restore did not stop: {failed!r}")
            comparison = pipeline.tables_exact(first + second + third)
            check(comparison.exact, f"tables after the run again: {comparison}")
            check(not (wrong := pipeline.ledger_agrees()), f"the ledger disagrees: {wrong}")
            s.shows = (f"checkpoint {again}: checkpoint {two}'s {len(second)} records re-read, {len(third)} new; "
                       "tables = ledger = every record once")
        with step("consumers of the kafka sink's topic") as s:
            after = pipeline.published()
            check(after == before, "the topic changed after the restore")
            with closing(restored.connect()) as conn, KafkaOffsets(KafkaClient.at(servers)) as kafka:
                status = read_status(conn, kafka, pipeline.name)
            refused = [r for r in status.refusals if r.sink is not None]
            check(status.stopped and refused and "OutboxMismatch" in refused[0].error,
                  f"status does not name the stop: {status.refusals}")
            s.shows = f"no record twice ({headers(after)}); publishing STALLED: OutboxMismatch"
        with step("way out: skip what the topic holds, publish") as s:
            skipped = pipeline.skip_what_the_topic_holds()
            pipeline.publish(ledger)
            final = pipeline.published()
            check(once(final), "a record published twice after the way out")
            comparison = pipeline.all_exact()
            check(comparison.exact, f"after the way out: {comparison}")
            s.shows = f"{skipped} outbox rows skipped; topic: {headers(final)}; every sink exact"
        return Report(steps, render_refusal(pipeline.name, refused[0]))
    finally:
        if restored is not None:
            restored.stop()
        primary.stop()


def main() -> int:
    parser = argparse.ArgumentParser(prog="./dev restore-drill", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1000, help="records per batch (3 batches)")
    args = parser.parse_args()
    logging.getLogger("exactly_once").setLevel(logging.WARNING)  # the table, and what the product warns of
    servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not servers:
        raise SystemExit("KAFKA_BOOTSTRAP_SERVERS is not set: run `./dev up` and source .local/env.sh")
    started = time.monotonic()
    report = drill(servers, args.records)
    print(report)
    print(f"the drill's wall time {time.monotonic() - started:.1f} s (its directory emptied, servers stopped)")
    print(f"\nstatus after the run again:\n{report.status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
