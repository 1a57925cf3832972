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

from exactly_once.errors import ConfigError
from exactly_once.formats._avro_types import mismatches
from exactly_once.formats._registry import (ID_BYTES, SUBJECT_NOT_FOUND, VERSION_NOT_FOUND, RegistryUnavailable,
                                            UnknownSchemaIds, asked, schema_ids, unknown_id, unknown_ids_failure)
from exactly_once.formats._registry import writer_schema as registry_writer
from exactly_once.problems import Problem
CANARY = "exactly_once_decoded"  # `with_canary`
# (registry, id) -> (schema, why not). An unknown id is not kept: a registry replica that
# had not yet seen a new schema knows it by the attempt's retry.
_WRITERS: dict[tuple[str, int], tuple[str | None, str | None]] = {}


class Avro:
    needs_registry = True

    def decode(self, records, encoded):
        from pyspark.sql import functions as F
        from pyspark.sql.avro.functions import from_avro

        reader = reader_schema(encoded)
        framed, schema_id, ids = schema_ids(records, encoded.column)
        payload = F.expr(f"substring({encoded.column}, {ID_BYTES + 2})")
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
        text = asked(encoded, path, f"{encoded.column} reader schema {reader.subject!r} version {reader.version}",
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
    return registry_writer(_WRITERS, encoded, schema_id, "AVRO", lambda found: found["schema"])
