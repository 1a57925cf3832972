"""Issue 60, item 4: names the ledger's owner resolves cannot be planted by the job role.

Where the job role may CREATE in `public` (PostgreSQL <= 14's default, or a database
upgraded from one), a function or view it made there used to run with the ledger owner's
rights: `public.hashtextextended(text, integer)` beats `pg_catalog.hashtextextended(text,
bigint)` for `hashtextextended(…, 0)` (an exact match wins over a cast), so it ran at the next
begin (`lock_pipeline`, in the commit role's session) and in every commit of an upsert sink
with tombstones; and `trial_promote`, a SECURITY DEFINER function whose search path was
`"$user", public, pg_temp`, read a view `public.newest_staged` before the temporary table its
statement had just made. Every definer now runs with `search_path = pg_catalog, pg_temp` and
names what it uses by its schema (migration 0018), the statements the ledger runs name
`pg_catalog.`'s functions and `pg_temp.`'s tables, and the preflight refuses a job or read
role that may CREATE where the ledger's code resolves names.

The test grants what PostgreSQL 14 granted (`GRANT CREATE ON SCHEMA public TO PUBLIC`) on the
local stack's pipeline database and takes it back, with what the job role planted, after
(the stack's server admits its roles to that database only). Real Kafka, real PostgreSQL;
the test stages the rows as the job role, as the Spark job does, and drives begin,
start_attempt, the job's trial promotion, pre-commit and commit.
"""

from __future__ import annotations

from contextlib import closing

import psycopg2
import pytest
from psycopg2 import sql
from psycopg2.extras import execute_values

from exactly_once.connections import PIPELINE_DB, PIPELINE_DB_JOB, PIPELINE_DB_READ, pipeline_db_url
from exactly_once.kafka_columns import KAFKA_TOMBSTONE
from exactly_once.ledger import trials
from exactly_once.ledger.checkpoints import Outcome
from exactly_once.ledger.protocol import Ledger
from exactly_once.ledger.tables import DEAD_LETTERS, staging_table
from exactly_once.operate import privileges
from exactly_once_stack.postgres import connect_admin
from tests.ledger.harness import query
from tests.ledger.test_tombstones import GONE, Upserts, expected, staged_row

# What the job role plants: each shadow calls `public.planted(what)`, which records who ran it
# (a row, undone with a rolled-back trial; and a sequence, never undone) and, run by anyone
# but the job role, gives every role the key the attempts' tokens are derived from. The
# hashtextextended shadow does so only for the test's pipeline (PIPELINE): other sessions of
# the shared database may call it meanwhile.
PLANTS = """
CREATE TABLE public.planted (who text NOT NULL, what text NOT NULL);
CREATE SEQUENCE public.planted_runs;
GRANT INSERT, SELECT ON public.planted TO PUBLIC;
GRANT USAGE, UPDATE ON SEQUENCE public.planted_runs TO PUBLIC;
CREATE FUNCTION public.planted(what text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.planted (who, what) VALUES (current_user, what);
    PERFORM pg_catalog.nextval('public.planted_runs');
    IF current_user <> 'pipeline_job' THEN
        BEGIN
            GRANT SELECT ON exactly_once.job_key TO PUBLIC;
        EXCEPTION WHEN OTHERS THEN NULL;
        END;
    END IF;
    RETURN false;
END $$;
GRANT EXECUTE ON FUNCTION public.planted(text) TO PUBLIC;
-- lock_pipeline, lock_commits and merge_with_tombstones call hashtextextended(text, 0).
CREATE FUNCTION public.hashtextextended(text, integer) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    IF pg_catalog.strpos($1, 'PIPELINE') > 0 THEN
        PERFORM public.planted('hashtextextended');
    END IF;
    RETURN pg_catalog.hashtextextended($1, $2::bigint);
END $$;
-- merge_with_tombstones reads newest_staged, the temporary table it made.
CREATE VIEW public.newest_staged AS
SELECT NULL::text AS k, NULL::bigint AS n, NULL::int AS kafka_partition, NULL::bigint AS kafka_offset,
       p.ran AS kafka_tombstone
FROM (SELECT public.planted('newest_staged') AS ran) p  -- volatile: the planner cannot fold it away
WHERE p.ran;
GRANT SELECT ON public.newest_staged TO PUBLIC;
"""
UNPLANT = """
REVOKE SELECT ON exactly_once.job_key FROM PUBLIC;
DROP VIEW IF EXISTS public.newest_staged;
DROP FUNCTION IF EXISTS public.hashtextextended(text, integer);
DROP FUNCTION IF EXISTS public.planted(text);
DROP SEQUENCE IF EXISTS public.planted_runs;
DROP TABLE IF EXISTS public.planted;
"""


@pytest.fixture
def urls(ledger_db) -> dict[str, str]:
    """The three connections' URLs, by Airflow connection id."""
    return {conn_id: pipeline_db_url(conn_id) for conn_id in (PIPELINE_DB, PIPELINE_DB_JOB, PIPELINE_DB_READ)}


def _as_admin(statement: str) -> None:
    with closing(connect_admin("pipeline")) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(statement)


def _said(config, urls) -> list[str]:
    connect_as = {conn_id: (lambda url=url: psycopg2.connect(url)) for conn_id, url in urls.items()}.get
    return [f"{p.subject}: {p.message} (fix: {p.fix})" for p in privileges.problems(config, connect_as)]


