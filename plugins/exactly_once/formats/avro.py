"""avro: the column is Avro in the schema registry's wire format — a magic byte 0, the writer
schema's 4-byte id (big-endian), then the Avro binary payload — read into the pipeline's
reader schema (`source.value_reader_schema`/`key_reader_schema`), so records written under
older or newer schemas (a field added with a default, a field removed, a type widened) all
become the same columns.

Decoding runs in the JVM (Spark's `from_avro`, which takes one writer schema): the driver
finds the schema ids among the records, fetches each writer schema once per process (ids
are immutable), and decodes each record with its id's writer schema and the reader schema.
A record whose bytes are not framed so, whose id the registry does not know, whose id is
not an Avro schema, or whose payload does not decode, has that reason. A registry that does
not answer fails the attempt, to be retried: no record is judged by an answer not given.
An id the registry does not know fails a checkpoint's first attempt too, retryable
(`UnknownSchemaIds`): a registry follower may not have a schema its leader just registered;
the retry asks again (unknown ids are never cached), and dead-letters the records of an id
still unknown.
"""

from __future__ import annotations

import json
import urllib.error
from urllib.parse import quote

from exactly_once.errors import ConfigError, PipelineError
from exactly_once.formats._avro_types import mismatches
from exactly_once.problems import Problem

MAGIC_BYTE = "00"            # hex of the first byte
HEADER_BYTES = 5             # the magic byte and the schema id
CANARY = "exactly_once_decoded"  # `with_canary`
# The Confluent API's error codes of a 404 that means "no such thing" (any other 404 is no
# registry API: a wrong URL, which fails the attempt rather than judge records).
SUBJECT_NOT_FOUND, VERSION_NOT_FOUND, SCHEMA_NOT_FOUND = 40401, 40402, 40403
# (registry, id) -> (schema, why not). An unknown id is not kept: a registry replica that
# had not yet seen a new schema knows it by the attempt's retry.
_WRITERS: dict[tuple[str, int], tuple[str | None, str | None]] = {}


class RegistryUnavailable(PipelineError):
    """The schema registry did not answer: a retry may find it back."""


class UnknownSchemaIds(PipelineError):
    """Records carry schema ids the registry does not know, on a checkpoint's first attempt:
    a retry asks again before they are dead letters."""


class Avro:
    needs_registry = True

    def decode(self, records, encoded):
        from pyspark.sql import functions as F
        from pyspark.sql.avro.functions import from_avro

        reader = reader_schema(encoded)
        raw = F.col(encoded.column)
        framed = (F.octet_length(raw) >= HEADER_BYTES) & (F.hex(F.substring(raw, 1, 1)) == MAGIC_BYTE)
        schema_id = F.when(framed, F.conv(F.hex(F.substring(raw, 2, 4)), 16, 10).cast("bigint"))
        payload = F.expr(f"substring({encoded.column}, {HEADER_BYTES + 1})")
        ids = sorted(row[0] for row in records.select(schema_id.alias("id")).where("id IS NOT NULL")
                     .distinct().collect())
        writers = {i: writer_schema(encoded, i) for i in ids}
        unknown = [i for i, (_, why_not) in writers.items() if why_not == unknown_id(i)]
        if unknown and encoded.retry_unknown_ids:
            raise UnknownSchemaIds(unknown_ids_failure(encoded, unknown))

        struct_type = "struct<" + ", ".join(f"`{c}`: {t}" for c, t in encoded.schema.items()) + ">"
        decoded = F.lit(None).cast(struct_type)
        options = {"mode": "PERMISSIVE", "avroSchema": with_canary(reader)}
        for i, (writer, _) in writers.items():
            if writer is not None:
                read = from_avro(payload, writer, options)
                fields = F.struct(*(read.getField(c).alias(c) for c in encoded.schema))
                decoded = F.when((schema_id == i) & read.getField(CANARY).isNotNull(), fields).otherwise(decoded)
        reason = F.when(~framed, F.lit(f"{encoded.column} is not in the schema registry's wire format (magic byte "
                                       f"0 and a 4-byte schema id, then the Avro payload)"))
        for i, (_, why_not) in writers.items():
            if why_not is not None:
                reason = reason.when(schema_id == i, F.lit(f"{encoded.column}: {why_not}"))
        return decoded, lambda fields: reason.when(fields.isNull(), F.format_string(
            f"{encoded.column} does not decode with its writer schema (id %d) into the reader schema", schema_id))

    def problems(self, encoded) -> list[Problem]:
        """The reader schema's: not in the registry, not giving the columns, or (one of the
        registry's) unable to read its subject's latest version, as the subject's
        compatibility rule judges it (BACKWARD: the reader reads what the latest writes)."""
        where = f"source.{encoded.column}_reader_schema"
        try:
            reader = reader_schema(encoded)
            if isinstance(encoded.reader, str):
                return []
            subject = encoded.reader.subject
            answer = encoded.registry.get(f"/compatibility/subjects/{quote(subject, safe='')}/versions/latest",
                                          body={"schema": reader})
        except ConfigError as wrong:
            return [Problem(where, str(wrong))]
        except urllib.error.HTTPError as refused:  # of the compatibility check: the reader itself is there
            return [Problem(where, f"the schema registry answers HTTP {refused.code} to the question whether "
                                   f"{subject!r} version {encoded.reader.version} reads the subject's latest version",
                            passing=refused.code >= 500)]
        except (RegistryUnavailable, OSError) as failed:
            return [Problem(where, f"the schema registry does not answer: {failed}", passing=True)]
        if not answer.get("is_compatible"):
            return [Problem(where, f"subject {subject!r} version {encoded.reader.version} cannot read the subject's "
                                   f"latest version: {'; '.join(answer.get('messages') or [])}")]
        return []


