"""protobuf: the column is Protobuf in a schema registry's wire format (`source.wire_format`:
Confluent's, a magic byte 0, the writer schema's 4-byte id, the message indexes, then the
payload; or Apicurio's, its 4- or 8-byte id, then its Ref naming a top-level message), read into
the pipeline's columns by the message's field names.

The reader schema (`source.value_reader_schema`/`key_reader_schema`, {subject, version} of the
registry) names the message: its schema's first. Decoding runs in the JVM (the function
`exactly_once_from_protobuf` of the project's jar, registered by spark.sql.extensions): the
driver finds the schema ids among the records, fetches each writer schema and its references
once per process (ids are immutable) and gives them and the reader's to the function, which
checks that each record's id and indexes (or Ref) name the reader's message and reads its payload as
the reader's message (by field numbers, as Protobuf reads another version of a message: a
field the writer lacks has its default); its fields become the columns by name. A record not framed so,
whose id the registry does not know or is no Protobuf schema, whose indexes or Ref name another
message, or whose payload does not decode, has that reason; unknown ids and a registry that
does not answer fail the attempt as with Avro (exactly_once.formats._registry).
"""

from __future__ import annotations

from exactly_once.errors import ConfigError
from exactly_once.formats._protobuf_schemas import (SERIALIZED, descriptor_set, first_message, message_columns,
                                                    subject_path, text_fields)
from exactly_once.formats._registry import (SUBJECT_NOT_FOUND, VERSION_NOT_FOUND, RegistryUnavailable,
                                            UnknownSchemaIds, asked, schema_ids, unknown_id, unknown_ids_failure,
                                            writer_schema)
from exactly_once.problems import Problem
from exactly_once.spark_types import parse as parse_spark_type

FUNCTION = "exactly_once_from_protobuf"  # registered by spark.sql.extensions=exactly_once.protobuf.ProtobufExtensions
# source.wire_format -> the schema id's bytes, as the function reads them (its Framing, which says
# why a value it does not frame is not).
ID_BYTES = {"confluent": 4, "apicurio": 4, "apicurio_8_byte_ids": 8}
# (registry, id) -> (serialized FileDescriptorSet, why not); an unknown id is not kept (as Avro's).
_WRITERS: dict[tuple[str, int], tuple[bytes | None, str | None]] = {}
# (registry, subject, version) -> (serialized FileDescriptorSet, its first message): versions never change.
_READERS: dict[tuple[str, str, int], tuple[bytes, str]] = {}


class Protobuf:
    needs_registry = True

    def decode(self, records, encoded):
        from pyspark.sql import functions as F

        reader, message = reader_schema(encoded)
        _, schema_id, ids = schema_ids(records, encoded.column, ID_BYTES[encoded.wire_format])
        writers = {i: writer_schemas(encoded, i) for i in ids}
        unknown = [i for i, (_, why_not) in writers.items() if why_not == unknown_id(i)]
        if unknown and encoded.retry_unknown_ids:
            raise UnknownSchemaIds(unknown_ids_failure(encoded, unknown))

        columns = ", ".join(f"`{c}` {t}" for c, t in encoded.schema.items())
        schemas = F.create_map(*(part for i, (found, _) in writers.items() if found is not None
                                 for part in (F.lit(i).cast("bigint"), F.lit(bytearray(found))))
                               ).cast("map<bigint, binary>")
        read = F.call_function(FUNCTION, F.col(encoded.column), schemas, F.lit(bytearray(reader)), F.lit(message),
                               F.lit(columns), F.lit(encoded.wire_format))
        unreadable = [(schema_id == i, F.lit(f"{encoded.column}: {why_not}"))
                      for i, (_, why_not) in writers.items() if why_not is not None]

        def why_not(fields):
            # A value not framed has no schema id: the function says why it does not read it, as it
            # does any other; decoded again only for a record that failed (a CASE branch runs when taken).
            cases = [*unreadable, (fields.isNull(), F.concat(F.lit(f"{encoded.column} "), read.getField("error")))]
            reason = F.when(*cases[0])
            for condition, value in cases[1:]:
                reason = reason.when(condition, value)
            return reason

        return read.getField("fields"), why_not

    def problems(self, encoded) -> list[Problem]:
        """The reader schema's: not in the registry, or not giving the columns."""
        try:
            reader_schema(encoded)
        except ConfigError as wrong:
            return [Problem(f"source.{encoded.column}_reader_schema", str(wrong))]
        except (RegistryUnavailable, OSError) as failed:
            return [Problem(f"source.{encoded.column}_reader_schema", f"the schema registry does not answer: {failed}",
                            passing=True)]
        return []


