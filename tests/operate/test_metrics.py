"""The metrics' exposition and the alert rules, checked by Prometheus's own promtool
(Debian's prometheus package): a scrape of real pipelines (one committed with dead letters,
one stalled on its dead-letter budget, records not read yet) passes `promtool check metrics`
(format and naming conventions) with the figures the ledger holds; the alert rules fire when
and as `deploy/prometheus/alerts_test.yml` says, and the docs show the rules as they are.
What Prometheus itself scrapes from the api-server is tests/dags/test_pipelines_view.py's."""

from __future__ import annotations

import subprocess
from contextlib import closing
from datetime import datetime, timezone

import psycopg2
import pytest

from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.refusals import Stalled
from exactly_once.operate.metrics import PHASE_BOUNDS, Sample, histogram, exposition, read_samples
from exactly_once.orchestration import tasks
from exactly_once_stack.settings import ROOT
from tests.kafka_records import create_topic
from tests.ledger.harness import Pipeline, order, workload

RULES = ROOT / "deploy" / "prometheus"


def test_the_alert_rules_fire_as_their_unit_tests_say_and_the_docs_show_them_as_they_are():
    tested = subprocess.run(["promtool", "test", "rules", "alerts_test.yml"], cwd=RULES, capture_output=True,
                            text=True, timeout=120)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    rules = (RULES / "alerts.yml").read_text()
    assert rules.strip() in (ROOT / "docs" / "operate" / "monitoring.md").read_text()


def test_a_scrape_of_real_pipelines_passes_promtools_lint_with_the_ledgers_figures(ledger_db, kafka_servers, topic):
    committed = Pipeline(ledger_db, kafka_servers, topic)
    committed.produce(workload(0))
    committed.run_once()
    committed.produce([(True, [(0, b"apple", order(900, "apple", 1))])])  # not read yet
    create_topic(kafka_servers, f"{topic}_2", partitions=3)
    stalled = Pipeline(ledger_db, kafka_servers, f"{topic}_2")
    stalled.produce([(True, [(i % 3, b"k", b"<order/>") for i in range(20)])])
    checkpoint_id = stalled.begin().checkpoint.id
    stalled.driver.run(checkpoint_id)
    with pytest.raises(Stalled, match="dead-letter budget exceeded"):
        tasks.commit_checkpoint(stalled.ledger, checkpoint_id, 1)

    names = [committed.config.name, stalled.config.name]
    with closing(psycopg2.connect(ledger_db)) as conn:
        text = exposition(read_samples(conn, KafkaClient.at(kafka_servers), datetime.now(timezone.utc), names))
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0 and lint.stdout + lint.stderr == "", lint.stdout + lint.stderr

    lines = set(text.splitlines())
    one, two = (f'pipeline="{name}"' for name in names)
    assert f"exactly_once_stalled{{{one}}} 0" in lines and f"exactly_once_stalled{{{two}}} 1" in lines
    assert f"exactly_once_dead_letter_budget_exceeded{{{two}}} 1" in lines
    assert f'exactly_once_open_checkpoints{{{two},state="stalled"}} 1' in lines
    assert f"exactly_once_last_checkpoint_dead_letters{{{one}}} 2" in lines  # the workload's two malformed values
    # The protocol's driver gives its dead letters one reason of its own (the Spark job's are classed in
    # tests/dags/test_pipelines_view.py).
    assert f'exactly_once_dead_letters{{{one},reason_class="other"}} 2' in lines
    assert f'exactly_once_lag_records{{{one},topic="{topic}",partition="0"}} 2' in lines  # the order and its marker
    fresh = [line for line in lines if line.startswith(f'exactly_once_freshness_seconds{{{one},topic="{topic}"')]
    assert len(fresh) == 3 and sum(float(line.split()[-1]) > 0 for line in fresh) == 1
    assert f'exactly_once_checkpoint_phase_seconds_count{{{one},phase="commit"}} 1' in lines
    assert f'exactly_once_attempts{{{one},state="committed"}} 1' in lines


def test_label_values_are_escaped_and_a_histogram_has_every_bound_then_inf_equal_to_its_count():
    text = exposition([Sample("exactly_once_stalled", (("pipeline", 'a"b\\c\nd'),), 1),
                       *histogram("p", "commit", list(range(len(PHASE_BOUNDS))), 12, 1.5)])
    lines = text.splitlines()
    assert 'exactly_once_stalled{pipeline="a\\"b\\\\c\\nd"} 1' in lines
    buckets = [line for line in lines if line.startswith("exactly_once_checkpoint_phase_seconds_bucket")]
    assert [line.split('le="')[1].split('"')[0] for line in buckets] == [*map(str, PHASE_BOUNDS), "+Inf"]
    assert [int(line.split()[-1]) for line in buckets] == [*range(len(PHASE_BOUNDS)), 12]
    assert 'exactly_once_checkpoint_phase_seconds_sum{pipeline="p",phase="commit"} 1.5' in lines
    assert 'exactly_once_checkpoint_phase_seconds_count{pipeline="p",phase="commit"} 12' in lines