FORMAT = Avro()


def with_canary(reader: str) -> str:
    """The reader schema with one more field, always true when a record decodes: Spark's
    PERMISSIVE mode makes an undecodable payload a row of nulls, which a record whose fields
    are all nullable could be too; the canary's null tells them apart."""
    schema = json.loads(reader)
    return json.dumps({**schema, "fields": [*schema["fields"], {"name": CANARY, "type": "boolean", "default": True}]})


def reader_schema(encoded) -> str:
    """The reader schema's text, checked against the pipeline's columns (ConfigError)."""
    reader = encoded.reader
    if isinstance(reader, str):
        text = reader
    else:
        path = f"/subjects/{quote(reader.subject, safe='')}/versions/{reader.version}"
        text = _asked(encoded, path, f"{encoded.column} reader schema {reader.subject!r} version {reader.version}",
                      (SUBJECT_NOT_FOUND, VERSION_NOT_FOUND))
        if text is None:
            raise ConfigError(f"the schema registry ({encoded.registry.connection!r}) has no subject "
                              f"{reader.subject!r} version {reader.version} (source.{encoded.column}_reader_schema)")
    wrong = mismatches(text, encoded.schema)
    if wrong:
        raise ConfigError(f"source.{encoded.column}_reader_schema does not give source.{encoded.column}_schema's "
                          f"columns: {'; '.join(wrong)}")
    return text


def writer_schema(encoded, schema_id: int) -> tuple[str | None, str | None]:
    """(the Avro schema of `schema_id`, None) or (None, why its records cannot be read)."""
    key = (encoded.registry.url, schema_id)
    if key not in _WRITERS:
        found = _asked(encoded, f"/schemas/ids/{schema_id}", f"schema id {schema_id}", (SCHEMA_NOT_FOUND,),
                       whole=True)
        if found is None:
            return None, unknown_id(schema_id)
        if found.get("schemaType", "AVRO") != "AVRO":
            _WRITERS[key] = (None, f"schema id {schema_id} is a {found['schemaType']} schema, not Avro")
        else:
            _WRITERS[key] = (found["schema"], None)
    return _WRITERS[key]


def unknown_id(schema_id: int) -> str:
    return f"schema id {schema_id} is unknown to the schema registry"


def unknown_ids_failure(encoded, ids: list[int]) -> str:
    reader = encoded.reader
    subject = "" if isinstance(reader, str) or reader is None else f" (reader schema's subject {reader.subject!r})"
    return (f"{encoded.column}: {', '.join(unknown_id(i) for i in ids)} (connection "
            f"{encoded.registry.connection!r}){subject}: a registry follower may not have it yet; the attempt's "
            "retry asks again and dead-letters the records of an id still unknown")


def _asked(encoded, path: str, what: str, missing: tuple[int, ...], whole: bool = False):
    """The registry's answer for `path` (its `schema` unless `whole`), None when it says it has
    none (a 404 with an error code of `missing`); RegistryUnavailable when it does not answer,
    ConfigError when it refuses the login or answers as no registry API."""
    registry = encoded.registry
    try:
        found = registry.get(path)
    except urllib.error.HTTPError as error:
        if error.code == 404 and _error_code(error) in missing:
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


def _error_code(error: urllib.error.HTTPError) -> int | None:
    try:
        return json.loads(error.read()).get("error_code")
    except (ValueError, AttributeError, OSError):
        return None