FORMAT = Protobuf()


def reader_schema(encoded) -> tuple[bytes, str]:
    """(the reader schema's serialized FileDescriptorSet, its first message's full name), the
    message checked against the pipeline's columns (ConfigError)."""
    reader = encoded.reader
    where = f"source.{encoded.column}_reader_schema"
    if isinstance(reader, str) or reader is None:
        raise ConfigError(f"{where}: protobuf reads into a message of the schema registry: give {{subject, version}}")
    key = (encoded.registry.url, reader.subject, reader.version)
    if key not in _READERS:
        what = f"{encoded.column} reader schema {reader.subject!r} version {reader.version}"
        found = asked(encoded, subject_path(reader.subject, reader.version), what,
                      (SUBJECT_NOT_FOUND, VERSION_NOT_FOUND), whole=True)
        if found is None:
            raise ConfigError(f"the schema registry ({encoded.registry.connection!r}) has no subject "
                              f"{reader.subject!r} version {reader.version} ({where})")
        if found.get("schemaType", "AVRO") != "PROTOBUF":
            raise ConfigError(f"{where}: subject {reader.subject!r} version {reader.version} is a "
                              f"{found.get('schemaType', 'AVRO')} schema, not Protobuf")
        try:
            serialized = descriptor_set(found, lambda subject, version: _referenced(encoded, subject, version))
            _READERS[key] = (serialized, first_message(serialized))
        except ValueError as unreadable:
            raise ConfigError(f"{where}: {unreadable}") from None
    serialized, message = _READERS[key]
    try:
        fields = message_columns(serialized, message)
    except ValueError as unreadable:
        raise ConfigError(f"{where}: {unreadable}") from None
    texts = text_fields(serialized, message)
    wrong = []
    for column, wanted in encoded.schema.items():
        if column not in fields:
            wrong.append(f"{column}: not a field of message {message} (its fields: {', '.join(fields)})")
        elif not _gives(fields[column], str(parse_spark_type(wanted)), column in texts):
            wrong.append(f"{column}: message {message} makes it {fields[column]}, the configuration says {wanted}")
    if wrong:
        raise ConfigError(f"{where} does not give source.{encoded.column}_schema's columns: {'; '.join(wrong)}")
    return serialized, message


# A field's type -> the wider column types the decoder also gives it (exactly_once.protobuf.Rows).
_WIDENED = {"int": ("bigint",), "float": ("double",)}


def _gives(field_type: str, column_type: str, text: bool) -> bool:
    """Whether the decoder gives a field of that type the column's: its own, a wider one, or,
    for a string field (`text`), a decimal (its text, exactly at the column's scale, or a dead letter)."""
    return (str(parse_spark_type(field_type)) == column_type or column_type in _WIDENED.get(field_type, ())
            or (text and column_type.startswith("decimal(")))


def writer_schemas(encoded, schema_id: int) -> tuple[bytes | None, str | None]:
    """(the serialized FileDescriptorSet of `schema_id` and its references, None) or (None, why
    its records cannot be read)."""
    return writer_schema(_WRITERS, encoded, schema_id, "PROTOBUF",
                         lambda found: descriptor_set(found, lambda s, v: _referenced(encoded, s, v)), f"?{SERIALIZED}")


def _referenced(encoded, subject: str, version: int) -> dict:
    what = f"referenced subject {subject!r} version {version}"
    found = asked(encoded, subject_path(subject, version), what, (SUBJECT_NOT_FOUND, VERSION_NOT_FOUND), whole=True)
    if found is None:
        raise ValueError(f"the registry has no {what}")
    return found
