"""The pipelines view in Airflow's UI (`exactly_once.orchestration.plugin`), after a demo run through
`airflow dags test` and beside a stalled pipeline, read in Debian's chromium as a person sees
it: each figure on the page equals what SQL on the ledger (and Kafka, for the lag) says; the
stalled pipeline comes first; a checkpoint links to its DAG run. Without a valid Airflow login
or token the app answers 401/403. With `[exactly_once] show_payloads` on, the admin (who may
edit the DAG) sees the dead letters' first bytes, as the ledger holds them; a read-only user
(role viewer) sees no byte of them. A real Prometheus scrapes the metrics endpoint with the
scrapers' token (none or a forged one is refused), and each metric equals what the ledger and
Kafka say (tests/dags/metrics_scrape.py). Screenshots go to .local/artifacts/ui/.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote, urlparse

import psycopg2
import requests
from confluent_kafka import Consumer, TopicPartition
from playwright.sync_api import expect

from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.kafka_offsets import KafkaOffsets
from exactly_once.ledger.protocol import Ledger
from exactly_once.operate.overview import PREVIEW_BYTES, REASON_CHARACTERS, REASON_KINDS, preview, with_reason_kind
from exactly_once_demo.pipeline import config as demo_config
from exactly_once_demo.produce import produce
from exactly_once_stack import airflow
from exactly_once_stack.private import write_private
from exactly_once_stack.settings import ROOT, environment, passwords, process_environment
from tests.dags.metrics_scrape import check_the_metrics, check_the_token, committed_ends
from tests.dags.test_orders_exactly_once import dags_test
from tests.dags.test_ui import SHOTS, Ui
from tests.exactly_once_demo.oracle import assert_tables_equal_the_oracle

VIEW = "/exactly-once"
VIEWER = "viewer"  # a user who may read every DAG and edit none (the simple auth manager's role viewer)


@contextmanager
def the_ui(folder: Path, viewer_password: str) -> Iterator[str]:
    """The api-server (with the plugin) and the other services, on the project's DAGs folder,
    with the demo DAG paused: the scheduler must not run it beside `airflow dags test`. The
    dead letters' record values switched on, and a read-only user beside the admin (in a
    passwords file of the test's, 0600): this test starts the api-server with them."""
    subprocess.run(["airflow", "dags", "pause", "orders_exactly_once"], env=process_environment(), cwd=ROOT,
                   capture_output=True, timeout=120)  # fails harmlessly while no run registered the DAG
    logins = write_private(folder / "passwords.json",
                           json.dumps({"admin": passwords()["airflow_admin"], VIEWER: viewer_password}))
    started = airflow.start_services(AIRFLOW__EXACTLY_ONCE__SHOW_PAYLOADS="True",
                                     AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=f"admin:admin,{VIEWER}:viewer",
                                     AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(logins))
    try:
        assert "api-server" in started, "an Airflow api-server runs already: stop it (this test starts its own)"
        yield environment()["AIRFLOW__API__BASE_URL"]
    finally:
        airflow.stop_services(started)


def query(db_url: str, statement: str, *params) -> list[tuple]:
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        cur.execute(statement, params)
        return cur.fetchall()


def stall_a_pipeline(db_url: str, kafka_servers: str) -> tuple[str, int]:
    """A pipeline whose first checkpoint failed in a way no retry fixes: stalled (the ledger's
    own protocol, no Spark job needed)."""
    name = f"view_stalled_{uuid.uuid4().hex[:6]}"
    produce(kafka_servers, 20, topic=name)
    ledger = Ledger(demo_config(name, name, schema="demo"), lambda: psycopg2.connect(db_url))
    with KafkaOffsets(KafkaClient.at(kafka_servers)) as kafka:
        checkpoint = ledger.begin("view-run-1", None, datetime.now(timezone.utc), kafka).checkpoint
    attempt = ledger.start_attempt(checkpoint.id).attempt
    ledger.abort_attempt(checkpoint.id, attempt, "BadRecords: a record no retry can fix", retryable=False)
    return name, checkpoint.id


def expected_lag(db_url: str, kafka_servers: str) -> list[int]:
    """Per partition of the demo pipeline: Kafka's last stable offset minus the end of what is committed."""
    ends = committed_ends(db_url)
    consumer = Consumer({"bootstrap.servers": kafka_servers, "group.id": "view-test",
                         "isolation.level": "read_committed"})
    try:
        return [max(0, consumer.get_watermark_offsets(TopicPartition(t, p), timeout=30, cached=False)[1] - end)
                for t, p, end in ends]
    finally:
        consumer.close()


