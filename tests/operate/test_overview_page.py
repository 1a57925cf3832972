"""The pipelines view's page (pure): what the ledger holds is shown, never run — names,
reasons and errors are escaped — a dead letter's bytes are previewed without decoding, and
a kafka sink's committed backlog is listed with what holds it back.
What the view reads (real PostgreSQL): record values — a dead letter's bytes, a reason's exact
text — only for readers the payload rule lets see them (an editor of the DAG, switched on by
`[exactly_once] show_payloads`), error texts bounded and without the values a database error
quotes, the ledger read through `pipeline_db_read` when it is defined."""

from __future__ import annotations

import json
from contextlib import closing
from datetime import datetime, timedelta, timezone
from html import escape

import psycopg2
import pytest
from fastapi.encoders import jsonable_encoder

from exactly_once.ledger.planning import OffsetRange
from exactly_once.operate import overview
from exactly_once.operate.overview import ERROR_CHARACTERS, PREVIEW_BYTES, DeadLetter, PipelineOverview, preview
from exactly_once.operate.overview_page import page
from exactly_once.operate.status import Backlog, CheckpointSummary, LastCommit, PipelineStatus, Stall, ledger_reader
from tests.ledger.harness import Pipeline, workload

NOW = datetime(2026, 11, 24, 8, 0, tzinfo=timezone.utc)
HOSTILE = '<script>alert("x")</script>'


def test_the_preview_shows_printable_ascii_and_every_other_byte_as_an_escape():
    assert preview(b'{"sku": "a\x00b"} \xff\xc3\xa9 \\ <') == '{"sku": "a\\x00b"} \\xff\\xc3\\xa9 \\x5c <'
    assert preview(None) == ""


def test_values_from_the_ledger_are_escaped_and_run_links_quoted():
    checkpoint = CheckpointSummary(7, "manual__2026-11-24T08:00:00+00:00", NOW - timedelta(minutes=10), NOW,
                                   "committed", 1000, (OffsetRange("t", 0, 0, 1000),), timedelta(seconds=20),
                                   timedelta(seconds=1), 1)
    status = PipelineStatus(HOSTILE, (Stall(8, "run<2>", (OffsetRange("t", 0, 1000, 1010),), 1, NOW, HOSTILE),),
                            LastCommit(7, checkpoint.dag_run_id, NOW, NOW, 1000), (), (), (), (checkpoint,),
                            (Backlog("events", 9, 12, 6, NOW, 11),))
    dead = DeadLetter("t", 0, 5, HOSTILE, 7, NOW, preview(b"<b>\x00"), 4)
    html = page([PipelineOverview(status, "dag<1>", ((HOSTILE, 1),), (dead,), None)], "", 20, NOW)
    assert "<script>" not in html and "<b>" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html and "&lt;b&gt;\\x00" in html
    assert 'href="/dags/dag%3C1%3E/runs/manual__2026-11-24T08%3A00%3A00%2B00%3A00"' in html
    assert 'data-field="records-bar" data-checkpoint="7" data-value="1000"' in html
    assert 'data-field="latency-bar" data-checkpoint="7" data-value="21.0"' in html
    # A kafka sink's records committed and waiting (docs/guide/kafka-output.md)
    assert ('<tr data-row="backlog"><td>events</td><td class="n">9</td><td class="n">12</td><td class="n">6</td>'
            '<td>2026-11-24 08:00:00 UTC</td><td>checkpoint 11 (open, planned before)</td></tr>') in html


# -- record values: previews only where the reader may see them; error texts bounded ----------
# (real PostgreSQL: the ledger the view reads)

CARD = b"4111 1111 1111 1111"
VALUE = b'{"card": "' + CARD + b'", "price": 12345.99}\x00'
PRICE_REASON = "sink s: column price: 12345.99 does not fit numeric(6,2)"
RAW_ERROR = ("java.sql.BatchUpdateException: Batch entry 0 INSERT INTO t (card) VALUES ('4111 1111 1111 1111') "
             "was aborted: ERROR: new row violates check constraint \"c\"\n  Detail: Failing row contains "
             "(4111 1111 1111 1111). " + "\tat org.apache.spark.Frame.run(Frame.java:1)\n" * 500)
# A row quoted past the bound the kinds of reasons are cut at (REASON_CHARACTERS, in SQL).
LONG_ROW = ('sink s: new row violates check constraint "c"\n  Detail: Failing row contains (o1, '
            + "secretword " * 40 + ").")


@pytest.fixture
def dead_letters(ledger_db, kafka_servers, topic):
    """A stalled pipeline whose DAG is known, the last error and dead letters holding record values as
    a ledger of an older version could keep them (unbounded, values quoted): a card number, a price."""
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    pipeline.produce(workload(0))
    checkpoint_id = pipeline.begin().checkpoint.id
    attempt = pipeline.ledger.start_attempt(checkpoint_id).attempt
    pipeline.ledger.abort_attempt(checkpoint_id, attempt, "BadRecords: a record no retry can fix", retryable=False)
    name = pipeline.config.name
    with closing(psycopg2.connect(ledger_db)) as conn, conn, conn.cursor() as cur:
        cur.execute("UPDATE exactly_once.checkpoints SET reason = %s WHERE id = %s", (RAW_ERROR, checkpoint_id))
        cur.executemany('INSERT INTO exactly_once.dead_letters (pipeline, topic, partition, "offset", value, reason, '
                        "checkpoint_id) VALUES (%s, %s, 9, %s, %s, %s, %s)",
                        [(name, topic, 1, VALUE, PRICE_REASON, checkpoint_id),
                         (name, topic, 2, None, "sink s: " + RAW_ERROR, checkpoint_id),
                         (name, topic, 3, None, LONG_ROW, checkpoint_id)])
    dag_id = f"dag_{name}"
    overview.record_dag(pipeline.ledger.connect, name, dag_id)
    return pipeline.ledger.connect, dag_id


