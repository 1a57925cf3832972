"""Cost as the work grows (issue 63): checkpoints of 0 and 1,000 records beside one of N
orders, and the same N orders over topics of 4, 64 and 512 partitions. Each is one
checkpoint of a copy of the demo pipeline (tests/benchmarks/copies.py), run as the size
rows run theirs (tests/benchmarks/checkpoints.py: the plan, `tasks.begin_checkpoint` around
`Ledger.begin`, then the job by spark-submit, the task's pre-commit, the commit and its
clean-up), with no peers and no limits; one run each, not repeated.

- Partitions: N orders (`exactly_once_demo.produce`, the size rows' orders: the same seed,
  transactions of 50,000, every 7th aborted) to a topic of each size, made before they are
  produced. Each order is keyed by its number, not by its sku as the demo keys it, so that
  the orders spread over every partition: the demo's 100 keys (50 skus and their twins with
  a NUL) would leave most of 512 partitions empty. A sku's orders then lie in several
  partitions, so the upsert sink's newest by offset is not the newest produced; nothing
  here is compared with anything, and no figure depends on it.
- Records: on the first topic's pipeline, after its N-order checkpoint committed, a run
  with nothing new (0 records: the plan only; the DAG skips the job and the commit after an
  empty plan) and a run of 1,000 orders produced after it.

    ./dev bench --growth-only [--growth-orders 1000000] [--no-docs]

(`./dev bench --full` runs it after its other tables.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from exactly_once_demo.pipeline import config as demo_config
from exactly_once_demo.produce import order, produce
from tests.benchmarks import copies
from tests.benchmarks.checkpoints import CheckpointRun, TimedPipeline, submitted
from tests.benchmarks.throughput import PER_TRANSACTION

PARTITIONS = (4, 64, 512)
NEW = 1_000  # orders of the small checkpoint


@dataclass(frozen=True)
class Step:
    label: str
    partitions: int
    holding: int                # partitions whose frozen range holds offsets
    plan: float                 # seconds of `tasks.begin_checkpoint`, as the size rows' plan
    run: CheckpointRun | None   # None: nothing to read, no job (the plan was all of it)

    @property
    def records(self) -> int:
        return self.run.job.report["records"] if self.run else 0

    @property
    def end_to_end(self) -> float:
        return self.run.end_to_end if self.run else self.plan


def keyed_by_number(i: int, rng: random.Random, when: datetime) -> tuple[bytes, bytes]:
    """Order i of the demo's producer, keyed by its number (so that orders spread over every partition)."""
    return str(i).encode(), order(i, rng, when)[1]


def one(pipeline: TimedPipeline, servers: str, folder: Path, label: str, partitions: int, run_id: str) -> Step:
    checkpoint, plan = pipeline.plan(servers, run_id)
    holding = sum(1 for r in checkpoint.ranges if r.size)
    run = None if checkpoint.is_empty else submitted(pipeline, checkpoint.id, plan, servers,
                                                     folder / f"increment-{run_id}.log")
    return Step(label, partitions, holding, plan, run)


def measure(orders: int, servers: str, db_url: str, folder: Path, partitions=PARTITIONS) -> list[Step]:
    """The steps, fewest records first, then most partitions last."""
    by_records, by_partitions = [], []
    for count in partitions:
        name = f"bench_growth_{count}"  # the topic, the pipeline and its tables' schema
        config = demo_config(name, name, name)
        copies.remove(servers, db_url, config, [name])  # what an interrupted run left
        try:
            copies.create_topic(servers, name, count)
            produce(servers, orders, seed=orders, topic=name, per_transaction=PER_TRANSACTION, encoded=keyed_by_number)
            copies.create_demo_tables(db_url, name)
            pipeline = TimedPipeline(config, db_url)
            pipeline.ledger.register()
            (folder / name).mkdir(parents=True, exist_ok=True)
            by_partitions.append(one(pipeline, servers, folder / name, f"{orders:,} orders, {count} partitions",
                                     count, "all"))
            if count == partitions[0]:
                after = f"the {orders:,}-order checkpoint of {count} partitions below"
                by_records.append(one(pipeline, servers, folder / name, f"nothing new, after {after}", count,
                                      "nothing-new"))
                produce(servers, NEW, seed=NEW, topic=name, per_transaction=PER_TRANSACTION, encoded=keyed_by_number)
                by_records.append(one(pipeline, servers, folder / name, f"{NEW:,} orders produced after {after}",
                                      count, "new"))
        finally:
            copies.remove(servers, db_url, config, [name])
    return by_records + by_partitions


def table(steps: list[Step]) -> str:
    def seconds(value: float | None) -> str:
        return "" if value is None else f"{value:.2f} s"

    rows = ["| cost as the work grows: one checkpoint each, spark-submit | records read | partitions (holding "
            "records) | plan: `Ledger.begin` (target < 1 s at 512 partitions) | Spark job, whole application | "
            "commit and clean-up | end to end |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for s in steps:
        run = s.run
        rate = f" · {s.records / s.end_to_end:,.0f} records/s" if s.records else ""
        rows.append(f"| {s.label} | {s.records:,} | {s.partitions} ({s.holding}) | {s.plan:.2f} s | "
                    f"{seconds(run and run.job.seconds) or 'none'} | "
                    f"{seconds(run and run.commit + run.clean_up) or 'none'} | {s.end_to_end:.2f} s{rate} |")
    return "\n".join(rows)
