"""The run path's verdicts (exactly_once.orchestration.tasks + exactly_once.orchestration.outcomes), against real
Kafka, PostgreSQL and, for the job's own failure, Spark: what the DAG does after a
failed attempt — retry it, or fail without retry — is read from the ledger, whatever
ran the job."""

from __future__ import annotations

from datetime import timedelta

import pytest
from airflow.sdk.exceptions import AirflowFailException

from exactly_once.errors import AttemptFailed, ConfigError
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.checkpoints import AttemptState, Outcome, State, TaskTry
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.lost_offsets import DataLossError
from exactly_once.ledger.refusals import Fenced, NotPreCommitted, PromotionRefused, StagedDataChanged, Stalled
from exactly_once.ledger.registration import SinkTableError
from exactly_once.orchestration import tasks
from exactly_once.orchestration.outcomes import TaskOutcome, after_error
from exactly_once.spark.isolation import NotIsolated
from exactly_once.spark.report import AttemptReport
from tests.job_role import in_process
from tests.ledger.harness import Pipeline, workload


@pytest.fixture
def pipeline(ledger_db, kafka_servers, topic) -> Pipeline:
    return Pipeline(ledger_db, kafka_servers, topic)


def begun(pipeline: Pipeline) -> int:
    pipeline.produce(workload(0))
    return pipeline.begin().checkpoint.id


def test_a_fenced_attempt_fails_its_task_without_retry_and_leaves_the_newer_attempt_alone(pipeline):
    checkpoint_id = begun(pipeline)

    def overtaken(arguments: list[str]) -> None:
        pipeline.ledger.start_attempt(checkpoint_id)  # a newer try of the task took the checkpoint over
        raise RuntimeError("spark-submit exited with status 3")

    fenced = (f"attempt 1 of checkpoint {checkpoint_id} is fenced: "
              "the checkpoint is running and its current attempt is 2")
    with pytest.raises(Fenced, match=fenced) as e:
        tasks.run_increment(pipeline.ledger, checkpoint_id, overtaken)
    assert after_error(e.value) is TaskOutcome.FAIL
    checkpoint = pipeline.ledger.checkpoint(checkpoint_id)
    assert (checkpoint.state, checkpoint.attempt) == (State.RUNNING, 2)
    assert pipeline.ledger.attempt(checkpoint_id, 2).state is AttemptState.RUNNING


def test_an_attempt_whose_checkpoint_recovery_aborted_fails_its_task_without_retry(pipeline):
    checkpoint_id = begun(pipeline)

    def taken_over(arguments: list[str]) -> None:
        pipeline.ledger.abort(checkpoint_id, "lease expired")  # the next run's recovery took it over
        raise RuntimeError("spark-submit exited with status 3")

    with pytest.raises(Fenced, match="the checkpoint is aborted and its current attempt is 1") as e:
        tasks.run_increment(pipeline.ledger, checkpoint_id, taken_over)
    assert after_error(e.value) is TaskOutcome.FAIL


def test_a_job_that_staged_its_rows_but_ended_without_its_report_is_aborted_and_its_rows_never_count(pipeline):
    checkpoint_id = begun(pipeline)

    def staged_then_lost(arguments: list[str]) -> AttemptReport:
        pipeline.driver.execute(arguments)
        raise RuntimeError("the driver died before it wrote its report")

    with pytest.raises(AttemptFailed, match="Spark job failed: the driver died"):
        tasks.run_increment(pipeline.ledger, checkpoint_id, staged_then_lost)
    assert pipeline.ledger.checkpoint(checkpoint_id).state is State.PLANNED
    assert tasks.run_increment(pipeline.ledger, checkpoint_id, pipeline.driver.execute) == 2
    assert tasks.commit_checkpoint(pipeline.ledger, checkpoint_id, 1).value == "committed now"
    pipeline.assert_exact()


def test_a_lost_job_is_aborted_and_retried_on_the_same_ranges(pipeline):
    checkpoint_id = begun(pipeline)
    ranges = pipeline.ledger.checkpoint(checkpoint_id).ranges

    def lost(arguments: list[str]) -> None:
        raise RuntimeError("executor lost")

    with pytest.raises(AttemptFailed, match="Spark job failed: executor lost") as e:
        tasks.run_increment(pipeline.ledger, checkpoint_id, lost)
    assert after_error(e.value) is TaskOutcome.RETRY
    after = pipeline.ledger.checkpoint(checkpoint_id)
    assert (after.state, after.ranges) == (State.PLANNED, ranges)
    assert tasks.run_increment(pipeline.ledger, checkpoint_id, pipeline.driver.execute) == 2
    pipeline.ledger.commit(checkpoint_id)
    pipeline.assert_exact()


