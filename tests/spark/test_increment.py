"""The Spark increment job against real Kafka, Spark and PostgreSQL: its staging
rows equal the oracle computed from what was produced, for every sink mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import psycopg2
import pytest
from psycopg2 import sql

from exactly_once.db import jdbc_options
from exactly_once.faults import ENV as FAULTS
from exactly_once.faults import InjectedFault
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.checkpoints import Outcome, State
from exactly_once.ledger.planning import Reach
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.refusals import Fenced
from exactly_once.ledger.tables import DEAD_LETTER_STAGING, qualified, staging_table
from exactly_once.sinks._keyed import STAGED, Keyed
from exactly_once.spark import one_pass
from exactly_once.spark.increment import run_attempt
from exactly_once.spark.settings import JobSettings, private_file
from exactly_once.spark.shipping import launcher
from exactly_once.spark.staging import BadRecords
from exactly_once.spark.staging_writes import StagingWrites
from exactly_once_stack import spark_cluster
from tests import oracle
from tests.job_role import job_db_url
from tests.kafka_records import moment_after_the_last_marker
from tests.ledger.harness import Pipeline, committed_records, row_of, workload
from tests.oracle import Record
from tests.spark.poison import written_table_by_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pipeline(ledger_db, kafka_servers, topic) -> Pipeline:
    return Pipeline(ledger_db, kafka_servers, topic)


def attempt(spark, pipeline: Pipeline, checkpoint_id: int, token: int):
    """The job's attempt, then its task's pre-commit of what the job reports."""
    url = job_db_url()
    as_job = Ledger.of_attempt(pipeline.config.name, checkpoint_id, token, lambda: psycopg2.connect(url))
    report = run_attempt(spark, as_job, checkpoint_id, token, pipeline.ledger.attempt_token(checkpoint_id, token),
                         KafkaClient.at(pipeline.servers), jdbc_options(url))
    return pipeline.ledger.pre_commit(checkpoint_id, token, report.rows, report.records), report


def staged(pipeline: Pipeline, checkpoint_id: int) -> dict[str, set]:
    """Every staging row of the checkpoint, per sink (its final table's columns), with the
    attempt that wrote it; a keyed sink's folded per key and attempt as its commit folds them
    (each Spark task of the one-pass write stages its own fold of its rows)."""
    with closing(psycopg2.connect(pipeline.db_url)) as conn, conn.cursor() as cur:
        out = {}
        for sink in pipeline.config.sinks:
            table, columns = staging_table(pipeline.config, sink.name), oracle.table_columns(cur, sink)
            out[sink.name] = set()
            cur.execute(sql.SQL("SELECT DISTINCT attempt FROM {} WHERE checkpoint_id = %s").format(table),
                        (checkpoint_id,))
            for (tag,) in cur.fetchall():
                rows = sql.SQL("SELECT {columns} FROM {table} WHERE {staged}").format(
                    columns=sql.SQL(", ").join(map(sql.Identifier, columns)),
                    table=table, staged=STAGED)
                if isinstance(sink.strategy, Keyed):
                    rows = sink.strategy.folded(sink, table, STAGED,
                                                [*columns, *sink.strategy.marks(sink)])
                cur.execute(rows, {"checkpoint_id": checkpoint_id, "attempt": tag})
                out[sink.name] |= {(*row[:len(columns)], tag) for row in cur.fetchall()}
        cur.execute('SELECT topic, partition, "offset", key, value, reason, attempt FROM '
                    f"{qualified(DEAD_LETTER_STAGING)} WHERE checkpoint_id = %s", (checkpoint_id,))
        out["dead_letters"] = {(t, p, o, k and bytes(k), bytes(v), r, a) for t, p, o, k, v, r, a in cur.fetchall()}
    return out


def in_ranges(pipeline: Pipeline, checkpoint) -> list[Record]:
    return [r for r in committed_records(pipeline.produced, pipeline.topic)
            if any(r.partition == range_.partition and range_.start <= r.offset < range_.end
                   for range_ in checkpoint.ranges)]


def expected_staging(pipeline: Pipeline, records: list[Record], token: int) -> dict[str, set]:
    """What the oracle says each sink's staging holds for `records`, in its final table's columns."""
    expected = oracle.expected(pipeline.config, records, row_of)
    return {sink: {(*row, token) for row in expected.values(sink, columns)}
            for sink, columns in oracle.final_columns(pipeline.db_url, pipeline.config).items()}


@pytest.mark.parametrize("way", ["one pass", "table by table"])
def test_staging_equals_the_oracle_for_every_sink_mode_and_names_each_bad_record(spark, pipeline, monkeypatch, way):
    """No sink table refuses a row of the workload (its bad records do not parse): the attempt
    is staged in one pass (exactly_once.spark.one_pass; the table-by-table write would fail),
    or, where the pass serves no pipeline, table by table: the same staging either way."""
    if way == "one pass":
        monkeypatch.setattr(StagingWrites, "every_table", written_table_by_table)
    else:
        monkeypatch.setattr(one_pass, "plan", lambda *args: None)
    pipeline.produce(workload(0))
    checkpoint = pipeline.begin().checkpoint
    token = pipeline.ledger.start_attempt(checkpoint.id).attempt
    committable, report = attempt(spark, pipeline, checkpoint.id, token)

    records = in_ranges(pipeline, checkpoint)
    found = staged(pipeline, checkpoint.id)
    assert {k: v for k, v in found.items() if k != "dead_letters"} == expected_staging(pipeline, records, token)
    reasons = {b"{not json": "value is not valid JSON",
               b'{"id": "o9", "k": "fig", "n": "nine"}': "value does not fit the schema: n: missing or not bigint"}
    assert found["dead_letters"] == {(r.topic, r.partition, r.offset, r.key, r.value, reasons[r.value], token)
                                     for r in records if r.value in reasons}
    assert len(found["dead_letters"]) == 2
    assert report.records == len(records) == 16
    assert committable.staged["events"].rows == 14

    assert pipeline.ledger.commit(checkpoint.id) is Outcome.COMMITTED
    pipeline.assert_exact()


def test_a_table_whose_write_fails_beside_the_others_is_written_again_alone_each_row_once(spark, pipeline,
                                                                                         monkeypatch):
    """Written table by table (the one pass serves no pipeline here), the staging tables are
    written at once. The first COPY into `events` is refused (by a trigger raising, once, after
    another task's COPY into it committed: a failure a record could cause, which does not happen
    again) while the other tables' writes commit: `events` is written again alone, and the rows
    its failed job's tasks committed go, so pre-commit counts each row once and staging is the
    oracle's."""
    monkeypatch.setattr(one_pass, "plan", lambda *args: None)
    pipeline.produce(workload(0))
    checkpoint = pipeline.begin().checkpoint
    token = pipeline.ledger.start_attempt(checkpoint.id).attempt
    events, copies = qualified(staging_table(pipeline.config, "events")), f"public.{pipeline.config.name}_copies"
    with closing(psycopg2.connect(pipeline.db_url)) as conn, conn, conn.cursor() as cur:
        cur.execute(f"""
            CREATE SEQUENCE {copies};
            CREATE TABLE {copies}_committed (writer_task bigint);  -- each row a committed COPY wrote
            CREATE FUNCTION {copies}_refused_once() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
            BEGIN
              IF nextval('{copies}') = 1 THEN  -- once another task's COPY committed (up to a minute)
                WHILE NOT EXISTS (SELECT FROM {copies}_committed)
                      AND clock_timestamp() < statement_timestamp() + interval '60 s' LOOP
                  PERFORM pg_sleep(0.1);
                END LOOP;
                RAISE EXCEPTION 'the first COPY into events is refused';
              END IF;
              RETURN NULL;
            END $$;
            CREATE FUNCTION {copies}_logged() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
            BEGIN
              INSERT INTO {copies}_committed VALUES (NEW.writer_task);
              RETURN NULL;
            END $$;
            CREATE TRIGGER refused_once BEFORE INSERT ON {events}
              FOR EACH STATEMENT EXECUTE FUNCTION {copies}_refused_once();
            CREATE TRIGGER logged AFTER INSERT ON {events} FOR EACH ROW EXECUTE FUNCTION {copies}_logged();""")
    try:
        committable, report = attempt(spark, pipeline, checkpoint.id, token)  # pre-commit counts every table
        found = staged(pipeline, checkpoint.id)
        assert {k: v for k, v in found.items() if k != "dead_letters"} == expected_staging(
            pipeline, in_ranges(pipeline, checkpoint), token)
        assert len(found["dead_letters"]) == 2 and committable.staged["events"].rows == 14
        with closing(psycopg2.connect(pipeline.db_url)) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT DISTINCT writer_task FROM {copies}_committed")
            committed = {task for task, in cur.fetchall()}
            cur.execute(f"SELECT DISTINCT writer_task FROM {events} WHERE checkpoint_id = %s", (checkpoint.id,))
            kept = {task for task, in cur.fetchall()}
        assert kept < committed  # tasks of the failed job committed rows, which went
        assert pipeline.ledger.commit(checkpoint.id) is Outcome.COMMITTED
        pipeline.assert_exact()
    finally:
        with closing(psycopg2.connect(pipeline.db_url)) as conn, conn, conn.cursor() as cur:
            cur.execute(f"DROP TRIGGER refused_once ON {events}; DROP TRIGGER logged ON {events}; "
                        f"DROP FUNCTION {copies}_refused_once(); DROP FUNCTION {copies}_logged(); "
                        f"DROP TABLE {copies}_committed; DROP SEQUENCE {copies}")


def test_ranges_ending_on_markers_or_holding_only_aborted_records_finish_with_no_rows(spark, pipeline):
    pipeline.produce([(False, [(p, b"k", b'{"id": "x", "k": "k", "n": 1}') for p in (0, 1, 2)]),
                      (True, [(0, b"k", b'{"id": "y", "k": "k", "n": 2}')]),
                      (False, [(0, b"k", b'{"id": "z", "k": "k", "n": 3}')])])
    checkpoint = pipeline.begin().checkpoint
    assert all(r.size >= 2 for r in checkpoint.ranges)  # markers and aborted records only in 1 and 2
    token = pipeline.ledger.start_attempt(checkpoint.id).attempt
    _, report = attempt(spark, pipeline, checkpoint.id, token)
    assert report.records == 1 and report.rows["events"] == 1
    pipeline.ledger.commit(checkpoint.id)
    pipeline.assert_exact()


def test_a_checkpoint_with_several_ranges_in_a_partition_stages_exactly_their_records(spark, pipeline):
    """A run that is not a backfill, after a backfill took a later interval, reads the
    unclaimed offsets on both sides of it: two ranges per partition, one Kafka read each."""
    pipeline.produce(workload(0))
    interval_start = moment_after_the_last_marker()
    pipeline.produce(workload(1000, rounds=1))
    interval_end = moment_after_the_last_marker()
    pipeline.produce(workload(2000))
    backfill = pipeline.begin(interval_start=interval_start, interval_end=interval_end, reach=Reach.INTERVAL)
    checkpoint = pipeline.begin().checkpoint
    assert len(checkpoint.ranges) == 6 and {r.partition for r in checkpoint.ranges} == {0, 1, 2}
    for begun in (backfill.checkpoint, checkpoint):
        token = pipeline.ledger.start_attempt(begun.id).attempt
        attempt(spark, pipeline, begun.id, token)
        found = staged(pipeline, begun.id)
        assert {k: v for k, v in found.items() if k != "dead_letters"} == expected_staging(
            pipeline, in_ranges(pipeline, begun), token)
        assert pipeline.ledger.commit(begun.id) is Outcome.COMMITTED
    pipeline.assert_exact()


def test_a_second_attempt_replaces_the_first_attempts_staging(spark, pipeline, monkeypatch):
    pipeline.produce(workload(0))
    checkpoint = pipeline.begin().checkpoint
    first = pipeline.ledger.start_attempt(checkpoint.id).attempt
    monkeypatch.setenv(FAULTS, "increment.before_pre_commit=raise")
    with pytest.raises(InjectedFault):
        attempt(spark, pipeline, checkpoint.id, first)  # staging written, never pre-committed
    assert staged(pipeline, checkpoint.id)["events"]
    monkeypatch.delenv(FAULTS)

    second = pipeline.ledger.start_attempt(checkpoint.id).attempt
    attempt(spark, pipeline, checkpoint.id, second)
    found = staged(pipeline, checkpoint.id)
    assert {row[-1] for rows in found.values() for row in rows} == {second}
    assert {k: v for k, v in found.items() if k != "dead_letters"} == expected_staging(
        pipeline, in_ranges(pipeline, checkpoint), second)
    pipeline.ledger.commit(checkpoint.id)
    pipeline.assert_exact()


def test_a_stale_token_cannot_pre_commit_or_write(spark, pipeline):
    pipeline.produce(workload(0))
    checkpoint = pipeline.begin().checkpoint
    stale = pipeline.ledger.start_attempt(checkpoint.id).attempt
    pipeline.ledger.start_attempt(checkpoint.id)
    with pytest.raises(Fenced, match=f"attempt {stale} of checkpoint {checkpoint.id} is fenced"):
        attempt(spark, pipeline, checkpoint.id, stale)
    assert not any(staged(pipeline, checkpoint.id).values())


def test_the_fail_policy_fails_the_attempt_naming_the_bad_records(spark, ledger_db, kafka_servers, topic):
    pipeline = Pipeline(ledger_db, kafka_servers, topic, on_bad_record="fail")
    pipeline.produce([(True, [(2, None, b"{not json")])])
    checkpoint = pipeline.begin().checkpoint
    token = pipeline.ledger.start_attempt(checkpoint.id).attempt
    offset = pipeline.produced[0].offset
    with pytest.raises(BadRecords, match=rf"{topic}\[2\]@{offset}: value is not valid JSON"):
        attempt(spark, pipeline, checkpoint.id, token)
    assert pipeline.ledger.checkpoint(checkpoint.id).state == "running"  # the DAG's failure handler aborts it


def spark_submit(pipeline: Pipeline, checkpoint_id: int, token: int, *options: str,
                 **env: str) -> tuple[subprocess.CompletedProcess, str]:
    """Runs the job as Airflow would, its connections in a settings file, with spark-submit's
    `options` and `env` added to the environment; the process and its report. Spark copies
    the Python driver's stdout and stderr to its own stdout."""
    env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}  # the test transform's module
    with JobSettings(job_db_url(), KafkaClient.at(pipeline.servers)).written() as settings, \
            private_file("report-") as report, private_file("token-") as secret:
        secret.write_text(pipeline.ledger.attempt_token(checkpoint_id, token))
        done = subprocess.run(["spark-submit", *options, str(launcher()), "--pipeline", pipeline.config.name,
                               "--checkpoint-id", str(checkpoint_id), "--attempt", str(token), "--token", str(secret),
                               "--settings", str(settings), "--report", str(report)],
                              env=env, capture_output=True, text=True, timeout=600)
        return done, report.read_text()


