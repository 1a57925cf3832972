"""The work of a pipeline run's three tasks, free of Airflow: the one run path.

    begin_checkpoint ──▶ run_increment (one attempt of the Spark job) ──▶ commit_checkpoint
                                                          ──▶ publish_outbox (kafka sinks)

`exactly_once.orchestration.checkpoint_tasks` wraps each in an Airflow task, and `exactly_once.orchestration.outcomes`
says what follows each (skip, retry, fail). The tests drive the same functions: the
fault matrix runs each try as a process of its own, as an Airflow worker does, so a
fault can kill exactly one of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import closing
from datetime import datetime

import psycopg2

from exactly_once import faults
from exactly_once.config import PipelineConfig
from exactly_once.errors import AttemptFailed, JobFailure, Permanent, PipelineError, error_text, is_retryable
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger import replays, retention, run_refusals
from exactly_once.ledger.checkpoints import Begun, Outcome, State, TaskTry
from exactly_once.ledger.holders import holders
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.leases import heartbeat
from exactly_once.ledger.migrate import migrate_through
from exactly_once.ledger.planning import Reach, describe_ranges
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.refusals import Fenced, NotRunnable, Stalled
from exactly_once.ledger.versions import config_version
from exactly_once.operate import preflight, privileges
from exactly_once.operate.privileges import ConnectAs
from exactly_once.publishing.publisher import Published, Publisher
from exactly_once.publishing.refusals import fenced
from exactly_once.spark.report import AttemptReport
from exactly_once.spark.settings import private_file

log = logging.getLogger(__name__)

# Records a kafka sink's outbox may hold unpublished while its publishing fails and runs still
# take new records (issue 60, item 3); beyond it a begin refuses to plan (OutboxFull).
OUTBOX_BOUND = 1_000_000


class OutboxFull(Permanent):
    """A kafka sink's publishing fails and its outbox holds more than the bound: no new
    checkpoint is planned until it is published."""


def begin_checkpoint(ledger: Ledger, kafka: KafkaOffsets, run_id: str, start: datetime | None,
                     end: datetime | None, reach: Reach = Reach.BACKLOG, reprocess: bool = False,
                     connect_as: ConnectAs | None = None, publish_with: KafkaClient | None = None,
                     outbox_bound: int = OUTBOX_BOUND) -> Begun:
    """Migrates the ledger; with `publish_with` (the DAG's begin), publishes what earlier runs
    committed and Kafka does not have yet, before anything is planned (`publish_first`); refuses
    to go on while another checkpoint is stalled (promise 9: that comes first), runs the
    preflight (with the rights of each pipeline database connection `connect_as` opens),
    recovers, and begins (or finds again) the run's checkpoint; says in the log what it
    planned or, for an empty interval, who holds its records. With `reprocess`, a run whose
    checkpoint is committed begins a reprocessing of it (promise 10) instead of changing
    nothing. A failure before the checkpoint is begun (but a stall, loud already) is recorded
    as a refusal of the pipeline's runs (exactly_once.ledger.run_refusals: status, the view and
    the metrics show it); a begin that succeeds clears it."""
    migrate_through(ledger.connect)
    with run_refusals.recording(ledger.connect, ledger.config.name, run_refusals.BEGIN, unless=(Stalled,)):
        if publish_with is not None:
            publish_first(ledger, publish_with, outbox_bound)
        with ledger.transactions.kept():  # a plan's dozen transactions on one connection
            return _begin_checkpoint(ledger, kafka, run_id, start, end, reach, reprocess, connect_as)


def publish_first(ledger: Ledger, client: KafkaClient, bound: int = OUTBOX_BOUND) -> None:
    """What the pipeline's kafka sinks committed, published before a run plans: a publish that
    fails orphans no checkpoint. Its failure (recorded by the publisher as a refusal of the
    sink's publishing: loud) does not stop the run while every sink's outbox holds at most
    `bound` records; beyond it, `OutboxFull`. A publisher fenced by another one publishing
    the sink at the same time (a parallel run) is no failure."""
    try:
        publish_outbox(ledger, client)
    except Exception as failure:
        if fenced(failure):
            log.info("pipeline %s: another publisher of its kafka sinks is publishing (%s)", ledger.config.name,
                     failure)
            return
        over = run_refusals.outboxes_over(ledger.connect, ledger.config.name, bound)
        if over:
            raise OutboxFull(f"pipeline {ledger.config.name}: no new checkpoint while the outbox of kafka sink(s) "
                             + ", ".join(f"{sink} ({records} records)" for sink, records in over)
                             + f" holds more than {bound} records not published; publishing fails: {failure}") \
                from failure
        log.warning("pipeline %s: publishing failed, the run goes on (each sink's outbox holds at most %s "
                    "records): %s", ledger.config.name, bound, failure)


def _begin_checkpoint(ledger: Ledger, kafka: KafkaOffsets, run_id: str, start: datetime | None,
                      end: datetime | None, reach: Reach, reprocess: bool, connect_as: ConnectAs | None) -> Begun:
    ledger.refuse_if_stalled(run_id)
    if connect_as is not None:
        privileges.require(ledger.config, connect_as)
    imported = preflight.require(ledger.config, kafka, ledger.transactions.transaction)
    log.info("preflight: pipeline %r is ready%s", ledger.config.name,
             " (its transform imports: checked once for this configuration version)" if imported else "")
    begun = ledger.begin(run_id, start, end, kafka, reach)
    log.info("recovery: %s", begun.recovery)
    if reprocess and begun.checkpoint.state is State.COMMITTED and not begun.checkpoint.is_empty:
        return reprocess_checkpoint(ledger, begun.checkpoint.id, run_id)
    checkpoint = begun.checkpoint
    ranges = describe_ranges(checkpoint.ranges)
    if checkpoint.is_empty:
        log.info("checkpoint %s: nothing to read (%s); no Spark job", checkpoint.id, ranges)
        if start is not None and end is not None and start < end:
            log.info("%s", interval_holders(ledger, kafka, start, end))
    elif checkpoint.state in (State.PRECOMMITTED, State.COMMITTED):
        log.info("checkpoint %s of this run is already %s (%s)", checkpoint.id, checkpoint.state.value, ranges)
    else:
        log.info("checkpoint %s (%s): %s; %s", checkpoint.id, "new" if begun.new else "begun before", ranges,
                 REACHES[reach])
    return begun


def reprocess_checkpoint(ledger: Ledger, checkpoint_id: int, requested_by: str) -> Begun:
    """Begins (or finds open) a reprocessing of a committed checkpoint, with the ledger's
    configuration; says which configuration produced its current rows and which will replace them."""
    begun = replays.reprocess(ledger, checkpoint_id, requested_by)
    reprocessing = begun.checkpoint
    holder, version = replays.latest_processing(ledger, reprocessing.replays)
    log.info("checkpoint %s (%s) reprocesses committed checkpoint %s (%s) with configuration version %s; its "
             "rows are checkpoint %s's, of configuration version %s, and its commit replaces them in every sink",
             reprocessing.id, "new" if begun.new else f"begun before, {reprocessing.state.value}",
             reprocessing.replays, describe_ranges(reprocessing.ranges), config_version(ledger.config), holder,
             version or "unrecorded")
    return begun


REACHES = {Reach.INTERVAL: "a backfill run takes the unclaimed records of its interval",
           Reach.BACKLOG: "this run takes the unclaimed records of its interval and those before it"}


def interval_holders(ledger: Ledger, kafka: KafkaOffsets, start: datetime, end: datetime) -> str:
    """Which checkpoints took the records of an interval this run finds empty (a backfill
    over intervals already processed, or a run late behind a later one)."""
    config = ledger.config
    with closing(ledger.connect()) as conn:
        held = holders(conn, kafka, config.name, config.source.topics, start, end)
    interval = f"{start.isoformat()} → {end.isoformat()}"
    if not held:
        return f"no records in the interval {interval}"
    return (f"the records of the interval {interval} are already held by checkpoint(s) "
            + ", ".join(f"{h.checkpoint_id} ({h.state}, DAG run {h.dag_run_id})" for h in held))


def job_arguments(config: PipelineConfig, checkpoint_id: int, attempt: int) -> list[str]:
    """The arguments of the Spark job of one attempt (`exactly_once.spark.job`)."""
    return ["--pipeline", config.name, "--checkpoint-id", str(checkpoint_id), "--attempt", str(attempt)]


def run_increment(ledger: Ledger, checkpoint_id: int, execute: Callable[[list[str]], AttemptReport],
                  task: TaskTry | None = None) -> int | None:
    """Starts a new attempt of the checkpoint (fencing off any older one), runs the Spark
    job with `execute(job arguments)` (`exactly_once.spark.runners`, or a session in this
    process), which returns what the job staged or raises if it fails, and pre-commits what
    it staged: the job's role may not write the ledger. The job gets the attempt's token in
    a private file (`--token`), for the ledger's staging functions. A failed attempt is
    aborted, so a retry runs the same frozen ranges again; the error raised says whether a
    retry may help (`attempt_failure`). Returns the attempt, or None when the checkpoint is already
    pre-committed or committed (a cleared or retried task). `task`: the task's try; a
    stalled checkpoint runs again only in a try an operator cleared (`Checkpoint.resumed_by`)."""
    try:
        attempt = ledger.start_attempt(checkpoint_id, task).attempt
    except NotRunnable as refused:
        if refused.done:
            log.info("nothing to run: %s", refused)
            return None
        raise
    log.info("checkpoint %s attempt %s: running the increment job", checkpoint_id, attempt)
    try:
        # The lease lasts while this task lives; the attempt's token travels in a private file.
        with heartbeat(ledger, checkpoint_id, attempt), private_file("exactly_once-token-") as token:
            token.write_text(ledger.attempt_token(checkpoint_id, attempt))
            started = time.monotonic()
            report = execute([*job_arguments(ledger.config, checkpoint_id, attempt), "--token", str(token)])
            ledger.pre_commit(checkpoint_id, attempt, report.rows, report.records, time.monotonic() - started)
        log.info("checkpoint %s attempt %s pre-committed: %s records read, rows per sink %s, seconds per phase %s",
                 checkpoint_id, attempt, report.records, report.rows, report.seconds)
    except Exception as failure:
        verdict = attempt_failure(ledger, checkpoint_id, attempt, failure)
        if verdict is not None:
            raise verdict from failure
        log.warning("%r after attempt %s pre-committed; the pre-commit stands", failure, attempt)
    except BaseException as interrupted:  # the task is being stopped: leave nothing half-run behind
        attempt_failure(ledger, checkpoint_id, attempt, interrupted)
        raise
    faults.point("increment_task.after_job")
    return attempt


def attempt_failure(ledger: Ledger, checkpoint_id: int, attempt: int, failure: BaseException
                    ) -> PipelineError | None:
    """What a failed attempt means for its task, recorded in the ledger first (the job's
    own `JobFailure`, a refused pre-commit, or a job that ended without a word): None when
    the attempt pre-committed all the same (its work is done); `Fenced` when a newer
    attempt owns the checkpoint or recovery aborted it (the job exits 3 if it saw it; a retry would
    only fence the owner in turn, or find the ranges planned again elsewhere); `Stalled`
    when its failures stalled it (only an operator goes on); else `AttemptFailed`,
    retryable unless the failure says no retry can fix it."""
    ledger.abort_attempt(checkpoint_id, attempt, *failure_record(failure))
    checkpoint = ledger.checkpoint(checkpoint_id)
    if checkpoint.state in (State.PRECOMMITTED, State.COMMITTED) and checkpoint.precommitted_attempt == attempt:
        return None
    if checkpoint.attempt != attempt or checkpoint.state is State.ABORTED:
        return Fenced(f"attempt {attempt} of checkpoint {checkpoint_id} is fenced: the checkpoint is "
                      f"{checkpoint.state.value} and its current attempt is {checkpoint.attempt}")
    if checkpoint.state is State.STALLED:
        return Stalled(ledger.config.name, checkpoint)
    recorded = ledger.attempt(checkpoint_id, attempt)
    log.info("attempt %s of checkpoint %s aborted (%s); a retry runs the same ranges", attempt, checkpoint_id,
             recorded.reason)
    return AttemptFailed(f"checkpoint {checkpoint_id} attempt {attempt} failed: {recorded.reason}",
                         retryable=recorded.retryable is not False)


def failure_record(failure: BaseException) -> tuple[str, bool]:
    """The reason and retryability an attempt's failure is recorded with: the job's own
    words, the ledger's refusal of its pre-commit, or what ran the job said."""
    if isinstance(failure, JobFailure):
        return failure.reason, failure.retryable
    if isinstance(failure, PipelineError):
        return f"{type(failure).__name__}: {failure}", is_retryable(failure)
    return f"Spark job failed: {failure}", True


def publish_outbox(ledger: Ledger, client: KafkaClient, **options) -> list[Published]:
    """What the pipeline's kafka sinks committed and Kafka does not have yet, published
    (exactly_once.publishing; `options` are the Publisher's); nothing for a pipeline without kafka sinks."""
    published = Publisher(ledger.config, ledger.connect, client, **options).publish()
    for sink in published:
        log.info("pipeline %s: %s", ledger.config.name, sink)
    return published


def commit_checkpoint(ledger: Ledger, checkpoint_id: int, try_number: int, try_started: datetime | None = None
                      ) -> Outcome:
    """Phase two (idempotent), on a migrated ledger: a checkpoint pre-committed before an
    upgrade is committed by a commit task that runs before any begin. `try_started`: when
    the task's try began; a checkpoint stalled at commit is committed only by a try an
    operator cleared (`Checkpoint.resumed_by`). Fault points name the task's try, e.g.
    fail only try 1."""
    faults.point(f"commit_task.try{try_number}")
    migrate_through(ledger.connect)
    outcome = ledger.commit(checkpoint_id, None if try_started is None else TaskTry(try_number, try_started))
    log.info("checkpoint %s: %s", checkpoint_id, outcome.value)
    faults.point(f"commit_task.try{try_number}.after_commit")  # committed; the task has not reported success
    prune_a_step(ledger)
    return outcome


def prune_a_step(ledger: Ledger) -> None:
    """One step of the pipeline's retention (exactly_once.ledger.retention), after its commit.
    The checkpoint is committed whatever happens here, so a failure is logged, not raised:
    the next run's step does what this one did not."""
    try:
        pruned = retention.prune(ledger)
    except (psycopg2.Error, ValueError) as error:  # ValueError: a sink's final table lacks its keys
        log.warning("pipeline %s: retention's step failed and is left to the next run: %s",
                    ledger.config.name, error_text(str(error)))
        return
    if not pruned.idle:
        log.info("pipeline %s: retention %s", ledger.config.name, pruned)
