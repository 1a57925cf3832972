"""Alerts through an Airflow notifier the user configures (`SmtpNotifier`, Slack's, any
`BaseNotifier`): a checkpoint stalled (promise 9), stalled on the dead-letter budget, or the
pipeline's oldest record not committed older than a bound. Once per event, not once per
task or retry: each task of a run (`checkpoint_tasks(..., alerts=Alerts(...))`) looks at what
is going on once it ends (exactly_once.orchestration.observed), and sends what no alert was
sent for yet; the ledger's
exactly_once.alerts records it once its notifier returned, so a notifier that fails (or
does not return within `notify_timeout`) leaves it to the next task. While a task's notifier
runs it holds the event (a session's advisory lock, no transaction open): another task skips
that event rather than wait, and a task that dies meanwhile releases it with its connection.
A notifier that timed out may still deliver later, so its alert can come twice. An event that ended (the checkpoint committed or released,
freshness back within its bound) is cleared: the same event later alerts again.

The notifier gets the task's context with `exactly_once_alert` (kind, pipeline, subject,
message) for its templates, e.g. `subject="{{ exactly_once_alert.summary }}"`.
"""

from __future__ import annotations

import copy
import logging
import threading
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
    notify_timeout: timedelta = timedelta(seconds=60)  # a notifier not returned by then has failed


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
        conn.autocommit = True  # no transaction stays open while a notifier runs
        for event in current:
            if _sent(conn, event, alerts, context):
                sent.append(event)
    return sent


def _sent(conn, event: Event, alerts: Alerts, context: Mapping) -> bool:
    """Sends the event's alert and records it, unless it has one or another task is sending
    it now (False); raises what the notifier raised, or TimeoutError, recording nothing."""
    names = {"pipeline": event.pipeline, "kind": event.kind, "subject": event.subject}
    with conn.cursor() as cur:
        cur.execute(Q["claim_alert"], names)
        if not cur.fetchone()[0]:
            return False  # another task is sending it: if it fails, a later look sends it
        try:
            cur.execute(Q["alerted"], names)
            if cur.fetchone()[0]:
                return False
            # A copy: a notifier renders its templates into itself, once.
            _called(copy.copy(alerts.notifier), {**context, "exactly_once_alert": asdict(event)},
                    alerts.notify_timeout)
            cur.execute(Q["raise_alert"], {**names, "message": event.message})
            return cur.fetchone() is not None
        finally:
            cur.execute(Q["release_alert"], names)


def _called(notifier: Callable[[dict], None], context: dict, timeout: timedelta) -> None:
    """The notifier called in a thread of its own, waited for at most `timeout`: a mail
    server that never answers must not hold the task (a thread cannot be stopped: left
    behind, as a daemon, it ends with the task's process)."""
    failed: list[BaseException] = []

    def call() -> None:
        try:
            notifier(context)
        except BaseException as error:  # handed to the task's thread
            failed.append(error)

    thread = threading.Thread(target=call, name="exactly_once-notifier", daemon=True)
    thread.start()
    thread.join(timeout.total_seconds())
    if thread.is_alive():
        raise TimeoutError(f"the alert notifier did not return within {timeout.total_seconds():g} s: its alert "
                           "is not recorded, and the pipeline's next task sends it again")
    if failed:
        raise failed[0]
