"""What a Kafka error means for a kafka sink's publishing: a refusal of one record (the
same record is refused again, whatever the retry: `ROW_REFUSALS`), a refusal of the sink's
topic or of the publisher (`SINK_REFUSALS`: no row is at fault), another publisher's fence
(`FENCED`: not a refusal), or a blip a retry may pass. A record Kafka refuses is isolated by
halving its batch (publisher.py) down to the row Kafka refuses alone, `OutputRefused`.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from exactly_once.config import Sink
from exactly_once.errors import Permanent, is_retryable
from exactly_once.ledger.run_refusals import OutputRow

# Kafka's refusals of a record itself: the same record is refused again, whatever the retry.
ROW_REFUSALS = frozenset(getattr(KafkaError, name) for name in (
    "MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE", "INVALID_RECORD", "INVALID_MSG") if hasattr(KafkaError, name))
# Refusals of the sink's topic or of the publisher: no row is at fault, every one would be refused.
SINK_REFUSALS = frozenset(getattr(KafkaError, name) for name in (
    "TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    "UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC", "_UNKNOWN_PARTITION", "POLICY_VIOLATION") if hasattr(KafkaError, name))
# Another publisher of the sink took over (init_transactions fenced this one): not a refusal.
FENCED = frozenset(getattr(KafkaError, name) for name in ("_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH")
                   if hasattr(KafkaError, name))


class OutputRefused(Permanent):
    """Kafka refuses an output record of a kafka sink (`row`), or the sink's topic (`row` None),
    for a reason no retry fixes: the sink's publishing stops there, loudly, until a person acts."""

    def __init__(self, pipeline: str, sink: str, topic: str, error: KafkaError, row: OutputRow | None):
        self.pipeline, self.sink, self.topic, self.error, self.row = pipeline, sink, topic, error, row
        what = f"the outbox row {row}" if row is not None else "the sink's records"
        way_out = (f"raise the topic's limit (or fix the cause) and publish again, or move the row to the outbox's "
                   f"dead letters: `python -m exactly_once.operate.stalls dead-letter-output {pipeline} {sink} "
                   f"--reason WHY`" if row is not None else
                   "fix the topic or the publisher's rights, then publish again (a run's begin or publish task, "
                   f"or `python -m exactly_once publish {pipeline}`)")
        super().__init__(f"pipeline {pipeline} sink {sink}: Kafka refuses {what} for topic {topic}: "
                         f"{error.name()} ({error.str()}); the sink's publishing stops there (what comes before it "
                         f"is published); {way_out}")


class Refused(Exception):
    """A transaction Kafka refused for a refusal of ROW_REFUSALS or SINK_REFUSALS (internal to
    publishing: the publisher halves the transaction's rows, or raises OutputRefused)."""

    def __init__(self, error: KafkaError, first: int):
        super().__init__(error)
        self.error, self.first = error, first  # the first row refused, by its index in the transaction


def kafka_error(error: BaseException) -> KafkaError | None:
    return error.args[0] if isinstance(error, KafkaException) and error.args and \
        isinstance(error.args[0], KafkaError) else None


def fenced(error: BaseException) -> bool:
    """Another publisher of the sink fenced this one: it goes on publishing."""
    found = kafka_error(error)
    return found is not None and (found.code() in FENCED or found.fatal() and "fenced" in found.str().lower())


def may_pass(failure: BaseException) -> bool:
    """Whether a retry of a publish that failed so may pass (a broker blip, a timeout), as the
    refusal of the sink's publishing records it; a Kafka error says so itself."""
    found = kafka_error(failure)
    retryable = is_retryable(failure) if found is None else not found.fatal() or found.retriable()
    return retryable and not isinstance(failure, Permanent)


def first_refusal(refusals: list[tuple[int, KafkaError]]) -> tuple[KafkaError, int]:
    """Of a transaction's refusals, (the row's index, Kafka's refusal), the first row's."""
    index, error = min(refusals, key=lambda found: found[0])
    return error, index


def blamed(pipeline: str, sink: Sink, refused: Refused, rows: list[tuple]) -> OutputRefused | None:
    """The refusal of a transaction of `rows` that stops the sink's publishing: of its topic
    (no row blamed), or of its one row; None while the rows are to be halved."""
    if refused.error.code() in SINK_REFUSALS:
        return OutputRefused(pipeline, sink.name, sink.topic, refused.error, None)
    if len(rows) == 1:
        checkpoint_id, position, epoch = rows[0][:3]
        return OutputRefused(pipeline, sink.name, sink.topic, refused.error,
                             OutputRow(checkpoint_id, position, epoch, sink.topic))
    return None


def halves(refused: Refused, rows: list[tuple]) -> tuple[list[tuple], list[tuple]]:
    """The rows before the first Kafka refused, then the rest (halves when it refused the first),
    each to be published in a transaction of its own."""
    split = refused.first or len(rows) // 2
    return rows[:split], rows[split:]
