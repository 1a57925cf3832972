"""The demo pipeline starts each DAG test from nothing; the UI tests' browser."""

from __future__ import annotations

import time
from contextlib import closing

import psycopg2
import pytest
from confluent_kafka.admin import AdminClient
from playwright.sync_api import sync_playwright
from psycopg2 import sql

from exactly_once.ledger.tables import contributions_table
from exactly_once.publishing.publisher import kafka_sinks, progress_topic, transactional_id
from exactly_once_demo.pipeline import CONFIG, DELTAS_TOPIC, TOPIC
from exactly_once_demo.prepare import create_tables
from exactly_once_demo.produce import ensure_topic
from tests.kafka_records import forget_progress

# Its assertions say what they compared, like a test module's (it is imported after this file).
pytest.register_assert_rewrite("tests.dags.metrics_scrape")

CHROMIUM = "/usr/bin/chromium"  # Debian's package, installed by exactly_once_stack/setup.sh
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
LEDGER_TABLES = ("committed_ranges", "gaps", "dead_letters", "checkpoint_ranges", "outbox", "outbox_published")


@pytest.fixture
def fresh_demo(ledger_db, kafka_servers):
    """No demo topic, tables, ledger rows or published records left from an earlier test or
    demo (its publisher's progress forgotten by a tombstone); an empty topic to publish to."""
    admin = AdminClient({"bootstrap.servers": kafka_servers})
    for topic in (TOPIC, DELTAS_TOPIC):
        if topic in admin.list_topics(timeout=30).topics:
            admin.delete_topics([topic])[topic].result(timeout=30)
            while topic in admin.list_topics(timeout=30).topics:
                time.sleep(0.2)
    ensure_topic(kafka_servers, DELTAS_TOPIC)
    [deltas] = kafka_sinks(CONFIG)
    forget_progress(kafka_servers, progress_topic(CONFIG, deltas), transactional_id(CONFIG, deltas))
    with closing(psycopg2.connect(ledger_db)) as conn, conn, conn.cursor() as cur:
        cur.execute("DROP SCHEMA IF EXISTS demo CASCADE")
        for table in LEDGER_TABLES:
            cur.execute(f"DELETE FROM exactly_once.{table} WHERE pipeline = %s", (CONFIG.name,))
        cur.execute("DELETE FROM exactly_once.attempts WHERE checkpoint_id IN "
                    "(SELECT id FROM exactly_once.checkpoints WHERE pipeline = %s)", (CONFIG.name,))
        for table in ("checkpoints", "partitions"):
            cur.execute(f"DELETE FROM exactly_once.{table} WHERE pipeline = %s", (CONFIG.name,))
        for sink in CONFIG.sinks:  # the contributions of checkpoints gone (a reprocessing recomputes from them)
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(contributions_table(CONFIG, sink)))
    with closing(psycopg2.connect(ledger_db)) as conn:
        create_tables(conn)
    return ledger_db


@pytest.fixture
def page():
    """A chromium page (UTC, 1400x1000), closed after the test."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        context = browser.new_context(timezone_id="UTC", viewport={"width": 1400, "height": 1000})
        context.set_default_timeout(30_000)
        yield context.new_page()
        browser.close()
