"""What each task of a pipeline run does once its work ends, whether it failed or not:
Airflow's metrics get the pipeline's samples (exactly_once.orchestration.airflow_metrics,
where Airflow's metrics are configured), and the notifier the pending alerts
(exactly_once.orchestration.alerting, where the DAG gave `alerts`). Neither changes the
task's outcome: a failure of theirs is logged, and the next task sends again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from exactly_once.kafka_client import KafkaClient
from exactly_once.ledger.protocol import Ledger
from exactly_once.orchestration import airflow_metrics, alerting

log = logging.getLogger(__name__)


@contextmanager
def observed(ledger: Callable[[], Ledger], alerts: alerting.Alerts | None, kafka: Callable[[], KafkaClient],
             context: Mapping) -> Iterator[None]:
    try:
        yield
    finally:
        if airflow_metrics.configured():
            _logged("Airflow's metrics", lambda: airflow_metrics.send(ledger(), kafka()))
        if alerts is not None:
            _logged("alerts", lambda: alerting.send_new(ledger(), alerts, kafka, context))


def _logged(what: str, send: Callable[[], object]) -> None:
    try:
        send()
    except Exception:
        log.exception("%s not sent; the pipeline's next task sends them again", what)
