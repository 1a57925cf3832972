"""The plugin, for the local stack's Airflow, which runs the library from this checkout's
plugins/ folder rather than from an installed wheel (whose `airflow.plugins` entry point
registers the same class)."""

from exactly_once.orchestration.plugin import ExactlyOncePlugin

__all__ = ["ExactlyOncePlugin"]
