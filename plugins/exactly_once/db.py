"""Connections to the pipeline database; credentials come from the environment."""

from __future__ import annotations

from urllib.parse import urlsplit

import psycopg2

from exactly_once.settings import required

URL_VARIABLE = "PIPELINE_DB_URL"


def url() -> str:
    return required(URL_VARIABLE, "a libpq URI of the pipeline database")


def connect():
    return psycopg2.connect(url())


def jdbc_options(libpq_url: str) -> dict[str, str]:
    """Spark JDBC options for the database of a libpq URI. Batched inserts are rewritten
    into multi-row INSERTs by the driver: ~3x faster staging writes."""
    parts = urlsplit(libpq_url)
    return {
        "url": f"jdbc:postgresql://{parts.hostname}:{parts.port or 5432}{parts.path}?reWriteBatchedInserts=true",
        "user": parts.username or "",
        "password": parts.password or "",
        "driver": "org.postgresql.Driver",
    }
