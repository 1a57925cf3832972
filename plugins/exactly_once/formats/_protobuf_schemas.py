"""Protobuf schemas as the schema registry holds them (a base64 FileDescriptorProto, as
`?format=serialized` asks a Confluent registry for, or .proto text, as Apicurio Registry keeps
it; with references for its imports), put together into one FileDescriptorSet, dependencies
first, for the JVM decoder
(exactly_once.protobuf in jvm/); and the Spark SQL types the decoder gives a message's fields,
so a reader schema can be checked against the pipeline's columns before any record is read."""

from __future__ import annotations

import base64
import binascii
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import quote

SERIALIZED = "format=serialized"
ROOT = "exactly_once_schema.proto"  # the schema's own file among its references
_SCALARS = {"TYPE_INT32": "int", "TYPE_SINT32": "int", "TYPE_SFIXED32": "int", "TYPE_UINT32": "bigint",
            "TYPE_FIXED32": "bigint", "TYPE_INT64": "bigint", "TYPE_SINT64": "bigint", "TYPE_SFIXED64": "bigint",
            "TYPE_UINT64": "decimal(20,0)", "TYPE_FIXED64": "decimal(20,0)", "TYPE_FLOAT": "float",
            "TYPE_DOUBLE": "double", "TYPE_BOOL": "boolean", "TYPE_STRING": "string", "TYPE_BYTES": "binary",
            "TYPE_ENUM": "string"}
_WRAPPERS = {"DoubleValue": "double", "FloatValue": "float", "Int64Value": "bigint", "UInt64Value": "decimal(20,0)",
             "Int32Value": "int", "UInt32Value": "bigint", "BoolValue": "boolean", "StringValue": "string",
             "BytesValue": "binary"}


def descriptor_set(found: Mapping, referenced: Callable[[str, int], Mapping]) -> bytes:
    """The serialized FileDescriptorSet of a registry answer (`schema`, `references`), its
    references (`referenced(subject, version)`, each answered alike) first, its own file last:
    schemas as serialized FileDescriptorProtos (base64, what a Confluent registry answers to
    ?format=serialized) taken as they are, as .proto text (what Apicurio Registry keeps) compiled
    by protoc; ValueError saying which schema cannot be read."""
    texts: dict[str, str] = {}

    def add(answer: Mapping, name: str) -> None:
        for reference in answer.get("references") or ():
            if reference["name"] not in texts:
                add(referenced(reference["subject"], reference["version"]), reference["name"])
        texts[name] = answer["schema"]

    add(found, ROOT)
    files = {name: _serialized(text) for name, text in texts.items()}
    if all(file is not None for file in files.values()):
        from google.protobuf import descriptor_pb2

        # A Confluent registry names every serialized file "default": each takes the name its
        # importers use (the reference's), which the decoder resolves imports by.
        for name, file in files.items():
            file.name = name
        return descriptor_pb2.FileDescriptorSet(file=list(files.values())).SerializeToString()
    return _compiled(texts)


def _serialized(text: str):
    """The FileDescriptorProto a base64 text holds; None if it is not one (.proto text)."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        file = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError, DecodeError):
        return None
    return file if file.name or file.message_type else None


def _compiled(texts: Mapping[str, str]) -> bytes:
    """The .proto files (name -> text, the schema itself last) compiled by protoc, their imports
    of Protobuf's well-known types from grpc_tools' own copies: dependencies first."""
    import grpc_tools

    with tempfile.TemporaryDirectory(prefix="exactly_once_protobuf_") as folder:
        sources = Path(folder, "sources").resolve()
        for name, text in texts.items():
            path = (sources / name).resolve()
            if Path(name).is_absolute() or not path.is_relative_to(sources):
                raise ValueError(f"reference name {name!r} is not a relative path inside the schema's folder")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        out = Path(folder, "set.pb")
        try:
            done = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{sources}",
                                   f"-I{Path(grpc_tools.__file__).parent / '_proto'}", f"--descriptor_set_out={out}",
                                   "--include_imports", ROOT], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            raise ValueError("protoc did not compile its .proto text in 60 s") from None
        if done.returncode != 0:
            raise ValueError("its .proto text does not compile: " + " ".join(done.stderr.split())[:500])
        return out.read_bytes()


def first_message(serialized_set: bytes) -> str:
    """The full name of the schema's first message (its file comes last in the set)."""
    from google.protobuf import descriptor_pb2

    schema = descriptor_pb2.FileDescriptorSet.FromString(serialized_set).file[-1]
    if not schema.message_type:
        raise ValueError(f"{schema.name} has no message")
    return ".".join(p for p in (schema.package, schema.message_type[0].name) if p)


def message_columns(serialized_set: bytes, message: str) -> dict[str, str]:
    """Field name -> Spark SQL type of `message` as the decoder gives them; ValueError for a
    message that holds itself (no column type can)."""
    from google.protobuf import descriptor_pb2

    messages = {}
    for file in descriptor_pb2.FileDescriptorSet.FromString(serialized_set).file:
        def collect(prefix: str, types) -> None:
            for m in types:
                messages[f"{prefix}.{m.name}"] = m
                collect(f"{prefix}.{m.name}", m.nested_type)
        collect(f".{file.package}" if file.package else "", file.message_type)

    def spark_type(field) -> str:
        kind = descriptor_pb2.FieldDescriptorProto.Type.Name(field.type)
        if kind != "TYPE_MESSAGE":
            found = _SCALARS.get(kind)
            if found is None:
                raise ValueError(f"field {field.name}: {kind} is not one this library reads")
            return found
        name = field.type_name
        if name == ".google.protobuf.Timestamp":
            return "timestamp"
        if name.startswith(".google.protobuf.") and name.rsplit(".", 1)[1] in _WRAPPERS:
            return _WRAPPERS[name.rsplit(".", 1)[1]]
        nested = messages.get(name)
        if nested is None:
            raise ValueError(f"field {field.name}: message {name[1:]} is none of the schema's")
        if nested.options.map_entry:
            key, value = sorted(nested.field, key=lambda f: f.number)
            return f"map<{spark_type(key)}, {spark_type(value)}>"
        if name in inside:
            raise ValueError(f"field {field.name}: message {name[1:]} holds itself, which no column type can")
        inside.add(name)
        made = "struct<" + ", ".join(f"`{f.name}`: {typed(f)}" for f in nested.field) + ">"
        inside.discard(name)
        return made

    def typed(field) -> str:
        repeated = field.label == field.LABEL_REPEATED
        made = spark_type(field)
        return made if not repeated or made.startswith("map<") else f"array<{made}>"

    found = messages.get(f".{message}")
    if found is None:
        raise ValueError(f"message {message} is none of the schema's")
    inside = {f".{message}"}
    return {f.name: typed(f) for f in found.field}


def text_fields(serialized_set: bytes, message: str) -> set[str]:
    """The fields of `message` that are single strings (not enums): what a decimal column may
    take as its text."""
    from google.protobuf import descriptor_pb2

    for file in descriptor_pb2.FileDescriptorSet.FromString(serialized_set).file:
        for m in file.message_type:
            if ".".join(p for p in (file.package, m.name) if p) == message:
                return {f.name for f in m.field if f.type == f.TYPE_STRING and f.label != f.LABEL_REPEATED}
    return set()


def subject_path(subject: str, version: int) -> str:
    return f"/subjects/{quote(subject, safe='')}/versions/{version}?{SERIALIZED}"
