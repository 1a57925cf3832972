"""The demo pipeline's DAG `orders_exactly_once`: orders from Kafka into three PostgreSQL
tables, exactly once, one checkpoint per 10-minute interval. dags/orders_exactly_once.py
imports it, so Airflow finds it there."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DeltaDataIntervalTimetable, dag

from exactly_once.orchestration.checkpoint_tasks import checkpoint_tasks
from exactly_once_demo.pipeline import CONFIG


# A timedelta alone gives point intervals in Airflow 3; the pipeline plans up to the interval's end.
@dag(schedule=DeltaDataIntervalTimetable(timedelta(minutes=10)), start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
     max_active_runs=3, tags=["exactly-once", "demo"])
def orders_exactly_once():
    checkpoint_tasks(CONFIG)


# A module-level DAG object: a DAG file that imports it gets it among its globals, where
# Airflow looks (auto-registration only sees DAGs built while that file itself runs).
ORDERS_EXACTLY_ONCE = orders_exactly_once()
