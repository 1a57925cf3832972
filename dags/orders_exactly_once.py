"""The demo pipeline's DAG, declared in plugins/exactly_once_demo/dag.py. Airflow finds
DAG objects among a DAG file's globals (and parses only files that mention both
"airflow" and "dag"), so this file imports it."""

from exactly_once_demo.dag import ORDERS_EXACTLY_ONCE  # noqa: F401