def check_the_logins(airflow_ui: str) -> None:
    """Without a valid Airflow login or token the view answers 401 or 403."""
    anonymous = requests.get(f"{airflow_ui}{VIEW}/", timeout=30)
    assert (anonymous.status_code, anonymous.json()) == (401, {"detail": "Not authenticated"})
    forged = requests.get(f"{airflow_ui}{VIEW}/api/pipelines", headers={"Authorization": "Bearer forged"},
                          timeout=30)
    assert (forged.status_code, forged.json()) == (403, {"detail": "Invalid JWT token"})
    assert requests.get(f"{airflow_ui}{VIEW}/docs", timeout=30).status_code == 404  # no unauthenticated pages
    token = requests.post(f"{airflow_ui}/auth/token", timeout=30,
                          json={"username": "admin", "password": passwords()["airflow_admin"]}).json()
    answer = requests.get(f"{airflow_ui}{VIEW}/api/pipelines", timeout=60,
                          headers={"Authorization": f"Bearer {token['access_token']}"})
    assert answer.status_code == 200 and isinstance(answer.json(), list)


def check_who_sees_record_values(airflow_ui: str, db_url: str, viewer_password: str) -> None:
    """Switched on: the admin, who may edit the DAG, sees each newest dead letter's first bytes as
    the ledger holds them; the read-only user sees the same dead letters without a byte of them
    (JSON and page), on every pipeline."""
    def token(username: str, password: str) -> dict:
        answer = requests.post(f"{airflow_ui}/auth/token", json={"username": username, "password": password},
                               timeout=30)
        assert answer.status_code in (200, 201), answer.text
        return {"Authorization": f"Bearer {answer.json()['access_token']}"}

    def orders(headers: dict) -> dict:
        answer = requests.get(f"{airflow_ui}{VIEW}/api/pipelines", headers=headers, timeout=120)
        assert answer.status_code == 200, answer.text
        return next(o for o in answer.json() if o["status"]["name"] == "orders")

    values = query(db_url, "SELECT value FROM exactly_once.dead_letters WHERE pipeline = 'orders' "
                           "ORDER BY committed_at DESC, topic, partition, \"offset\" DESC LIMIT 10")
    shown = [d["preview"] for d in orders(token("admin", passwords()["airflow_admin"]))["newest_dead_letters"]]
    assert shown == [preview(None if v is None else bytes(v)[:PREVIEW_BYTES]) for v, in values]
    assert any(shown)
    viewer = token(VIEWER, viewer_password)
    newest = orders(viewer)["newest_dead_letters"]
    assert len(newest) == len(values) and all(d["preview"] is None for d in newest)
    html = requests.get(f"{airflow_ui}{VIEW}/", headers=viewer, timeout=120).text
    assert 'data-field="preview"' not in html and "\\x5cu0000" not in html  # no preview, not the poison's
    assert 'data-field="preview-not-shown"' in html and 'data-field="previews-rule"' in html


def test_the_view_refuses_without_a_login_and_shows_what_the_ledger_says(fresh_demo, kafka_servers, page, tmp_path):
    produce(kafka_servers, 1000)  # a checkpoint with malformed and poison records among 1,000 orders
    run = dags_test(datetime.now(timezone.utc))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert_tables_equal_the_oracle(fresh_demo, kafka_servers)
    stalled, stalled_checkpoint = stall_a_pipeline(fresh_demo, kafka_servers)
    produce(kafka_servers, 100)  # not read yet: lag
    viewer_password = secrets.token_urlsafe(12)
    with the_ui(tmp_path, viewer_password) as base:
        check_the_logins(base)
        check_the_token(base)
        check_who_sees_record_values(base, fresh_demo, viewer_password)
        read_the_view(page, fresh_demo, kafka_servers, stalled, stalled_checkpoint)
        check_the_metrics(fresh_demo, kafka_servers, stalled, page, SHOTS)


