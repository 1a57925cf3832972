"""The demo pipeline: orders from Kafka into three PostgreSQL tables, exactly once,
one checkpoint per 10-minute interval."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DeltaDataIntervalTimetable, dag
from demo.orders import CONFIG
from exactly_once.airflow_tasks import checkpoint_tasks


# A timedelta alone gives point intervals in Airflow 3; the pipeline plans up to the interval's end.
@dag(schedule=DeltaDataIntervalTimetable(timedelta(minutes=10)), start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
     max_active_runs=3, tags=["exactly-once", "demo"])
def orders_exactly_once():
    checkpoint_tasks(CONFIG)


orders_exactly_once()
