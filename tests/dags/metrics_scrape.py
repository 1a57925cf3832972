"""The pipelines' metrics as a real Prometheus scrapes them from the api-server's plugin
endpoint (exactly_once_stack.prometheus, Debian's prometheus), each compared with what the
ledger's SQL and Kafka say (tests/dags/test_pipelines_view.py calls it with the services up,
after a demo run with poison records, beside a stalled pipeline and unread orders)."""

from __future__ import annotations

import math
import time
from contextlib import closing
from urllib.parse import urlencode

import psycopg2
import requests
from confluent_kafka import Consumer, TopicPartition

from exactly_once_stack import prometheus
from exactly_once_stack.settings import passwords

METRICS = "/exactly-once/metrics"
SHOT_QUERY = 'exactly_once_freshness_seconds{pipeline="orders"}'


def query(db_url: str, statement: str, *params) -> list[tuple]:
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        cur.execute(statement, params)
        return cur.fetchall()


def check_the_token(base: str) -> None:
    """The endpoint takes the scrapers' token only: none → 401, another → 403 (an Airflow
    login's token is no scraper's either)."""
    assert requests.get(f"{base}{METRICS}", timeout=30).status_code == 401
    forged = requests.get(f"{base}{METRICS}", headers={"Authorization": "Bearer forged"}, timeout=30)
    assert forged.status_code == 403
    login = requests.post(f"{base}/auth/token", timeout=30,
                          json={"username": "admin", "password": passwords()["airflow_admin"]}).json()["access_token"]
    assert requests.get(f"{base}{METRICS}", headers={"Authorization": f"Bearer {login}"}, timeout=30).status_code == 403
    good = requests.get(f"{base}{METRICS}?pipeline=orders", timeout=60,
                        headers={"Authorization": f"Bearer {passwords()['metrics_scraper']}"})
    assert good.status_code == 200 and good.headers["content-type"].startswith("text/plain; version=0.0.4")


def scraped(selector: str) -> dict[tuple, tuple[float, float]]:
    """The newest sample Prometheus holds of each series: labels (without job and instance) →
    (the scrape's time, value). A range selector, as an instant query's time is the query's."""
    return {tuple(sorted((k, v) for k, v in r["metric"].items() if k not in ("job", "instance", "__name__"))):
            tuple(map(float, r["values"][-1])) for r in prometheus.query(f"{selector}[1m]")}


def key(**labels: str) -> tuple:
    return tuple(sorted(labels.items()))


def values(selector: str) -> dict[tuple, float]:
    return {labels: value for labels, (_, value) in scraped(selector).items()}