def test_a_job_that_records_a_failure_no_retry_fixes_stalls_and_fails_its_task_without_retry(spark, ledger_db,
                                                                                              kafka_servers, topic):
    pipeline = Pipeline(ledger_db, kafka_servers, topic, on_bad_record="fail")
    pipeline.produce([(True, [(2, None, b"{not json")])])
    checkpoint_id = pipeline.begin().checkpoint.id
    offset = pipeline.produced[0].offset

    with pytest.raises(Stalled, match=rf"BadRecords: .*{topic}\[2\]@{offset}: value is not valid JSON") as e:
        tasks.run_increment(pipeline.ledger, checkpoint_id, in_process(spark, pipeline.config.name, kafka_servers))
    assert after_error(e.value) is TaskOutcome.FAIL
    recorded = pipeline.ledger.attempt(checkpoint_id, 1)
    assert (recorded.state, recorded.retryable) == (AttemptState.ABORTED, False)
    assert pipeline.ledger.checkpoint(checkpoint_id).state is State.STALLED  # its ranges stay frozen


def failing(message: str):
    def execute(arguments: list[str]) -> None:
        raise RuntimeError(message)
    return execute


def test_three_failures_of_one_cause_stall_the_checkpoint_and_a_cleared_task_resumes_it(pipeline):
    checkpoint_id = begun(pipeline)
    for message in ("disk full", "executor lost in stage 3", "executor lost in stage 7"):  # 2 of one cause
        with pytest.raises(AttemptFailed) as failed:
            tasks.run_increment(pipeline.ledger, checkpoint_id, failing(message))
        assert after_error(failed.value) is TaskOutcome.RETRY
    assert pipeline.ledger.checkpoint(checkpoint_id).state is State.PLANNED

    with pytest.raises(Stalled, match=rf"checkpoint {checkpoint_id} .*last error: Spark job failed: executor lost "
                                      r"in stage 9") as stalled:
        tasks.run_increment(pipeline.ledger, checkpoint_id, failing("executor lost in stage 9"))
    assert after_error(stalled.value) is TaskOutcome.FAIL
    assert pipeline.ledger.checkpoint(checkpoint_id).state is State.STALLED
    with pytest.raises(Stalled):
        pipeline.begin("a later run")
    # the stalled run itself may be cleared from its first task
    with KafkaOffsets(KafkaClient.at(pipeline.servers)) as kafka:
        assert pipeline.ledger.begin("run1", None, None, kafka).checkpoint.id == checkpoint_id

    cleared = pipeline.ledger.now()  # a cleared task's try
    assert tasks.run_increment(pipeline.ledger, checkpoint_id, pipeline.driver.execute, TaskTry(2, cleared)) == 5
    assert pipeline.ledger.commit(checkpoint_id) is Outcome.COMMITTED
    pipeline.assert_exact()


@pytest.mark.parametrize("error, outcome", [
    (DataLossError("t", 0, 5, 9), TaskOutcome.FAIL),
    (SinkTableError("sink 'x': final table x does not exist"), TaskOutcome.FAIL),
    (StagedDataChanged("changed"), TaskOutcome.FAIL),
    (NotPreCommitted("not yet"), TaskOutcome.FAIL),
    (PromotionRefused("a final table refused staged rows at commit"), TaskOutcome.FAIL),
    (NotIsolated("no record fails on its own"), TaskOutcome.FAIL),
    (ConnectionError("database restarting"), TaskOutcome.RETRY),
])
def test_known_failures_fail_without_retry_and_unknown_ones_retry(error, outcome):
    assert after_error(error) is outcome


def test_the_airflow_tasks_fail_without_retry_exactly_where_the_outcome_says(stack_env):
    from exactly_once.orchestration.checkpoint_tasks import airflow_outcome

    with pytest.raises(AirflowFailException, match="final table x does not exist"), airflow_outcome():
        raise SinkTableError("sink 'x': final table x does not exist")
    with pytest.raises(ConnectionError), airflow_outcome():
        raise ConnectionError("database restarting")



def test_a_dag_whose_increment_tries_cannot_reach_stall_after_is_refused(stack_env, ledger_db, kafka_servers,
                                                                         topic):
    from exactly_once.orchestration.checkpoint_tasks import checkpoint_tasks

    pipeline = Pipeline(ledger_db, kafka_servers, topic, stall_after=4)
    with pytest.raises(ConfigError, match="stall_after 4 exceeds the increment task's 3 tries"):
        checkpoint_tasks(pipeline.config)


def test_a_begin_that_may_pass_on_a_retry_is_retried_and_an_increment_that_hangs_is_stopped(
        stack_env, ledger_db, kafka_servers, topic):
    from airflow.sdk import DAG

    from exactly_once.orchestration.checkpoint_tasks import checkpoint_tasks

    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    with DAG(dag_id=f"d_{pipeline.config.name}", schedule=None) as dag:
        checkpoint_tasks(pipeline.config, increment_timeout=timedelta(hours=2))
    assert dag.get_task("begin_checkpoint").retries >= 1  # a Kafka blip or a deadlock fails no run
    assert dag.get_task("increment").execution_timeout == timedelta(hours=2)