def read(connect, dag_id: str, payloads=None) -> PipelineOverview:
    [shown] = overview.read_overviews(connect, "no Kafka here", 5, 10, lambda dag: dag == dag_id,
                                      *([] if payloads is None else [payloads]))
    return shown


def everything_shown(o: PipelineOverview) -> str:
    """The page and the JSON API's text of one pipeline."""
    return page([o], "", 5, NOW) + json.dumps(jsonable_encoder([o]))


def test_without_payload_rights_no_byte_of_a_value_and_no_value_in_a_reason_is_read_or_shown(dead_letters):
    o = read(*dead_letters)  # by default no reader may see record values
    assert [(d.offset, d.preview, d.size) for d in o.newest_dead_letters] == \
           [(3, None, None), (2, None, None), (1, None, len(VALUE))]
    assert "sink s: column price: # does not fit numeric(6,2)" in [d.reason for d in o.newest_dead_letters]
    shown = everything_shown(o)
    for value in (CARD.decode(), "12345", '\\"card\\"', "card&quot;"):
        assert value not in shown
    assert shown.count('data-field="preview-not-shown"') == 3 and 'data-field="previews-rule"' in shown


def test_with_payload_rights_the_preview_and_exact_reason_are_shown(dead_letters):
    connect, dag_id = dead_letters
    o = read(connect, dag_id, payloads=lambda dag: dag == dag_id)
    [(reason, shown_preview)] = [(d.reason, d.preview) for d in o.newest_dead_letters if d.offset == 1]
    assert (reason, shown_preview) == (PRICE_REASON, preview(VALUE[:PREVIEW_BYTES]))
    html = page([o], "", 5, NOW)
    assert f'<code data-field="preview">{escape(preview(VALUE[:PREVIEW_BYTES]))}</code>' in html
    assert 'data-field="previews-rule"' not in html


@pytest.mark.parametrize("payloads", [None, "all"])
def test_error_texts_are_shown_bounded_and_without_the_values_a_database_error_quotes(dead_letters, payloads):
    connect, dag_id = dead_letters
    o = read(connect, dag_id, (lambda dag: True) if payloads else None)
    [stall] = o.status.stalls
    texts = [stall.last_error, *(d.reason for d in o.newest_dead_letters), *(r for r, _ in o.dead_letter_reasons)]
    for text in texts:
        assert len(text) <= ERROR_CHARACTERS + 50 and CARD.decode() not in text and "secretword" not in text
    assert stall.last_error.endswith("more characters cut)") and "Failing row contains (values not shown)" in \
        stall.last_error
    assert "secretword" not in everything_shown(o)  # (the card is in the value, which an editor sees)
    assert any("Failing row contains (values not shown)" in r for r, _ in o.dead_letter_reasons)


def test_the_payload_rule_read_only_users_never_editors_only_when_switched_on(stack_env, monkeypatch):
    """The app's rule with Airflow's simple auth manager: a viewer (read-only) sees no record
    values, switched on or not; an editor (role USER: may edit DAGs) or an admin only when
    `[exactly_once] show_payloads` is on."""
    from airflow.api_fastapi.app import create_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    from exactly_once.operate.overview_app import payloads_rule

    create_auth_manager()
    users = {role: SimpleAuthManagerUser(username=role.lower(), role=role) for role in ("VIEWER", "USER", "ADMIN")}
    for switch, expected in ((None, set()), ("False", set()), ("True", {"USER", "ADMIN"})):
        if switch is None:
            monkeypatch.delenv("AIRFLOW__EXACTLY_ONCE__SHOW_PAYLOADS", raising=False)
        else:
            monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__SHOW_PAYLOADS", switch)
        for dag_id in ("orders_exactly_once", None):
            assert {role for role, user in users.items() if payloads_rule(user)(dag_id)} == expected, (switch, dag_id)


def test_status_and_the_view_read_the_ledger_through_pipeline_db_read_when_it_is_defined(stack_env, monkeypatch):
    read_role = json.loads(stack_env["AIRFLOW_CONN_PIPELINE_DB_READ"])
    commit_role = json.loads(stack_env["AIRFLOW_CONN_PIPELINE_DB"])
    monkeypatch.setenv("AIRFLOW_CONN_PIPELINE_DB", json.dumps({**commit_role, "password": "wrong-secret"}))
    with closing(ledger_reader()()) as conn, conn.cursor() as cur:  # the read role, not pipeline_db
        cur.execute("SELECT current_user, count(*) > 0 FROM exactly_once.pipelines")
        assert cur.fetchone() == (read_role["login"], True)
    monkeypatch.setenv("AIRFLOW_CONN_PIPELINE_DB", json.dumps(commit_role))
    monkeypatch.delenv("AIRFLOW_CONN_PIPELINE_DB_READ")
    with closing(ledger_reader()()) as conn, conn.cursor() as cur:  # none defined: pipeline_db
        cur.execute("SELECT current_user")
        assert cur.fetchone() == (commit_role["login"],)
