"""Alerts through Airflow's SmtpNotifier to a real SMTP server on loopback (aiosmtpd), on real
Kafka and PostgreSQL (issue 40): a checkpoint stalled on its dead-letter budget, and records
older than the freshness bound, each send exactly one mail however many tasks look (a retry,
the next run's tasks); a notifier that fails records nothing, so the next look sends it; Kafka
unusable leaves the freshness alert as it is; once the event ended (committed by the
operator's way out, the records committed) its alert is cleared and nothing more is sent,
and the same event later alerts again. The runs go through the pipeline's
own run path (exactly_once.orchestration.tasks) with the protocol's test driver as the job."""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import timedelta
from email import message_from_bytes
from email.message import Message

import pytest
from aiosmtpd.controller import Controller
from airflow.providers.smtp.notifications.smtp import SmtpNotifier

from exactly_once.errors import ConfigError
from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.checkpoints import Outcome
from exactly_once.ledger.refusals import Stalled
from exactly_once.orchestration import tasks
from exactly_once.orchestration.alerting import Alerts, send_new
from exactly_once.orchestration.observed import observed
from tests.ledger.harness import Pipeline, order, query

CONN_ID = "smtp_alerts"


class Mailbox:
    """An aiosmtpd handler keeping what it receives."""

    def __init__(self):
        self.mails: list[Message] = []

    async def handle_DATA(self, server, session, envelope):
        self.mails.append(message_from_bytes(envelope.content))
        return "250 OK"


@pytest.fixture
def mailbox(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    box = Mailbox()
    server = Controller(box, hostname="127.0.0.1", port=port)
    server.start()
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": port,
        "extra": {"disable_ssl": True, "disable_tls": True, "from_email": "pipelines@example.org"}}))
    try:
        yield box
    finally:
        server.stop()


def notifier() -> SmtpNotifier:
    return SmtpNotifier(to="oncall@example.org", smtp_conn_id=CONN_ID, subject="{{ exactly_once_alert.summary }}",
                        html_content="<p>{{ exactly_once_alert.message }}</p>")


def html_of(mail: Message) -> str:
    [html] = [part for part in mail.walk() if part.get_content_type() == "text/html"]
    return html.get_payload(decode=True).decode()


def look(pipeline: Pipeline, alerts: Alerts) -> None:
    """What every task of a run does once its work ends, as checkpoint_tasks wires it."""
    with observed(lambda: pipeline.ledger, alerts, lambda: KafkaClient.at(pipeline.servers), {}):
        pass


def send(pipeline: Pipeline, alerts: Alerts, kafka=None) -> list[tuple[str, str]]:
    """The alerts sent now (what `look` does, without its logging of failures): (kind, subject)."""
    sent = send_new(pipeline.ledger, alerts, kafka or (lambda: KafkaClient.at(pipeline.servers)), {})
    return [(event.kind, event.subject) for event in sent]


def open_alerts(pipeline: Pipeline) -> list[tuple[str, str]]:
    return query(pipeline.db_url, "SELECT kind, subject FROM exactly_once.alerts WHERE pipeline = %s "
                                  "AND cleared_at IS NULL ORDER BY id", pipeline.config.name)


def stall_on_the_budget(pipeline: Pipeline) -> int:
    """A checkpoint of 25 records no pipeline reads and a good one, stalled at commit."""
    unreadable = [(i % 3, b"k", b"<order/>") for i in range(25)]
    pipeline.produce([(True, [*unreadable, (0, b"apple", order(1, "apple", 5))])])
    checkpoint_id = pipeline.begin().checkpoint.id
    pipeline.driver.run(checkpoint_id)
    with pytest.raises(Stalled, match=r"dead-letter budget exceeded: 25 of the \d+ records"):
        tasks.commit_checkpoint(pipeline.ledger, checkpoint_id, 1)
    return checkpoint_id


