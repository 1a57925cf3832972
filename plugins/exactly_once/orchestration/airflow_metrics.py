"""The pipelines' metrics through Airflow's own metrics, where they are configured
(`[metrics] otel_on`, `statsd_on` or `statsd_datadog_enabled`): the samples of the metrics
endpoint (exactly_once.operate.metrics) of the task's pipeline, as gauges named
`exactly_once.<metric>` (`airflow.exactly_once.<metric>` under OpenTelemetry's prefix) with
the samples' labels as tags (OpenTelemetry's attributes, Datadog's tags). Histogram buckets
are left out; their `_sum` and `_count` are sent. A plain StatsD keeps no tags: use the
Prometheus endpoint there.
"""

from __future__ import annotations

from contextlib import closing
from datetime import datetime, timezone

from airflow.sdk.configuration import conf
from airflow.sdk.observability.stats import Stats

from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.protocol import Ledger
from exactly_once.operate.metrics import read_samples

PREFIX = "exactly_once."


def configured() -> bool:
    """Whether Airflow sends metrics anywhere."""
    return any(conf.getboolean("metrics", option, fallback=False)
               for option in ("otel_on", "statsd_on", "statsd_datadog_enabled"))


def send(ledger: Ledger, kafka: KafkaClient | None) -> int:
    """Sends the pipeline's samples; returns how many."""
    with closing(ledger.connect()) as conn:
        samples = read_samples(conn, kafka, datetime.now(timezone.utc), [ledger.config.name])
    sent = [s for s in samples if not s.name.endswith("_bucket")]
    for sample in sent:
        Stats.gauge(PREFIX + sample.name.removeprefix("exactly_once_"), sample.value, tags=dict(sample.labels))
    return len(sent)
