"""Whether each pipeline database connection holds the rights of its duty, and no more
(README, "Roles by duty"; the grants are sql/migrations/0011_roles_by_duty.sql's, 0014's and 0015's):

- `pipeline_db`, the commit role (the tasks): reads and writes the ledger and the final tables;
- `pipeline_db_job`, the job role (the Spark job): reads where attempts stand in the ledger,
  inserts into staging, runs the ledger's three functions (`discard_staged`, `settle_staged`,
  `trial_promote`); nothing on a final table, no write to the ledger, no SELECT, UPDATE,
  DELETE or TRUNCATE of staging (migration 0014 took back its SELECT);
- `pipeline_db_read`, the read role (status, the pipelines view), where it is defined: reads
  the ledger; nothing on staging or a final table.

Each right missing or too much is a problem naming the connection, the table and the
privilege. A table that does not exist yet (staging before the first registration) is not asked about.

Neither the job role nor the read role may create objects where the ledger's code resolves
names — `public`, the ledger's schema, the final tables' schemas, the commit role's search
path — nor schemas in the database (one named after the commit role would come first in its
search path): a function, operator or view made there could be found by a statement the
ledger's owner runs, and run with its rights (issue 60; the definers' own search path is
pinned, sql/migrations/0018_definers_pinned_search_path.sql). Each is named with its REVOKE.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass

import psycopg2
from psycopg2 import sql

from exactly_once.config import PipelineConfig
from exactly_once.ledger.tables import LEDGER_SCHEMA, contributions_table, final_table, staging_tables
from exactly_once.problems import PreflightFailed, Problem
from exactly_once.sqlfiles import named

Q = named("privileges.sql")
# What opens a connection by its Airflow connection id (None when it is not defined).
Table = tuple[str, str]  # (schema, name)
ConnectAs = Callable[[str], "Callable[[], object] | None"]

WRITES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE")
# The ledger's tables the job reads: its attempt's configuration, checkpoint and ranges, why
# attempts were sent back, the ranges an operator dead-lettered.
JOB_READS = ("config_versions", "checkpoints", "checkpoint_ranges", "attempts", "operator_actions")
# The ledger's tables status and the pipelines view read; the commit role writes these and
# the attempts' trial promotions.
LEDGER = (*JOB_READS, "pipelines", "committed_ranges", "partitions", "gaps", "preflights", "dead_letters")
WRITTEN_BY_COMMIT = (*LEDGER, "trial_promotions")
JOB_FUNCTIONS = (f"{LEDGER_SCHEMA}.discard_staged(regclass, bigint, integer, text)",
                 f"{LEDGER_SCHEMA}.settle_staged(regclass, bigint, integer, text, bigint[], bigint)",
                 f"{LEDGER_SCHEMA}.trial_promote(bigint, integer, text[], text)")


@dataclass(frozen=True)
class Duty:
    """The rights a connection's duty needs and those it must not hold, as (table, privilege)."""

    what: str
    needs: tuple[tuple[Table, str], ...]
    refuses: tuple[tuple[Table, str], ...]
    functions: tuple[str, ...] = ()
    schemas: tuple[str, ...] = ()  # needs USAGE: the job role resolves final tables' names
    may_be_superuser: bool = False
    # Where it must not create objects (with the commit role's search path, found at the check).
    creates_nowhere: tuple[str, ...] = ()


def duties(config: PipelineConfig) -> dict[str, Duty]:
    """Each connection's duty for this pipeline's tables, by connection id."""
    from exactly_once.connections import PIPELINE_DB, PIPELINE_DB_JOB, PIPELINE_DB_READ

    final = [_parts(final_table(sink)) for sink in config.sinks]
    staging = [_parts(table) for table in staging_tables(config).values()]
    contributions = [_parts(contributions_table(config, sink)) for sink in config.sinks]
    ledger = [(LEDGER_SCHEMA, name) for name in LEDGER]
    written = [(LEDGER_SCHEMA, name) for name in WRITTEN_BY_COMMIT]
    job_reads = [(LEDGER_SCHEMA, name) for name in JOB_READS]
    resolved = tuple(dict.fromkeys(("public", LEDGER_SCHEMA, *(schema for schema, _ in final))))
    return {
        PIPELINE_DB: Duty("the commit role", _each(final, ("SELECT", "INSERT", "UPDATE", "DELETE"))
                          + _each(written, ("SELECT", "INSERT", "UPDATE", "DELETE")), (), may_be_superuser=True),
        PIPELINE_DB_JOB: Duty("the job role", _each(job_reads, ("SELECT",)) + _each(staging, ("INSERT",)),
                              _each(final, ("SELECT", *WRITES)) + _each(written, WRITES)
                              + _each(staging, ("SELECT", "UPDATE", "DELETE", "TRUNCATE"))
                              + _each(contributions, ("SELECT", *WRITES)),
                              JOB_FUNCTIONS, tuple(dict.fromkeys(schema for schema, _ in final)),
                              creates_nowhere=resolved),
        PIPELINE_DB_READ: Duty("the read role", _each(ledger, ("SELECT",)),
                               _each(final, ("SELECT", *WRITES)) + _each(written, WRITES)
                               + _each(staging, ("SELECT", *WRITES)) + _each(contributions, ("SELECT", *WRITES)),
                               creates_nowhere=resolved),
    }


def _parts(table: sql.Identifier) -> Table:
    schema, name = table.strings
    return schema, name


def _each(tables: list[Table], privileges: tuple[str, ...]) -> tuple[tuple[Table, str], ...]:
    return tuple((table, privilege) for table in tables for privilege in privileges)


