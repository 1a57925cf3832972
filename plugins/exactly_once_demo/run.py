"""The demo behind `./dev demo`: on running services, produce orders and run one
checkpoint of `orders_exactly_once` per batch through Airflow (`airflow dags test`,
each interval ending after its batch), then print the tables' row counts, the
checkpoint history and the lag per partition. Each call adds new orders and new
checkpoints, so it can run any number of times.

    python -m exactly_once_demo.run [--runs N] [--orders N] [--logs DIR]

Reads the Airflow connections kafka_default and pipeline_db, and Airflow's settings
from the environment (`./dev demo` sources .local/env.sh first).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import time
from contextlib import closing
from datetime import datetime, timezone
from pathlib import Path

from psycopg2 import sql

from exactly_once import connections
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.tables import final_table
from exactly_once.operate.status import read_status
from exactly_once.operate.status_report import render, table
from exactly_once_demo.pipeline import CONFIG, DELTAS_TOPIC
from exactly_once_demo.prepare import create_tables
from exactly_once_demo.produce import ensure_topic, produce

DAG_ID = "orders_exactly_once"  # dag.py


def run_checkpoint(number: int, interval_end: datetime, logs: Path) -> None:
    log = logs / f"run-{interval_end:%Y%m%dT%H%M%S}.log"
    print(f"checkpoint run {number}: airflow dags test {DAG_ID} {interval_end.isoformat()}  (log: {log})", flush=True)
    started = time.monotonic()
    with log.open("w") as out:
        finished = subprocess.run(["airflow", "dags", "test", DAG_ID, interval_end.isoformat()],
                                  stdout=out, stderr=subprocess.STDOUT)
    lines = log.read_text().splitlines()
    if finished.returncode != 0:
        print("\n".join(lines[-60:]))
        raise SystemExit(f"the DAG run ending {interval_end.isoformat()} failed; full log in {log}")
    said = [line for line in lines if "checkpoint " in line and ("nothing to read" in line or ": committed" in line
                                                                 or "(new)" in line)]
    for line in said:  # what begin_checkpoint and commit printed, without the log's prefix and suffix
        print("    " + re.split(r"\s+\[[\w.]+\]\s", line[line.index("checkpoint "):])[0].split("  ")[0])
    for line in lines:  # what the publish task published
        if "Kafka transactions" in line and "sink " in line and "Returned value" not in line:
            print("    " + re.split(r"\s+\[[\w.]+\]\s", line[line.index("sink "):])[0].split("  ")[0])
    print(f"    DAG run succeeded in {time.monotonic() - started:.0f} s", flush=True)


def row_counts(connect) -> str:
    rows = []
    with closing(connect()) as conn, conn.cursor() as cur:
        for sink in CONFIG.sinks:
            if sink.mode == "kafka":  # its table is never written: its records are in Kafka
                rows.append([f"Kafka topic {sink.topic}", sink.mode, "(read_committed consumers)"])
                continue
            cur.execute(sql.SQL("SELECT count(*) FROM {}").format(final_table(sink)))
            rows.append([sink.table, sink.mode, cur.fetchone()[0]])
        cur.execute("SELECT count(*) FROM exactly_once.dead_letters WHERE pipeline = %s", (CONFIG.name,))
        rows.append(["exactly_once.dead_letters", f"pipeline {CONFIG.name}", cur.fetchone()[0]])
    return table(["table", "sink", "rows"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m exactly_once_demo.run", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="checkpoints to run (default 3)")
    parser.add_argument("--orders", type=int, default=2000, help="orders produced before each run")
    parser.add_argument("--logs", type=Path, default=Path(".local/demo"),
                        help="folder for each DAG run's log (default .local/demo)")
    args = parser.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    connect = connections.for_command_line(connections.connector)
    kafka_client = connections.for_command_line(connections.kafka_client)
    with closing(connect()) as conn:
        create_tables(conn)
    ensure_topic(kafka_client, DELTAS_TOPIC)
    for number in range(1, args.runs + 1):
        produce(kafka_client, args.orders, seed=time.time_ns())
        run_checkpoint(number, datetime.now(timezone.utc), args.logs)
    print("\nrows per table:\n" + row_counts(connect) + "\n")
    with closing(connect()) as conn, KafkaOffsets(kafka_client) as kafka:
        print(render(read_status(conn, kafka, CONFIG.name, history=max(6, args.runs))))


if __name__ == "__main__":
    main()
