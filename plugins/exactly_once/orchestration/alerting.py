"""Alerts through an Airflow notifier the user configures (`SmtpNotifier`, Slack's, any
`BaseNotifier`): a checkpoint stalled (promise 9), stalled on the dead-letter budget, or the
pipeline's oldest record not committed older than a bound. Once per event, not once per
task or retry: each task of a run (`checkpoint_tasks(..., alerts=Alerts(...))`) looks at what
is going on once it ends (exactly_once.orchestration.observed), and sends what no alert was
sent for yet; the ledger's
exactly_once.alerts records it in the transaction that sends it, so a notifier that fails
leaves it to the next task. An event that ended (the checkpoint committed or released,
freshness back within its bound) is cleared: the same event later alerts again.

The notifier gets the task's context with `exactly_once_alert` (kind, pipeline, subject,
message) for its templates, e.g. `subject="{{ exactly_once_alert.summary }}"`.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from contextlib import closing
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone

from exactly_once.dead_letter_budget import BREACH
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.refusals import Stalled
from exactly_once.operate.metrics import Sample, read_samples
from exactly_once.sqlfiles import named

Q = named("alerts.sql")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Alerts:
    """What a pipeline's tasks alert on, and through what."""

    notifier: Callable[[dict], None]       # an Airflow notifier, called with a context
    freshness_after: timedelta | None = None  # alert when the oldest record not committed is older


@dataclass(frozen=True)
class Event:
    kind: str      # stalled, dead_letter_budget, freshness (sql/migrations/0012_phase_seconds_and_alerts.sql)
    pipeline: str
    subject: str   # the stalled checkpoint's id; '' for freshness
    summary: str   # one line, for a mail's subject
    message: str

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.subject}"


def stall_events(ledger: Ledger) -> list[Event]:
    """The pipeline's stalled checkpoints, each an event."""
    name = ledger.config.name
    with ledger.rows() as rows:
        stalled = rows.stalled()
    budget = {c.id for c in stalled if (c.reason or "").startswith(BREACH)}
    return [Event("dead_letter_budget" if c.id in budget else "stalled", name, str(c.id),
                  f"pipeline {name}: checkpoint {c.id} is stalled" + (" on its dead-letter budget" if c.id in budget
                                                                       else ""),
                  str(Stalled(name, c))) for c in stalled]


def freshness_event(ledger: Ledger, kafka: KafkaClient, bound: timedelta, now: datetime) -> Event | None:
    """An event if the pipeline's oldest record not committed is older than `bound`, by the
    metrics' own reading; raises if Kafka cannot say."""
    name = ledger.config.name
    with closing(ledger.connect()) as conn:
        samples = read_samples(conn, kafka, now, [name])
    if Sample("exactly_once_kafka_up", (), 1) not in samples:
        raise ConnectionError(f"Kafka did not answer for the freshness of pipeline {name!r}")
    oldest = max((s.value for s in samples if s.name == "exactly_once_freshness_seconds"), default=0.0)
    if oldest <= bound.total_seconds():
        return None
    return Event("freshness", name, "", f"pipeline {name}: records wait {oldest:.0f} s to be committed",
                 f"pipeline {name!r}: its oldest record not committed was stamped {oldest:.0f} s ago, more than "
                 f"the bound of {bound.total_seconds():.0f} s: are its runs failing, paused, or slower than its "
                 "records come?")


def send_new(ledger: Ledger, alerts: Alerts, kafka: Callable[[], KafkaClient], context: Mapping,
             now: datetime | None = None) -> list[Event]:
    """Clears the alerts of events that ended and sends one for each current event that has
    none yet; returns the events it sent. Stalls are read from the ledger alone: Kafka being
    unusable leaves the freshness alert as it is, and stalls are still sent."""
    current, undecided = stall_events(ledger), []
    if alerts.freshness_after is not None:
        try:
            fresh = freshness_event(ledger, kafka(), alerts.freshness_after, now or datetime.now(timezone.utc))
            current += [fresh] if fresh else []
        except Exception as unread:  # whatever Kafka or its connection fails with: the next task asks again
            log.warning("pipeline %s: freshness not read, its alert left as it is: %s", ledger.config.name, unread)
            undecided.append(Event("freshness", ledger.config.name, "", "", "").key)
    sent = []
    with closing(ledger.connect()) as conn:
        with conn, conn.cursor() as cur:
            cur.execute(Q["clear_ended"], {"pipeline": ledger.config.name,
                                           "current": [e.key for e in current] + undecided})
        for event in current:
            with conn, conn.cursor() as cur:
                cur.execute(Q["raise_alert"], {"pipeline": event.pipeline, "kind": event.kind,
                                               "subject": event.subject, "message": event.message})
                if cur.fetchone() is None:
                    continue  # alerted already
                # A copy: a notifier renders its templates into itself, once.
                copy.copy(alerts.notifier)({**context, "exactly_once_alert": asdict(event)})
            sent.append(event)
    return sent
