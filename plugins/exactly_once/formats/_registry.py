"""What the registry formats (avro, protobuf) share: the schema registry's wire format (a
magic byte 0 and the writer schema's 4-byte id, big-endian, before the payload), the ids the
records carry, and the registry's answers. A registry that does not answer fails the attempt,
to be retried (RegistryUnavailable); an id it does not know fails a checkpoint's first attempt,
retryable (UnknownSchemaIds), since a registry follower may not have a schema its leader just
registered; the retry asks again and dead-letters the records of an id still unknown.
"""

from __future__ import annotations

import json
import urllib.error

from exactly_once.errors import ConfigError, PipelineError

MAGIC_BYTE = "00"            # hex of the first byte
ID_BYTES = 4                 # the schema id's, after the magic byte
# The Confluent API's error codes of a 404 that means "no such thing" (any other 404 is no
# registry API: a wrong URL, which fails the attempt rather than judge records).
SUBJECT_NOT_FOUND, VERSION_NOT_FOUND, SCHEMA_NOT_FOUND = 40401, 40402, 40403


class RegistryUnavailable(PipelineError):
    """The schema registry did not answer: a retry may find it back."""


class UnknownSchemaIds(PipelineError):
    """Records carry schema ids the registry does not know, on a checkpoint's first attempt:
    a retry asks again before they are dead letters."""


def schema_ids(records, column: str, id_bytes: int = ID_BYTES):
    """(framed, schema_id, ids) of the records' `column`: whether each value starts with the
    magic byte and an id of `id_bytes`, that id (null if not framed), and the distinct ids found."""
    from pyspark.sql import functions as F

    raw = F.col(column)
    framed = (F.octet_length(raw) >= 1 + id_bytes) & (F.hex(F.substring(raw, 1, 1)) == MAGIC_BYTE)
    if id_bytes == 8:  # an id that is no bigint (its top bit set) frames nothing, as the decoder reads it
        framed = framed & (F.hex(F.substring(raw, 2, 1)) < F.lit("80"))
    schema_id = F.when(framed, F.conv(F.hex(F.substring(raw, 2, id_bytes)), 16, 10).cast("bigint"))
    ids = sorted(row[0] for row in records.select(schema_id.alias("id")).where("id IS NOT NULL").distinct().collect())
    return framed, schema_id, ids


def writer_schema(cache: dict, encoded, schema_id: int, schema_type: str, read, query: str = ""):
    """(what `read` makes of the registry's answer for `schema_id`, None) or (None, why its
    records cannot be read): an id unknown to the registry (never kept in `cache`: a follower
    may learn it), a schema of another type than `schema_type`, or one `read` refuses
    (ValueError). Kept per (registry, id) in `cache`: ids never change."""
    key = (encoded.registry.url, schema_id)
    if key not in cache:
        found = asked(encoded, f"/schemas/ids/{schema_id}{query}", f"schema id {schema_id}", (SCHEMA_NOT_FOUND,),
                      whole=True)
        if found is None:
            return None, unknown_id(schema_id)
        kind = found.get("schemaType", "AVRO")
        if kind != schema_type:
            cache[key] = (None, f"schema id {schema_id} is a {kind} schema, not {schema_type.capitalize()}")
        else:
            try:
                cache[key] = (read(found), None)
            except ValueError as unreadable:
                cache[key] = (None, f"schema id {schema_id} cannot be read: {unreadable}")
    return cache[key]


def unknown_id(schema_id: int) -> str:
    return f"schema id {schema_id} is unknown to the schema registry"


def unknown_ids_failure(encoded, ids: list[int]) -> str:
    reader = encoded.reader
    subject = "" if isinstance(reader, str) or reader is None else f" (reader schema's subject {reader.subject!r})"
    return (f"{encoded.column}: {', '.join(unknown_id(i) for i in ids)} (connection "
            f"{encoded.registry.connection!r}){subject}: a registry follower may not have it yet; the attempt's "
            "retry asks again and dead-letters the records of an id still unknown")


def asked(encoded, path: str, what: str, missing: tuple[int, ...], whole: bool = False):
    """The registry's answer for `path` (its `schema` unless `whole`), None when it says it has
    none (a 404 with an error code of `missing`); RegistryUnavailable when it does not answer,
    ConfigError when it refuses the login or answers as no registry API."""
    registry = encoded.registry
    try:
        found = registry.get(path)
    except urllib.error.HTTPError as error:
        if error.code == 404 and error_code(error) in missing:
            return None
        if error.code == 404:
            raise ConfigError(f"connection {registry.connection!r}: the schema registry answers HTTP 404 without "
                              f"a registry's error code asked for {what}: is its url the Confluent-compatible "
                              "API's root?") from None
        if error.code in (401, 403):
            raise ConfigError(f"connection {registry.connection!r}: the schema registry refuses its login "
                              f"(HTTP {error.code}) asked for {what}") from None
        raise RegistryUnavailable(f"connection {registry.connection!r}: the schema registry answers HTTP "
                                  f"{error.code} asked for {what}") from None
    except OSError as error:  # URLError, a refused connection, a timeout
        raise RegistryUnavailable(f"connection {registry.connection!r}: the schema registry does not answer "
                                  f"asked for {what}: {getattr(error, 'reason', error)}") from None
    return found if whole else found["schema"]


def error_code(error: urllib.error.HTTPError) -> int | None:
    try:
        return json.loads(error.read()).get("error_code")
    except (ValueError, AttributeError, OSError):
        return None
