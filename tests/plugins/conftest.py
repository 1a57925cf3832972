from __future__ import annotations

from contextlib import closing

import psycopg2
import pytest

from exactly_once.migrate import migrate


@pytest.fixture(scope="session")
def ledger_db(pipeline_db_url) -> str:
    """The pipeline database with the ledger schema migrated."""
    with closing(psycopg2.connect(pipeline_db_url)) as conn:
        migrate(conn)
    return pipeline_db_url


@pytest.fixture
def connect(ledger_db):
    return lambda: psycopg2.connect(ledger_db)