def read_the_view(page, fresh_demo: str, kafka_servers: str, stalled: str, stalled_checkpoint: int) -> None:
    ui = Ui(page, "orders_exactly_once")
    ui.login()
    page.get_by_role("button", name="Browse").click()
    page.get_by_role("menuitem", name="Exactly-once pipelines").click()
    # The tests' ledger holds hundreds of pipelines, each asked of Kafka for its lag: seconds.
    expect(page.frame_locator("iframe").locator('section[data-pipeline="orders"]')).to_be_visible(timeout=60_000)
    ui.shot("view-01-pipelines-in-the-airflow-ui")
    page.goto(f"{ui.base}{VIEW}/")  # the same page on its own, as the iframe shows it, logged in by the cookie
    view = page
    orders = view.locator('section[data-pipeline="orders"]')

    [(last_id, last_run, last_records)] = query(
        fresh_demo, "SELECT id, dag_run_id, records FROM exactly_once.checkpoints WHERE pipeline = 'orders' "
                    "AND state = 'committed' ORDER BY committed_at DESC LIMIT 1")
    assert orders.locator('[data-field="last-commit-id"]').inner_text() == str(last_id)
    assert orders.locator('[data-field="last-commit-records"]').inner_text() == str(last_records)
    lag = [int(text) for text in orders.locator('[data-field="lag"]').all_inner_texts()]
    assert lag == expected_lag(fresh_demo, kafka_servers) and sum(lag) >= 100
    assert orders.get_by_text("Open checkpoints").locator("xpath=following-sibling::*[1]").inner_text() == "none"

    with closing(psycopg2.connect(fresh_demo)) as conn, conn.cursor() as cur:  # per kind of reason
        cur.execute(with_reason_kind("dead_letter_reasons"), {"pipeline": "orders", "limit": REASON_KINDS,
                                                              "characters": REASON_CHARACTERS})
        reasons = dict(cur.fetchall())
    shown = dict(zip(orders.locator('[data-field="dead-letter-reason"]').all_inner_texts(),
                     map(int, orders.locator('[data-field="dead-letter-count"]').all_inner_texts())))
    assert shown == reasons and len(reasons) >= 2  # malformed JSON and the NUL poison
    newest = query(fresh_demo, "SELECT topic, partition, \"offset\" FROM exactly_once.dead_letters "
                               "WHERE pipeline = 'orders' ORDER BY committed_at DESC, topic, partition, "
                               "\"offset\" DESC LIMIT 10")
    rows = [row.split("\t")[:3] for row in orders.locator('[data-row="dead-letter"]').all_inner_texts()]
    assert [(t, int(p), int(o)) for t, p, o in rows] == newest
    assert any("\\x5cu0000" in text for text in orders.locator("code").all_inner_texts())  # the poison, escaped

    history = query(fresh_demo, "SELECT id, coalesce(records, 0) FROM exactly_once.checkpoints "
                                "WHERE pipeline = 'orders' ORDER BY id DESC LIMIT 20")
    bars = orders.locator('[data-field="records-bar"]')
    assert [(int(bars.nth(i).get_attribute("data-checkpoint")), int(bars.nth(i).get_attribute("data-value")))
            for i in range(bars.count())] == list(reversed(history))
    assert orders.locator('[data-field="latency-bar"]').count() == len(history)
    orders.screenshot(path=SHOTS / "view-02-demo-pipeline.png")

    sections = view.locator("section[data-pipeline]")
    names = sections.evaluate_all("sections => sections.map(s => s.dataset.pipeline)")  # one round trip
    stalled_names = {name for name, in query(fresh_demo, "SELECT DISTINCT pipeline FROM exactly_once.checkpoints "
                                                         "WHERE state = 'stalled'")}
    assert names[:len(stalled_names)] == sorted(stalled_names)  # stalled pipelines come first
    stall = view.locator(f'section[data-pipeline="{stalled}"]')
    assert stall.locator('[data-field="health"]').inner_text() == "STALLED"
    said = stall.locator('[data-field="stall"]').inner_text()
    assert f"STALLED: checkpoint {stalled_checkpoint} (DAG run view-run-1)" in said
    assert "a record no retry can fix" in said and "way out" in said
    stall.screenshot(path=SHOTS / "view-03-stalled-pipeline.png")

    link = orders.locator('[data-field="last-commit-id"] a')
    run_path = f"/dags/orders_exactly_once/runs/{quote(last_run, safe='')}"
    assert link.get_attribute("href") == run_path
    link.click()
    expect(page.get_by_text(last_run).first).to_be_visible(timeout=30_000)
    assert urlparse(page.url).path == run_path
    ui.shot("view-04-the-checkpoints-dag-run")