@pytest.mark.heavy  # CI: the job fenced mid-write below exits 3 through spark-submit, and every DAG test submits
def test_spark_submit_reports_what_an_attempt_staged_and_a_fenced_one_exits_3(pipeline):
    pipeline.produce(workload(0))
    checkpoint = pipeline.begin().checkpoint
    stale = pipeline.ledger.start_attempt(checkpoint.id).attempt
    token = pipeline.ledger.start_attempt(checkpoint.id).attempt

    fenced, said = spark_submit(pipeline, checkpoint.id, stale)
    assert fenced.returncode == 3 and f"fenced: attempt {stale} of checkpoint {checkpoint.id}" in fenced.stdout
    assert said == ""
    done, said = spark_submit(pipeline, checkpoint.id, token)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(said)
    assert report["records"] == 16 and report["rows"]["events"] == 14
    assert pipeline.ledger.checkpoint(checkpoint.id).state is State.RUNNING  # the job wrote no ledger row
    pipeline.ledger.pre_commit(checkpoint.id, token, report["rows"], report["records"])
    assert pipeline.ledger.commit(checkpoint.id) is Outcome.COMMITTED
    pipeline.assert_exact()



def test_a_job_fenced_mid_write_exits_3_for_the_ledger_refuses_its_writes(pipeline):
    """A zombie: its attempt is fenced while it writes (a new attempt started, which also
    deletes its rows), each write's first task holding once its COPY committed (the writer's
    fault point); the settlements after the fence are refused, and the job says it is fenced."""
    pipeline.produce(workload(0))
    checkpoint = pipeline.begin().checkpoint
    zombie = pipeline.ledger.start_attempt(checkpoint.id).attempt
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(spark_submit, pipeline, checkpoint.id, zombie, **{FAULTS: "copy.after_task_commit=sleep:8"})
        deadline = time.monotonic() + 300
        while not staged(pipeline, checkpoint.id)["events"] and not job.done() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert staged(pipeline, checkpoint.id)["events"], "the job did not write its first sink"
        pipeline.ledger.start_attempt(checkpoint.id)
        done, said = job.result()
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"fenced: attempt {zombie} of checkpoint {checkpoint.id}" in done.stdout and said == ""
    # what it wrote after the fence carries its own number, which no pre-commit counts
    assert {row[-1] for rows in staged(pipeline, checkpoint.id).values() for row in rows} <= {zombie}


