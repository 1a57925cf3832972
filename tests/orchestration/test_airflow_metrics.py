"""The pipelines' metrics through Airflow's own metrics, configured for OpenTelemetry
(`[metrics] otel_on`), as a task's process sets them up (`stats.initialize` with Airflow's
factory, as the task runner does), to a real OTLP/HTTP receiver on loopback (issue 40): once
a task of a run ends, the receiver gets every sample of the pipeline's metrics endpoint but
the histogram buckets, as gauges `airflow.exactly_once.*` with the samples' labels as
attributes, and their values are the ledger's and Kafka's."""

from __future__ import annotations

import threading
from contextlib import closing
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg2
import pytest
from airflow.sdk._shared.observability.metrics import stats
from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger
from airflow.sdk._shared.observability.metrics.otel_logger import flush_otel_metrics
from airflow.sdk.observability.metrics import stats_utils
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from exactly_once.kafka_client import KafkaClient
from exactly_once.operate.metrics import read_samples
from exactly_once.orchestration.observed import observed
from tests.ledger.harness import Pipeline, order, workload


class Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP metrics receiver: the gauges' newest values by name and attributes."""

    gauges: dict[tuple[str, tuple], float] = {}

    def do_POST(self):  # noqa: N802 (http.server's name)
        request = ExportMetricsServiceRequest.FromString(self.rfile.read(int(self.headers["Content-Length"])))
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.gauge.data_points:
                        attributes = tuple(sorted((a.key, a.value.string_value) for a in point.attributes))
                        value = point.as_double if point.HasField("as_double") else point.as_int
                        Receiver.gauges[metric.name, attributes] = value
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def otel_metrics(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for option, value in {"OTEL_ON": "True", "OTEL_HOST": "127.0.0.1", "OTEL_PORT": str(server.server_port),
                          "OTEL_INTERVAL_MILLISECONDS": "600000"}.items():
        monkeypatch.setenv(f"AIRFLOW__METRICS__{option}", value)
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
    Receiver.gauges = {}
    try:
        yield Receiver
    finally:
        # The receiver stays up (a daemon thread) for the flush Airflow registers at the process's exit.
        stats.initialize(factory=NoStatsLogger, export_legacy_names=False)


def test_a_tasks_end_sends_the_pipelines_samples_to_airflows_opentelemetry_metrics(
        ledger_db, kafka_servers, topic, otel_metrics):
    pipeline = Pipeline(ledger_db, kafka_servers, topic)
    pipeline.produce(workload(0))
    pipeline.run_once()
    pipeline.produce([(True, [(2, b"apple", order(900, "apple", 1))])])  # not read yet
    kafka = KafkaClient.at(kafka_servers)
    with observed(lambda: pipeline.ledger, None, lambda: kafka, {}):
        pass  # a task's work
    flush_otel_metrics()

    with closing(psycopg2.connect(ledger_db)) as conn:
        expected = {(f"airflow.exactly_once.{s.name.removeprefix('exactly_once_')}", tuple(sorted(s.labels))): s.value
                    for s in read_samples(conn, kafka, datetime.now(timezone.utc), [pipeline.config.name])
                    if not s.name.endswith("_bucket")}
    got = otel_metrics.gauges
    freshness = {k for k in expected if k[0] == "airflow.exactly_once.freshness_seconds"}
    assert len(freshness) == 3 and freshness <= set(got)  # ages: seconds apart, compared by presence
    assert {k: v for k, v in got.items() if k not in freshness} == \
        {k: v for k, v in expected.items() if k not in freshness}
    name = pipeline.config.name
    assert got["airflow.exactly_once.lag_records", (("partition", "2"), ("pipeline", name), ("topic", topic))] == 2
    assert got["airflow.exactly_once.stalled", (("pipeline", name),)] == 0
    assert got["airflow.exactly_once.checkpoint_phase_seconds_count", (("phase", "commit"), ("pipeline", name))] == 1
