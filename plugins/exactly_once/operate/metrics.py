"""The pipelines' metrics in Prometheus's text exposition format, for the plugin's
`/exactly-once/metrics` endpoint (exactly_once.operate.overview_app): read from the ledger
(sql/metrics.sql, and the status's lag and stalls) and from Kafka (last stable offsets, and
the timestamp of each partition's oldest record not yet committed).

Labels are pipeline, topic, partition, sink, phase, state and reason class: bounded sets,
never an offset or a record's value. The histogram counts committed checkpoints, which the
ledger keeps, so it only grows; attempts and dead letters are gauges, as attempts change
state and a reprocessing replaces dead letters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from contextlib import closing, nullcontext
from dataclasses import dataclass
from datetime import datetime

from confluent_kafka import KafkaException

from exactly_once.dead_letter_budget import BREACH
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.kafka_offsets import KafkaOffsets, KafkaRefused
from exactly_once.ledger.tables import DEAD_LETTERS
from exactly_once.operate.freshness import RecordTimes, ages
from exactly_once.operate.status import PipelineStatus, pipelines, read_status
from exactly_once.sqlfiles import named

Q = named("metrics.sql")
PHASE_BOUNDS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)  # seconds
OPEN_STATES = ("planned", "running", "precommitted", "stalled")
KAFKA_TIMEOUT = 5  # seconds: a scrape shows the ledger's figures rather than wait

FAMILIES = {  # name: (type, help)
    "exactly_once_committed_offset": ("gauge", "Where committed reading ends in the partition: the next offset no "
                                               "commit has covered."),
    "exactly_once_last_stable_offset": ("gauge", "Kafka's last stable offset of the partition (read_committed)."),
    "exactly_once_lag_records": ("gauge", "Offsets not committed yet: the last stable offset minus the committed "
                                          "offset (transaction markers take offsets too)."),
    "exactly_once_freshness_seconds": ("gauge", "Age of the partition's oldest record not committed yet, by Kafka's "
                                                "record timestamp; 0 when none is left."),
    "exactly_once_kafka_up": ("gauge", "1 if Kafka answered this scrape (offsets and freshness are shown), else 0."),
    "exactly_once_last_checkpoint_records": ("gauge", "Kafka records the last committed checkpoint read."),
    "exactly_once_last_checkpoint_rows": ("gauge", "Rows the last committed checkpoint staged for each sink."),
    "exactly_once_last_checkpoint_dead_letters": ("gauge", "Dead letters the last committed checkpoint committed."),
    "exactly_once_checkpoint_phase_seconds": ("histogram", "How long each phase of the committed checkpoints took: "
                                                           "plan, spark (the job, its start included), pre_commit, "
                                                           "commit."),
    "exactly_once_attempts": ("gauge", "Spark attempts the ledger holds, by state: committed, precommitted, "
                                       "aborted, running (an attempt changes state as it ends)."),
    "exactly_once_dead_letters": ("gauge", "Committed dead letters the ledger holds, by class of reason (a "
                                           "reprocessing replaces those of the checkpoint it replays)."),
    "exactly_once_stalled": ("gauge", "1 while a checkpoint of the pipeline is stalled (promise 9), or its runs or a "
                                      "kafka sink's publishing are refused for good (issue 60), else 0."),
    "exactly_once_dead_letter_budget_exceeded": ("gauge", "1 while a checkpoint is stalled on the dead-letter "
                                                          "budget, else 0."),
    "exactly_once_open_checkpoints": ("gauge", "Checkpoints not committed or aborted yet, by state."),
}


@dataclass(frozen=True)
class Sample:
    name: str                        # a family's, or a histogram's with _bucket, _sum or _count
    labels: tuple[tuple[str, str], ...]
    value: float


def read_samples(conn, kafka: KafkaClient | None, now: datetime, only: list[str] | None = None) -> list[Sample]:
    """The samples of the pipelines named `only` (default: every pipeline); Kafka's figures
    only when `kafka` is given and answers."""
    samples: list[Sample] = []
    names = [name for name in pipelines(conn) if only is None or name in only]
    asked = {"pipelines": only, "bounds": list(PHASE_BOUNDS)}
    with closing(conn.cursor()) as cur:
        for query, emit in ((Q["last_checkpoints"], _last_checkpoint), (Q["attempts"], _attempts),
                            (Q["dead_letters"], _dead_letters), (Q["phases"], histogram)):
            cur.execute(query, asked)
            samples += [s for row in cur.fetchall() for s in emit(*row)]
        cur.execute(Q["open_checkpoints"], asked)
        open_states = {(pipeline, state): n for pipeline, state, n in cur.fetchall()}
    samples += [Sample("exactly_once_open_checkpoints", (("pipeline", name), ("state", state)),
                       open_states.get((name, state), 0)) for name in names for state in OPEN_STATES]
    statuses, kafka_up = _statuses(conn, kafka, names, now)
    for status, fresh in statuses:
        samples += _status_samples(status, fresh)
    samples.append(Sample("exactly_once_kafka_up", (), 1 if kafka_up else 0))
    conn.rollback()  # read-only: end the transaction the reads began
    return samples


def _statuses(conn, kafka: KafkaClient | None, names: list[str], now: datetime):
    """Each pipeline's status with its lag, and each partition's freshness, while Kafka
    answers; without them once it does not."""
    found, up = [], kafka is not None
    with (KafkaOffsets(kafka, timeout=KAFKA_TIMEOUT) if up else nullcontext()) as offsets, \
            (RecordTimes(kafka, timeout=KAFKA_TIMEOUT) if up else nullcontext()) as times:
        for name in names:
            if up:
                try:
                    status = read_status(conn, offsets, name, history=1)
                    found.append((status, ages(times, status.lag, now)))
                    continue
                except (KafkaException, KafkaRefused, TimeoutError):
                    conn.rollback()
                    up = False
            found.append((read_status(conn, None, name, history=1), {}))
    return found, up


def _status_samples(status: PipelineStatus, freshness: dict[tuple[str, int], float]) -> list[Sample]:
    pipeline = (("pipeline", status.name),)
    loud = status.stalls or any(r.loud for r in status.refusals)  # a refusal with no checkpoint is a stall too
    samples = [Sample("exactly_once_stalled", pipeline, 1 if loud else 0),
               Sample("exactly_once_dead_letter_budget_exceeded", pipeline,
                      1 if any((s.last_error or "").startswith(BREACH) for s in status.stalls) else 0)]
    for p in status.lag:
        where = (*pipeline, ("topic", p.topic), ("partition", str(p.partition)))
        samples += [Sample("exactly_once_committed_offset", where, p.committed_end),
                    Sample("exactly_once_last_stable_offset", where, p.last_stable),
                    Sample("exactly_once_lag_records", where, p.lag)]
        if (p.topic, p.partition) in freshness:
            samples.append(Sample("exactly_once_freshness_seconds", where, freshness[p.topic, p.partition]))
    return samples


def _last_checkpoint(pipeline: str, records: int, staged: dict) -> Iterable[Sample]:
    yield Sample("exactly_once_last_checkpoint_records", (("pipeline", pipeline),), records)
    for sink, counted in sorted(staged.items()):
        if sink == DEAD_LETTERS:
            yield Sample("exactly_once_last_checkpoint_dead_letters", (("pipeline", pipeline),), counted["rows"])
        else:
            yield Sample("exactly_once_last_checkpoint_rows", (("pipeline", pipeline), ("sink", sink)),
                         counted["rows"])


def _attempts(pipeline: str, state: str, n: int) -> Iterable[Sample]:
    yield Sample("exactly_once_attempts", (("pipeline", pipeline), ("state", state)), n)


def _dead_letters(pipeline: str, reason_class: str, n: int) -> Iterable[Sample]:
    yield Sample("exactly_once_dead_letters", (("pipeline", pipeline), ("reason_class", reason_class)), n)


def histogram(pipeline: str, phase: str, buckets: list[int], count: int, total: float) -> Iterable[Sample]:
    name, labels = "exactly_once_checkpoint_phase_seconds", (("pipeline", pipeline), ("phase", phase))
    for bound, n in zip((*PHASE_BOUNDS, math.inf), (*buckets, count)):
        yield Sample(f"{name}_bucket", (*labels, ("le", _number(bound))), n)
    yield Sample(f"{name}_sum", labels, total)
    yield Sample(f"{name}_count", labels, count)


# -- the exposition format: pure -----------------------------------------------------


def exposition(samples: Iterable[Sample]) -> str:
    """The samples in Prometheus's text format (version 0.0.4), each family once, with its
    HELP and TYPE, in FAMILIES' order."""
    by_family: dict[str, list[Sample]] = {name: [] for name in FAMILIES}
    for sample in samples:
        family = next(f for f in (sample.name, sample.name.rsplit("_", 1)[0]) if f in FAMILIES)
        by_family[family].append(sample)
    lines = []
    for family, found in by_family.items():
        kind, help_text = FAMILIES[family]
        lines += [f"# HELP {family} {help_text}", f"# TYPE {family} {kind}"]
        lines += [f"{s.name}{_labels(s.labels)} {_number(s.value)}" for s in found]
    return "\n".join(lines) + "\n"


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    escaped = (value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for _, value in labels)
    return "{" + ",".join(f'{name}="{value}"' for (name, _), value in zip(labels, escaped)) + "}"


def _number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))
