"""Where a pipeline's rows live: each sink's final table, its staging table, the dead
letters' staging table, and the contributions an upsert or aggregate sink keeps per
checkpoint (what a reprocessing recomputes from). The one place these names are made.

A ledger table's name is `stg<n>_<pipeline>_<sink>` (`ctb` for contributions), n being the
length of the pipeline's name: without it, pipeline `orders_eu` with sink `totals` and
pipeline `orders` with sink `eu_totals` would share a table. A name that does not fit
PostgreSQL's 63-byte identifiers with its index suffixes is cut and suffixed with a hash of
pipeline and sink, so two sinks never share a table (PostgreSQL would otherwise truncate
both names to the same one, and `CREATE … IF NOT EXISTS` would reuse it).
"""

from __future__ import annotations

import hashlib

from psycopg2 import sql

from exactly_once.config import PipelineConfig, Sink

LEDGER_SCHEMA = "exactly_once"
DEAD_LETTERS = "_dead_letters"  # the dead letters' key among a checkpoint's staged sinks
DEAD_LETTER_STAGING = sql.Identifier(LEDGER_SCHEMA, "staging_dead_letters")
IDENTIFIER_LIMIT = 63           # PostgreSQL's NAMEDATALEN - 1
_INDEX_SUFFIX = "_attempt"
_HASHED = 8                     # hex digits of the hash that keeps cut names apart


def final_table(sink: Sink) -> sql.Identifier:
    return sql.Identifier(*sink.schema_and_table)


def staging_name(pipeline: str, sink: str, prefix: str = "stg") -> str:
    """The staging (or contributions) table's name in LEDGER_SCHEMA of a sink; at most 63
    bytes with its index suffix."""
    return _fitted(f"{prefix}{len(pipeline)}_{pipeline}_{sink}", pipeline, sink)


def _fitted(name: str, pipeline: str, sink: str) -> str:
    """The name, or, where it leaves no room for an index suffix, its start and a hash of
    pipeline and sink."""
    room = IDENTIFIER_LIMIT - len(_INDEX_SUFFIX)
    if len(name) <= room:
        return name
    digest = hashlib.sha256(f"{pipeline}\0{sink}".encode()).hexdigest()[:_HASHED]
    return f"{name[:room - _HASHED - 1]}_{digest}"


def staging_table(config: PipelineConfig, name: str) -> sql.Identifier:
    """The staging table of a sink name, or of DEAD_LETTERS."""
    if name == DEAD_LETTERS:
        return DEAD_LETTER_STAGING
    config.sink(name)  # a name that is no sink of the pipeline fails here, not in SQL
    return sql.Identifier(LEDGER_SCHEMA, staging_name(config.name, name))


def earlier_tables(config: PipelineConfig, sink: Sink) -> tuple[sql.Identifier, sql.Identifier]:
    """A sink's (staging, contributions) tables as the rule before the length prefix named
    them, `stg_<pipeline>_<sink>`, which two pipelines could share: registration moves the
    pipeline's rows out of them. Never names of the current rule (`stg<digits>_…`)."""
    pipeline, name = config.name, sink.name
    return tuple(sql.Identifier(LEDGER_SCHEMA, _fitted(f"{prefix}_{pipeline}_{name}", pipeline, name))
                 for prefix in ("stg", "ctb"))


def staging_index(config: PipelineConfig, sink: Sink) -> sql.Identifier:
    return sql.Identifier(staging_name(config.name, sink.name) + _INDEX_SUFFIX)


def contributions_table(config: PipelineConfig, sink: Sink) -> sql.Identifier:
    """Per checkpoint, what it contributed to an upsert or aggregate sink: the newest row per
    key, or per group the folded measures."""
    return sql.Identifier(LEDGER_SCHEMA, staging_name(config.name, sink.name, "ctb"))


def contributions_indexes(config: PipelineConfig, sink: Sink) -> tuple[sql.Identifier, sql.Identifier]:
    """The indexes of a contributions table: by checkpoint, and by the sink's keys."""
    name = staging_name(config.name, sink.name, "ctb")
    return sql.Identifier(name + _INDEX_SUFFIX), sql.Identifier(name + "_keys")


def tombstones_index(config: PipelineConfig, sink: Sink) -> sql.Identifier:
    """The index of an upsert sink's contributions that are tombstones, by the sink's keys:
    what a merge looks up for each key it puts a row in (sql/merge/upsert.sql). Partial, so a
    key's lookup reads its tombstones only, not every checkpoint's row of it."""
    return sql.Identifier(staging_name(config.name, sink.name, "ctb") + "_tomb")


def staging_tables(config: PipelineConfig) -> dict[str, sql.Identifier]:
    """Every staging table a checkpoint of the pipeline writes, by sink name, dead letters last."""
    return {**{s.name: staging_table(config, s.name) for s in config.sinks},
            DEAD_LETTERS: DEAD_LETTER_STAGING}


def qualified(table: sql.Identifier) -> str:
    """A plain `schema.table` name for the COPY staging writer. Config names are lower-case
    identifiers and hashes are hex, so it needs no quoting."""
    return ".".join(table.strings)
