"""The demo DAG through `airflow dags test` on real Airflow (PostgreSQL metadata DB),
Kafka, Spark and PostgreSQL: the three demo tables and the topic the demo publishes its
deltas to equal the oracle, to the row (Java's and librdkafka's read_committed consumers
see the same records, in key order); a checkpoint reprocessed from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from datetime import datetime, timezone

from exactly_once.publishing.transactions import CHECKPOINT_HEADER, REPLACES_HEADER
from exactly_once_demo.oracle import attempts, checkpoints
from exactly_once_demo.pipeline import DELTAS_TOPIC, PARTITIONS, TOPIC
from exactly_once_demo.produce import produce
from exactly_once_stack.settings import ROOT, process_environment
from tests.exactly_once_demo.oracle import assert_tables_equal_the_oracle, rows
from tests.kafka_records import as_printed, committed_records, java_committed_records, moment_after_every_marker_of
from tests.publishing.murmur2 import java_partition


def dags_test(logical_date: datetime, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["airflow", "dags", "test", "orders_exactly_once", logical_date.isoformat()],
                          env={**process_environment(), **env}, capture_output=True, text=True, timeout=600,
                          cwd=ROOT)


def test_consecutive_intervals_equal_the_oracle_then_empty_and_repeated_runs_change_nothing(
        fresh_demo, kafka_servers):
    interval_ends = []
    for _ in range(2):  # each interval ends after its batch: the next run takes the next batch
        produce(kafka_servers, 500)
        interval_ends.append(moment_after_every_marker_of(kafka_servers, TOPIC))
    for i, end in enumerate(interval_ends):
        faults = {"EXACTLY_ONCE_FAULTS": "commit_task.try1=raise"} if i == 1 else {}
        run = dags_test(end, **faults)
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
        if faults:  # the commit task failed on its first try and was retried
            assert "fault injected at commit_task.try1" in run.stdout + run.stderr
    after_two = assert_tables_equal_the_oracle(fresh_demo, kafka_servers)  # the deltas topic too
    assert_java_and_librdkafka_see_each_delta_once_in_key_order(kafka_servers, len(interval_ends))
    history = checkpoints(fresh_demo)
    assert [state for _, _, state, _ in history] == ["committed"] * 2 and all(r for *_, r in history)

    # An interval with no new records: begin_checkpoint short-circuits, Spark never starts.
    attempts_before = attempts(fresh_demo)
    empty = dags_test(datetime.now(timezone.utc))
    assert empty.returncode == 0, empty.stdout[-4000:] + empty.stderr[-4000:]
    assert "nothing to read" in empty.stdout + empty.stderr
    assert attempts(fresh_demo) == attempts_before
    assert checkpoints(fresh_demo)[-1][2:] == ("committed", None)

    # A new run at an interval end already processed (a manual re-run; `dags test` gives it a
    # new run id): the records of its interval belong to checkpoints 1 and 2, it reads
    # nothing, says who holds them, and changes nothing.
    again = dags_test(interval_ends[1])
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    held = again.stdout.split("are already held by checkpoint(s) ")[1].splitlines()[0]
    assert [int(part.split()[0]) for part in held.split("), ")] == [history[0][0], history[1][0]]
    assert rows(fresh_demo) == after_two
    assert attempts(fresh_demo) == attempts_before

    # The second checkpoint (whose commit was retried) reprocessed from the command line with the
    # configuration it ran with: what it takes back it puts in again, nothing changes, and the history says so.
    second = history[1][0]
    cli = subprocess.run([sys.executable, "-m", "exactly_once", "reprocess", "dags/orders_exactly_once.py",
                          str(second)], env=process_environment(), capture_output=True, text=True, timeout=600,
                         cwd=ROOT)
    assert cli.returncode == 0, cli.stdout[-4000:] + cli.stderr[-4000:]
    replaced = json.loads(cli.stdout.split("new: put in): ")[1])
    assert set(replaced) == {"orders", "sku_minute_totals", "sku_last_price", "sku_minute_deltas", "_dead_letters"}
    deltas = replaced.pop("sku_minute_deltas")  # Kafka takes nothing back: its records are published again
    assert deltas["old"] == 0 and deltas["new"] > 0, deltas
    assert all(r["old"] == r["new"] for r in replaced.values()) and replaced["orders"]["new"] > 0, replaced
    assert rows(fresh_demo) == after_two
    republished = [r for r in committed_records(kafka_servers, DELTAS_TOPIC)
                   if (REPLACES_HEADER, str(second).encode()) in r.headers]
    assert len(republished) == deltas["new"]
    assert_tables_equal_the_oracle(fresh_demo, kafka_servers)  # a consumer replacing the second checkpoint's deltas

    status = subprocess.run([sys.executable, "-m", "exactly_once.operate.status", "--pipeline", "orders"],
                            env=process_environment(), capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    lag = status.stdout.split("lag per partition (offsets):")[1].split("open checkpoints:")[0]
    lags = [int(line.split()[-1]) for line in lag.strip().splitlines()[2:]]
    assert lags == [0] * PARTITIONS, lag  # caught up, commit markers too
    assert "open checkpoints: none" in status.stdout
    assert f"committed, reprocesses {second}" in status.stdout


def assert_java_and_librdkafka_see_each_delta_once_in_key_order(servers: str, checkpoints: int) -> None:
    """Java's read_committed consumer and librdkafka's see the same records of the deltas
    topic: one per checkpoint and key, each key in the partition Java's partitioner gives it,
    its checkpoints in the order they were planned."""
    published = committed_records(servers, DELTAS_TOPIC)
    assert sorted(java_committed_records(servers, DELTAS_TOPIC)) == sorted(as_printed(published))
    per_key = defaultdict(list)
    for record in published:
        assert record.partition == java_partition(record.key, PARTITIONS), record
        per_key[record.key].append(int(dict(record.headers)[CHECKPOINT_HEADER]))
    assert per_key and all(ids == sorted(set(ids)) for ids in per_key.values()), per_key
    assert len({i for ids in per_key.values() for i in ids}) == checkpoints