def require(config: PipelineConfig, connect_as: ConnectAs) -> None:
    """PreflightFailed naming every right missing or too much."""
    found = problems(config, connect_as)
    if found:
        raise PreflightFailed(config.name, found)


def problems(config: PipelineConfig, connect_as: ConnectAs) -> list[Problem]:
    """Every right missing or too much, of each connection `connect_as(connection id)` opens
    (None for a connection that is not defined, which `connection_problems` reports)."""
    from exactly_once.connections import PIPELINE_DB

    found, commit_role, search_path = [], None, ()
    for conn_id, duty in duties(config).items():
        connect = connect_as(conn_id)
        if connect is None:
            continue
        try:
            conn = connect()
        except psycopg2.OperationalError:
            continue  # a connection that cannot log in: `connection_problems` says why
        with closing(conn), conn, conn.cursor() as cur:
            if conn_id == PIPELINE_DB:
                cur.execute(Q["current_user"])
                commit_role = cur.fetchone()[0]
                cur.execute(Q["search_path"])
                search_path = tuple(cur.fetchone()[0])
            found += duty_problems(cur, conn_id, duty, commit_role, search_path)
    return found


def duty_problems(cur, conn_id: str, duty: Duty, commit_role: str | None = None,
                  search_path: tuple[str, ...] = ()) -> list[Problem]:
    subject = f"connection {conn_id!r}"
    if not duty.may_be_superuser:
        cur.execute(Q["powers"])
        powers = [power for power, in cur.fetchall()]
        if powers:
            return [Problem(subject, f"{duty.what} {', and '.join(powers)}: it must hold its grants and no more")]
    asked = (*duty.needs, *duty.refuses)
    cur.execute(Q["table_rights"], {"schemas": [t[0] for t, _ in asked], "tables": [t[1] for t, _ in asked],
                                    "privileges": [p for _, p in asked]})
    found = cur.fetchall()
    held = {((schema, table), privilege): on_table for schema, table, privilege, on_table, _ in found}
    held_anyhow = {((schema, table), privilege): on_any for schema, table, privilege, _, on_any in found}
    missing = [f"{p} on {_named(t)}" for t, p in duty.needs if held.get((t, p)) is False]
    too_much = [f"{p} on {_named(t)}" for t, p in duty.refuses if held_anyhow.get((t, p)) is True]
    cur.execute(Q["function_rights"], {"names": list(duty.functions)})
    runs = dict(cur.fetchall())
    missing += [f"EXECUTE on {f}" for f in duty.functions if runs.get(f) is not True]
    cur.execute(Q["schema_rights"], {"schemas": list(duty.schemas), "commit_role": commit_role})
    usable = dict(cur.fetchall())
    missing += [f"USAGE on schema {schema} (GRANT USAGE ON SCHEMA {_quoted(schema)} TO exactly_once_job)"
                for schema in duty.schemas if usable.get(schema) is False]
    found = []
    if missing:
        found.append(Problem(subject, f"{duty.what} lacks " + ", ".join(missing)))
    if too_much:
        found.append(Problem(subject, f"{duty.what} must not hold " + ", ".join(too_much)))
    if duty.creates_nowhere:
        found += create_problems(cur, subject, duty, (*duty.creates_nowhere, *search_path), commit_role)
    return found


def create_problems(cur, subject: str, duty: Duty, schemas: tuple[str, ...], commit_role: str | None
                    ) -> list[Problem]:
    """Each schema of `schemas` the connection's role may create objects in, and the database
    if it may create schemas, with how it holds the right and the statement that takes it back."""
    schemas = tuple(dict.fromkeys(schemas))
    cur.execute(Q["create_rights"], {"schemas": list(schemas)})
    ways: dict[str | None, list[tuple[str, bool]]] = {}
    for schema, through, is_owner in cur.fetchall():
        ways.setdefault(schema, []).append((through, is_owner))
    if not ways:
        return []
    cur.execute(Q["role_and_database"])
    role, database = cur.fetchone()
    owner_to = _quoted(commit_role) if commit_role else "<the commit role>"
    found = []
    for schema in (*(s for s in schemas if s in ways), *((None,) if None in ways else ())):
        granted = [through for through, is_owner in ways[schema] if not is_owner]
        owners = [through for through, is_owner in ways[schema] if is_owner]
        how = "; ".join([f"granted to {' and '.join(granted)}"] * bool(granted)
                        + [f"owned by {owner}" + ("" if owner == _quoted(role) else ", whose member it is")
                           for owner in owners])
        on = f"DATABASE {_quoted(database)}" if schema is None else f"SCHEMA {_quoted(schema)}"
        fix = [f"REVOKE CREATE ON {on} FROM {through}" for through in granted]
        fix += [f"ALTER {on} OWNER TO {owner_to}" for _ in owners]
        if schema is None:
            what = (f"{duty.what} {role} may create schemas in database {database} ({how}): one named after "
                    "the commit role would come first in the commit role's search path")
        else:
            what = (f"{duty.what} {role} may create objects in schema {schema} ({how}), where the ledger's code "
                    "resolves names: what it makes there could run with the rights of the ledger's owner")
        found.append(Problem(subject, what, "; ".join(fix)))
    return found


def _quoted(name: str) -> str:
    """An identifier as SQL takes it: quoted unless it is a plain lower-case name."""
    return name if re.fullmatch(r"[a-z_][a-z0-9_]*", name) else '"' + name.replace('"', '""') + '"'


def _named(table: Table) -> str:
    return ".".join(table)
