"""Connections to the pipeline database; credentials come from the environment."""

from __future__ import annotations

import os

import psycopg2

URL_VARIABLE = "PIPELINE_DB_URL"


def connect():
    url = os.environ.get(URL_VARIABLE)
    if not url:
        raise RuntimeError(f"{URL_VARIABLE} is not set: it must hold a libpq URI of the pipeline database "
                           "(`source .local/env.sh` for the local stack)")
    return psycopg2.connect(url)
