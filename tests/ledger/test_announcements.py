"""Which committed checkpoints an Airflow task announces (exactly_once.ledger.announcements;
the asset events, exactly_once.orchestration.assets), on real Kafka and PostgreSQL through the
run path: the first task to claim a committed checkpoint announces it, with its rows per sink
as the tables hold them, and a retry of that task (its try generation) announces it again; a
cleared task or another run's finds it claimed; whoever committed it (its commit task, the
next run's recovery); never an empty checkpoint; a reprocessing as one, with the rows it took
back. (With a real scheduler: tests/dags/test_assets.py.)
"""

from __future__ import annotations

from exactly_once.config import load_config
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.announcements import claim
from exactly_once.ledger.checkpoints import Outcome, State
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.versions import config_version
from exactly_once.orchestration import assets, tasks
from tests.ledger.harness import Pipeline, workload
from tests.ledger.test_reprocess import query, reprocess


def begin(pipeline: Pipeline, run_id: str):
    with KafkaOffsets(KafkaClient.at(pipeline.servers)) as kafka:
        return tasks.begin_checkpoint(pipeline.ledger, kafka, run_id, None, None)


def events_in(pipeline: Pipeline, checkpoint_id: int) -> int:
    """The append sink's rows of the checkpoint's ranges."""
    [(rows,)] = query(pipeline, f"SELECT count(*) FROM {pipeline.config.sink('events').table} e "
                                "JOIN exactly_once.committed_ranges c ON c.topic = e.kafka_topic "
                                "AND c.partition = e.kafka_partition AND e.kafka_offset >= c.from_offset "
                                "AND e.kafka_offset < c.to_offset WHERE c.checkpoint_id = %s", checkpoint_id)
    return rows


def test_the_first_task_to_claim_a_committed_checkpoint_announces_it_and_its_retries_again(ledger_db,
                                                                                         kafka_servers, topic):
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    pipeline.produce(workload(0))
    checkpoint_id = begin(pipeline, "run1").checkpoint.id
    tasks.run_increment(pipeline.ledger, checkpoint_id, pipeline.driver.execute)
    assert claim(pipeline.ledger, "run1#0#commit") == []  # pre-committed: nothing to announce yet
    assert tasks.commit_checkpoint(pipeline.ledger, checkpoint_id, 1) is Outcome.COMMITTED

    [announced] = claim(pipeline.ledger, "run1#0#commit")
    tables = pipeline.actual()
    assert (announced.checkpoint_id, announced.dag_run_id, announced.replays) == (checkpoint_id, "run1", None)
    assert {sink: announced.rows[sink] for sink in ("events", "latest", "totals")} == {
        sink: len(tables[sink]) for sink in ("events", "latest", "totals")}
    assert {(r.topic, r.partition, r.start, r.end) for r in announced.ranges if r.size} == set(query(
        pipeline, "SELECT topic, partition, from_offset, to_offset FROM exactly_once.committed_ranges "
                  "WHERE checkpoint_id = %s", checkpoint_id))
    assert announced.config_version == config_version(pipeline.config)

    # The task's retry (its try failed after claiming): the same generation, which announces it again.
    assert claim(pipeline.ledger, "run1#0#commit") == [announced]
    # The task cleared (a new clear number), the run's other task, another run: claimed already.
    for other in ("run1#1#commit", "run1#0#begin_checkpoint", "run9#0#commit"):
        assert claim(pipeline.ledger, other) == []

    # A checkpoint whose commit task never ran: the next run's recovery commits it, and its begin announces it.
    pipeline.produce(workload(1000))
    orphan = begin(pipeline, "run2").checkpoint.id
    tasks.run_increment(pipeline.ledger, orphan, pipeline.driver.execute)
    assert claim(pipeline.ledger, "run2#0#commit") == []  # pre-committed only
    third = begin(pipeline, "run3")
    assert pipeline.ledger.checkpoint(orphan).state is State.COMMITTED
    assert [(c.checkpoint_id, c.dag_run_id) for c in claim(pipeline.ledger, "run3#0#begin_checkpoint")] == [
        (orphan, "run2")]
    # run3 found nothing new: its checkpoint is committed empty, and nobody announces it.
    assert third.checkpoint.is_empty and third.checkpoint.state is State.COMMITTED
    assert claim(pipeline.ledger, "run3#0#commit") == []
    pipeline.assert_exact()


def test_a_reprocessing_is_announced_as_one_with_the_rows_it_took_back_and_put_in(ledger_db, kafka_servers, topic):
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    pipeline.produce(workload(0))
    replayed = pipeline.run_once()
    claim(pipeline.ledger, "run1#0#commit")
    fixed = Ledger(load_config({**pipeline.config.model_dump(), "transform": "tests.spark.transforms:measures_v2"}),
                   pipeline.ledger.connect)
    before = events_in(pipeline, replayed)
    reprocessing = reprocess(pipeline, fixed, replayed, "run1")

    [announced] = claim(fixed, "run1#1#commit")
    [(replaced,)] = query(pipeline, "SELECT replaced FROM exactly_once.checkpoints WHERE id = %s", reprocessing)
    assert (announced.checkpoint_id, announced.replays) == (reprocessing, replayed)
    assert (announced.taken_back["events"], announced.rows["events"]) == (before, events_in(pipeline, replayed))
    assert before != announced.rows["events"]  # the new transform drops records
    assert {sink: (announced.taken_back[sink], announced.rows[sink]) for sink in ("latest", "totals")} == {
        sink: (replaced[sink]["old"], replaced[sink]["new"]) for sink in ("latest", "totals")}

    events = assets.committed_events(fixed.config, [announced], "db.example", 5432, "pipeline")
    schema = fixed.config.name
    assert {e.asset.uri for e in events} == {f"postgres://db.example:5432/pipeline/{schema}/{table}"
                                             for table in ("events", "latest", "totals")}
    assert {e.asset.name for e in events} == {f"exactly_once.{schema}.{sink}" for sink in ("events", "latest", "totals")}
    for event in events:
        assert event.extra["reprocessing"] == {"replays": replayed, "rows_taken_back": replaced[event.sink]["old"]}
        assert event.extra["rows"] == replaced[event.sink]["new"] and event.extra["checkpoint_id"] == reprocessing