def first_unread_stamps(kafka_servers: str, ends: list[tuple[str, int, int]]) -> dict[tuple[str, int], float]:
    """Kafka's timestamp (seconds) of the first committed record at or after each end."""
    consumer = Consumer({"bootstrap.servers": kafka_servers, "group.id": "metrics-test",
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    stamps = {}
    try:
        for topic, partition, end in ends:
            consumer.assign([TopicPartition(topic, partition, end)])
            message = consumer.poll(30)
            assert message is not None
            if message.error() is None:
                stamps[topic, partition] = message.timestamp()[1] / 1000
    finally:
        consumer.close()
    return stamps


def check_the_metrics(db_url: str, kafka_servers: str, stalled: str, page, shots) -> None:
    started = prometheus.start(scrape_interval="5s", pipelines=["orders", stalled], fresh=True)
    try:
        assert started, "a Prometheus runs already: stop it (this test starts its own)"
        deadline = time.monotonic() + 120
        while not values('exactly_once_stalled{pipeline="%s"}' % stalled) and time.monotonic() < deadline:
            time.sleep(1)
        assert values('exactly_once_stalled{pipeline="%s"}' % stalled), prometheus.scrape_health()
        compare(db_url, kafka_servers, stalled)
        while len(prometheus.query(f"{SHOT_QUERY}[1m]")[0]["values"]) < 5 and time.monotonic() < deadline:
            time.sleep(1)  # a graph of the records' growing age, not a dot
        page.goto(f"{prometheus.url()}/graph?" + urlencode({"g0.expr": SHOT_QUERY, "g0.tab": "0",
                                                              "g0.range_input": "1m"}))
        page.get_by_text("exactly_once_freshness_seconds").first.wait_for(timeout=30_000)
        page.screenshot(path=shots / "prometheus-freshness.png")
    finally:
        if started:
            prometheus.stop()


def committed_ends(db_url: str) -> list[tuple[str, int, int]]:
    """Per partition of the demo pipeline: where committed reading ends below its frontier."""
    return query(db_url, "SELECT p.topic, p.partition, coalesce(max(c.to_offset), p.start_offset) "
                         "FROM exactly_once.partitions p LEFT JOIN exactly_once.committed_ranges c "
                         "ON (c.pipeline, c.topic, c.partition) = (p.pipeline, p.topic, p.partition) "
                         "AND c.from_offset < p.frontier WHERE p.pipeline = 'orders' "
                         "GROUP BY 1, 2, p.start_offset ORDER BY 1, 2")


def compare(db_url: str, kafka_servers: str, stalled: str) -> None:
    orders = key(pipeline="orders")
    ends = committed_ends(db_url)
    consumer = Consumer({"bootstrap.servers": kafka_servers, "group.id": "metrics-test",
                         "isolation.level": "read_committed"})
    try:
        stable = {(t, p): consumer.get_watermark_offsets(TopicPartition(t, p), timeout=30, cached=False)[1]
                  for t, p, _ in ends}
    finally:
        consumer.close()
    where = {(t, p): key(pipeline="orders", topic=t, partition=str(p)) for t, p, _ in ends}
    assert values('exactly_once_committed_offset{pipeline="orders"}') == {where[t, p]: e for t, p, e in ends}
    assert values('exactly_once_last_stable_offset{pipeline="orders"}') == {where[k]: v for k, v in stable.items()}
    lag = values('exactly_once_lag_records{pipeline="orders"}')
    assert lag == {where[t, p]: max(0, stable[t, p] - e) for t, p, e in ends} and sum(lag.values()) >= 100

    stamps = first_unread_stamps(kafka_servers, ends)
    fresh = scraped('exactly_once_freshness_seconds{pipeline="orders"}')
    assert set(fresh) == set(where.values())
    for (t, p), labels in where.items():
        at, age = fresh[labels]
        expected = at - stamps[t, p] if (t, p) in stamps else 0.0
        assert abs(age - expected) < 3, (t, p, age, expected)  # the scrape's clock against the sample's time
    assert max(age for _, age in fresh.values()) > 0

    [(records, staged)] = query(db_url, "SELECT records, staged FROM exactly_once.checkpoints WHERE pipeline = "
                                        "'orders' AND state = 'committed' AND replays IS NULL "
                                        "AND precommitted_attempt IS NOT NULL ORDER BY committed_at DESC LIMIT 1")
    assert values('exactly_once_last_checkpoint_records{pipeline="orders"}') == {orders: records}
    assert values('exactly_once_last_checkpoint_rows{pipeline="orders"}') == {
        key(pipeline="orders", sink=sink): s["rows"] for sink, s in staged.items() if sink != "_dead_letters"}
    assert values('exactly_once_last_checkpoint_dead_letters{pipeline="orders"}') == {
        orders: staged["_dead_letters"]["rows"]} and staged["_dead_letters"]["rows"] > 0

    phases = query(db_url, "SELECT p.key, count(*), sum(p.value::float8), "
                           "count(*) FILTER (WHERE p.value::float8 <= 1) FROM exactly_once.checkpoints c, "
                           "jsonb_each_text(c.phase_seconds) p WHERE c.pipeline = 'orders' "
                           "AND c.state = 'committed' GROUP BY 1")
    assert {phase for phase, *_ in phases} >= {"plan", "spark", "pre_commit", "commit"}
    counts = values('exactly_once_checkpoint_phase_seconds_count{pipeline="orders"}')
    sums = values('exactly_once_checkpoint_phase_seconds_sum{pipeline="orders"}')
    within_1s = values('exactly_once_checkpoint_phase_seconds_bucket{pipeline="orders",le="1"}')
    everything = values('exactly_once_checkpoint_phase_seconds_bucket{pipeline="orders",le="+Inf"}')
    for phase, n, total, fast in phases:
        labels = key(pipeline="orders", phase=phase)
        assert counts[labels] == n and math.isclose(sums[labels], total, rel_tol=1e-9)
        assert within_1s[key(pipeline="orders", phase=phase, le="1")] == fast
        assert everything[key(pipeline="orders", phase=phase, le="+Inf")] == n

    attempts = query(db_url, "SELECT a.state::text, count(*) FROM exactly_once.attempts a JOIN "
                             "exactly_once.checkpoints c ON c.id = a.checkpoint_id WHERE c.pipeline = 'orders' "
                             "GROUP BY 1")
    assert values('exactly_once_attempts{pipeline="orders"}') == {
        key(pipeline="orders", state=state): n for state, n in attempts}
    dead = values('exactly_once_dead_letters{pipeline="orders"}')
    [(dead_letters,)] = query(db_url, "SELECT count(*) FROM exactly_once.dead_letters WHERE pipeline = 'orders'")
    assert sum(dead.values()) == dead_letters and len(dead) >= 2  # malformed values and refused rows
    assert {dict(labels)["reason_class"] for labels in dead} <= {
        "sink_refused", "transform", "operator", "too_large", "tombstone", "schema", "format", "other"}

    assert values("exactly_once_stalled") == {orders: 0, key(pipeline=stalled): 1}
    assert values("exactly_once_dead_letter_budget_exceeded") == {orders: 0, key(pipeline=stalled): 0}
    assert values(f'exactly_once_open_checkpoints{{pipeline="{stalled}",state="stalled"}}') == {
        key(pipeline=stalled, state="stalled"): 1}
    assert values("exactly_once_kafka_up") == {(): 1}
