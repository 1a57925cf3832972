"""Connections to the pipeline database; credentials come from the environment."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import psycopg2

URL_VARIABLE = "PIPELINE_DB_URL"


def url() -> str:
    found = os.environ.get(URL_VARIABLE)
    if not found:
        raise RuntimeError(f"{URL_VARIABLE} is not set: it must hold a libpq URI of the pipeline database "
                           "(`source .local/env.sh` for the local stack)")
    return found


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
