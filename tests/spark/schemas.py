"""A schema of its own for a test of the COPY writer, whose Spark tasks connect on their own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager

import psycopg2


@contextmanager
def committed_schema(db_url: str, prefix: str, *statements: str) -> Iterator[tuple]:
    """A new schema named `prefix`_…, `statements` (each formatted with {schema}) run and
    committed in it; yields a cursor of that connection and the schema's name, and drops the
    schema at the end."""
    schema = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with closing(psycopg2.connect(db_url)) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE SCHEMA {schema}")
        for statement in statements:
            cur.execute(statement.format(schema=schema))
        conn.commit()
        try:
            yield cur, schema
        finally:
            conn.rollback()
            cur.execute(f"DROP SCHEMA {schema} CASCADE")
            conn.commit()