def test_a_checkpoint_stalled_on_its_dead_letter_budget_mails_once_and_clears_once_committed(
        ledger_db, kafka_servers, topic, mailbox, monkeypatch):
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    alerts = Alerts(notifier())
    checkpoint_id = stall_on_the_budget(pipeline)

    with socket.socket() as closed:  # a notifier whose server is down: nothing recorded, sent later
        closed.bind(("127.0.0.1", 0))
        monkeypatch.setenv("AIRFLOW_CONN_SMTP_DOWN", json.dumps({
            "conn_type": "smtp", "host": "127.0.0.1", "port": closed.getsockname()[1],
            "extra": {"disable_ssl": True, "disable_tls": True, "from_email": "pipelines@example.org"}}))
        with pytest.raises(OSError):
            send(pipeline, Alerts(SmtpNotifier(to="oncall@example.org", smtp_conn_id="smtp_down")))
    assert open_alerts(pipeline) == []

    assert send(pipeline, alerts) == [("dead_letter_budget", str(checkpoint_id))]
    look(pipeline, alerts)  # the failed commit task's retry, the next run's begin, … through the tasks' hook
    assert send(pipeline, alerts) == []
    [mail] = mailbox.mails
    assert mail["Subject"] == f"pipeline {pipeline.config.name}: checkpoint {checkpoint_id} is stalled on its " \
                              "dead-letter budget"
    assert mail["To"] == "oncall@example.org"
    assert "clear its commit task to commit it as it is" in html_of(mail)
    assert open_alerts(pipeline) == [("dead_letter_budget", str(checkpoint_id))]

    cleared = pipeline.ledger.now()  # the operator's way out: a cleared commit task
    assert tasks.commit_checkpoint(pipeline.ledger, checkpoint_id, 2, cleared) is Outcome.COMMITTED
    assert send(pipeline, alerts) == [] and open_alerts(pipeline) == []  # the event ended: cleared
    look(pipeline, alerts)
    assert len(mailbox.mails) == 1
    pipeline.assert_exact()

    again = stall_on_the_budget(pipeline)  # a new event: a new alert
    look(pipeline, alerts)
    assert len(mailbox.mails) == 2 and mailbox.mails[1]["Subject"].endswith(f"checkpoint {again} is stalled on "
                                                                             "its dead-letter budget")


def test_records_older_than_the_freshness_bound_mail_once_until_they_are_committed(
        ledger_db, kafka_servers, topic, mailbox):
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    alerts = Alerts(notifier(), freshness_after=timedelta(seconds=2))
    pipeline.run_once()  # the pipeline knows its partitions
    pipeline.produce([(True, [(1, b"apple", order(1, "apple", 5))])])
    assert send(pipeline, alerts) == []  # younger than the bound
    time.sleep(2.5)
    assert send(pipeline, alerts) == [("freshness", "")]
    look(pipeline, alerts)
    [mail] = mailbox.mails
    assert mail["Subject"].startswith(f"pipeline {pipeline.config.name}: records wait ")

    def unusable():
        raise ConfigError("connection 'kafka_default' is of type 'http', not 'kafka'")
    assert send(pipeline, alerts, unusable) == [] and open_alerts(pipeline) == [("freshness", "")]  # left as it is

    pipeline.run_once()  # committed: the event ended
    assert send(pipeline, alerts) == [] and open_alerts(pipeline) == []
    assert len(mailbox.mails) == 1
    pipeline.assert_exact()


def test_a_hanging_notifier_blocks_no_other_task_beyond_its_timeout_and_its_alert_is_sent_later(
        ledger_db, kafka_servers, topic, mailbox):
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    checkpoint_id = stall_on_the_budget(pipeline)
    entered, release, failures = threading.Event(), threading.Event(), []

    def hanging(context) -> None:  # a mail server that accepts the connection and never answers
        entered.set()
        release.wait(20)

    def first_task() -> None:
        try:
            send(pipeline, Alerts(hanging, notify_timeout=timedelta(seconds=2)))
        except Exception as failed:
            failures.append(failed)

    hung = threading.Thread(target=first_task)
    started = time.monotonic()
    hung.start()
    try:
        assert entered.wait(30)
        other_task = time.monotonic()
        send(pipeline, Alerts(notifier()))  # another task of the pipeline looks meanwhile
        waited = time.monotonic() - other_task
        hung.join(10)
        print(f"the other task waited {waited:.1f} s; the hanging task ended after "
              f"{time.monotonic() - started:.1f} s with {failures}")
        assert waited < 2 + 1, f"another task's alerts waited {waited:.1f} s on a hanging notifier"
        assert not hung.is_alive() and len(failures) == 1 and isinstance(failures[0], TimeoutError)
        assert "did not return within 2 s" in str(failures[0])
    finally:
        release.set()
        hung.join()
    assert open_alerts(pipeline) == []  # nothing recorded for the alert the notifier did not send

    assert send(pipeline, Alerts(notifier())) == [("dead_letter_budget", str(checkpoint_id))]  # the next look
    assert send(pipeline, Alerts(notifier())) == []
    assert len(mailbox.mails) == 1