def test_what_the_job_role_plants_in_public_never_runs_as_the_ledgers_owner(urls, kafka_servers, topic):
    job_url = urls[PIPELINE_DB_JOB]
    _as_admin("GRANT CREATE ON SCHEMA public TO PUBLIC")  # as PostgreSQL 14 had it
    try:
        upserts = Upserts(urls[PIPELINE_DB], kafka_servers, topic)
        config, sink = upserts.pipeline.config, upserts.sink
        query(job_url, PLANTS.replace("PIPELINE", config.name))

        # begin: lock_pipeline, registration, planning (the commit role's session).
        checkpoint_id = upserts.plan([("apple", 1), ("pear", 2), ("apple", GONE), ("fig", 3)])
        checkpoint = upserts.ledger.start_attempt(checkpoint_id)
        attempt, staged = checkpoint.attempt, upserts.read[checkpoint_id]
        token = upserts.ledger.attempt_token(checkpoint_id, attempt)

        # The job: stages as the job role, then tries the promotion through trial_promote.
        columns = ["k", "n", "kafka_partition", "kafka_offset", KAFKA_TOMBSTONE, "checkpoint_id", "attempt"]
        with closing(psycopg2.connect(job_url)) as conn, conn, conn.cursor() as cur:
            statement = sql.SQL("INSERT INTO {} ({}) VALUES %s").format(
                staging_table(config, sink.name), sql.SQL(", ").join(map(sql.Identifier, columns)))
            execute_values(cur, statement.as_string(cur),
                           [(*staged_row(r), checkpoint_id, attempt) for r in staged])
        job = Ledger.of_attempt(config.name, checkpoint_id, attempt, lambda: psycopg2.connect(job_url))
        with job.rows() as rows:
            refused = trials.promote(rows, checkpoint_id, attempt, [sink.name], token)

        # The task pre-commits, and the commit promotes (the commit role's session again).
        upserts.ledger.pre_commit(checkpoint_id, attempt, {sink.name: len(staged), DEAD_LETTERS: 0},
                                  records=len(staged))
        outcome = upserts.ledger.commit(checkpoint_id)

        ran = query(job_url, "SELECT who, what FROM public.planted ORDER BY what, who")
        [(runs,)] = query(job_url, "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM public.planted_runs")
        [(key_readable,)] = query(urls[PIPELINE_DB], "SELECT has_table_privilege('pipeline_job', "
                                                     "'exactly_once.job_key', 'SELECT')")
        print(f"planted ran: {ran}, {runs} time(s) in all (rolled-back trials included); "
              f"job role reads the job key: {key_readable}")
        assert (ran, runs, key_readable) == ([], 0, False)
        assert refused is None
        assert outcome is Outcome.COMMITTED
        assert upserts.table() == expected(staged) and set(upserts.table()) == {"pear", "fig"}

        # The preflight names the right that let the job role plant, with the REVOKE.
        fix = "REVOKE CREATE ON SCHEMA public FROM PUBLIC"
        said = _said(config, urls)
        print("preflight said:", *said, sep="\n  ")
        assert [s for s in said if "CREATE" in s] == [
            f"connection 'pipeline_db_job': the job role pipeline_job may create objects in schema public "
            f"(granted to PUBLIC), where the ledger's code resolves names: what it makes there could run with "
            f"the rights of the ledger's owner (fix: {fix})",
            f"connection 'pipeline_db_read': the read role pipeline_read may create objects in schema public "
            f"(granted to PUBLIC), where the ledger's code resolves names: what it makes there could run with "
            f"the rights of the ledger's owner (fix: {fix})",
        ]
        _as_admin(fix)
        assert _said(config, urls) == []
    finally:
        _as_admin("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        _as_admin(UNPLANT)


def test_the_preflight_names_a_create_right_on_a_final_tables_schema_and_on_the_database(urls, kafka_servers, topic):
    upserts = Upserts(urls[PIPELINE_DB], kafka_servers, topic)
    config = upserts.pipeline.config
    upserts.ledger.register()
    schema = upserts.sink.table.split(".")[0]
    assert _said(config, urls) == []
    _as_admin(f"GRANT CREATE ON SCHEMA {schema} TO exactly_once_job")
    try:
        assert _said(config, urls) == [
            f"connection 'pipeline_db_job': the job role pipeline_job may create objects in schema {schema} "
            f"(granted to exactly_once_job), where the ledger's code resolves names: what it makes there could run "
            f"with the rights of the ledger's owner (fix: REVOKE CREATE ON SCHEMA {schema} FROM exactly_once_job)"]
    finally:
        _as_admin(f"REVOKE CREATE ON SCHEMA {schema} FROM exactly_once_job")
    _as_admin("GRANT CREATE ON DATABASE pipeline TO exactly_once_read")
    try:
        assert _said(config, urls) == [
            "connection 'pipeline_db_read': the read role pipeline_read may create schemas in database pipeline "
            "(granted to exactly_once_read): one named after the commit role would come first in the commit role's "
            "search path (fix: REVOKE CREATE ON DATABASE pipeline FROM exactly_once_read)"]
    finally:
        _as_admin("REVOKE CREATE ON DATABASE pipeline FROM exactly_once_read")