def staged_once(pipeline: Pipeline, *options: str, **env: str) -> str:
    """Runs an attempt by spark-submit with `options` and `env`, which switch the writer's
    fault point copy.after_task_commit on (each write's first task, in its first attempt,
    once its COPY committed), then checks that pre-commit finds each row once, that staging
    is the oracle's and the commit exact; the job's output."""
    pipeline.produce(workload(0))
    checkpoint = pipeline.begin().checkpoint
    token = pipeline.ledger.start_attempt(checkpoint.id).attempt
    done, said = spark_submit(pipeline, checkpoint.id, token, *options, **env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    report = json.loads(said)
    assert report["records"] == 16 and report["rows"]["events"] == 14
    pipeline.ledger.pre_commit(checkpoint.id, token, report["rows"], report["records"])  # counts the tables
    assert {k: v for k, v in staged(pipeline, checkpoint.id).items() if k != "dead_letters"} == expected_staging(
        pipeline, in_ranges(pipeline, checkpoint), token)
    assert pipeline.ledger.commit(checkpoint.id) is Outcome.COMMITTED
    pipeline.assert_exact()
    return output


def test_a_task_run_again_after_its_copy_committed_stages_its_rows_once(pipeline):
    """Each staging write's first task commits its COPY, then fails in its first attempt (as
    when an executor is lost before the driver hears of its task) and runs again: the first
    attempt's rows are in the table, and the write keeps only the rows of the task attempts
    Spark committed, so pre-commit finds each row once and the commit is exact."""
    output = staged_once(pipeline, "--master", "local[2,2]", **{FAULTS: "copy.after_task_commit=raise"})
    # a write each: the dead letters' and the one pass's (every sink's table, exactly_once.spark.one_pass)
    assert output.count("fault injected at copy.after_task_commit: raise") == 2


@pytest.mark.variant
def test_an_executor_killed_after_its_copy_committed_stages_its_rows_once_on_a_standalone_cluster(pipeline):
    """The same with the executor's JVM killed right after the task's COPY committed: Spark
    loses the executor and runs the task again on a new one."""
    started = spark_cluster.start("standalone")
    try:
        output = staged_once(pipeline, "--master", spark_cluster.master_url(),
                             "--conf", f"spark.executorEnv.{FAULTS}=copy.after_task_commit=exit")
    finally:
        spark_cluster.stop_named(started)
    # The tables are written at once: an executor's exit may take other writes' tasks with it,
    # which run again (their first attempts gone, the point does not fire for them).
    assert output.count("ExecutorLostFailure") >= 1, output[-6000:]


@pytest.mark.variant
def test_a_speculative_copy_of_a_task_that_committed_stages_nothing_on_a_standalone_cluster(pipeline):
    """Speculation on: each write's first task holds after its COPY committed, and Spark
    starts a copy of it on the other worker (when that one is free), which Spark refuses
    the commit: its COPY is rolled back."""
    started = spark_cluster.start("standalone")
    try:
        output = staged_once(pipeline, "--master", spark_cluster.master_url(), "--conf", "spark.log.level=INFO",
                             "--conf", "spark.speculation=true", "--conf", "spark.speculation.multiplier=1",
                             "--conf", "spark.speculation.quantile=0.1",
                             "--conf", f"spark.executorEnv.{FAULTS}=copy.after_task_commit=sleep:8")
    finally:
        spark_cluster.stop_named(started)
    assert "Commit denied for partition 0" in output, output[-6000:]  # a copy ran, on the other worker
