"""The Protobuf twin of the Avro orders (tests/spark/avro_orders.py): the same pipeline, tables
and model, the values Protobuf in the registry's wire format under three versions of message
`tests.proto.Order` — v2 adds `note`, v3 `source` (which the pipeline does not read) — read as
v3, the reader; `n` is an int32, which the column `n bigint` takes.

The schemas are registered as .proto text, as a Confluent registry and Apicurio keep them (the
stack's Apicurio 3.0.9 answers confluent-kafka's ProtobufSerializer, which registers a base64
descriptor, with HTTP 500 "Syntax error … unexpected label"); the message classes are compiled
from the same text by protoc, and a value is framed as that serializer frames one: the magic
byte 0, the schema id in 4 bytes, the message indexes (a single 0: the first message), then the
message's bytes; or as Apicurio's own serializer does (`wire_format`: its Ref, by the layout of
its serde's source, io.apicurio.registry.serde.protobuf, whose jar Maven Central does not serve
here)."""

from __future__ import annotations

import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.spark.avro_orders import AvroOrders, registry_client

PACKAGE = "tests.proto"
ORDER = {1: "string id = 1; int32 n = 2;",
         2: "string id = 1; int32 n = 2; string note = 3;",
         3: "string id = 1; int32 n = 2; string note = 3; string source = 4;"}


def proto(body: str, imports: tuple[str, ...] = ()) -> str:
    return "\n".join(['syntax = "proto3";', f"package {PACKAGE};", *(f'import "{i}";' for i in imports), body])


def message_class(text: str, name: str) -> type:
    """The class of message `tests.proto.<name>` of a .proto text, compiled by protoc."""
    import grpc_tools
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "m.proto").write_text(text)
        out = Path(folder, "set.pb")
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{folder}",
                        f"-I{Path(grpc_tools.__file__).parent / '_proto'}", f"--descriptor_set_out={out}",
                        "--include_imports", "m.proto"], check=True)
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    pool = descriptor_pool.DescriptorPool()
    for file in files:
        pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))


def registered(subject: str, text: str) -> int:
    """The schema id of the .proto text, registered under `subject` (its next version)."""
    from confluent_kafka.schema_registry import Schema

    return registry_client().register_schema(subject, Schema(text, "PROTOBUF"))


def framed(schema_id: int, message, wire_format: str = "confluent") -> bytes:
    """The message as a registry's serializer frames it: Confluent's (indexes [0], one 0 byte),
    or Apicurio's (its 4- or 8-byte id, then its Ref naming the message, length-delimited)."""
    if wire_format == "confluent":
        return b"\x00" + struct.pack(">I", schema_id) + b"\x00" + message.SerializeToString()
    return apicurio_framed(schema_id, message.DESCRIPTOR.name, message.SerializeToString(), wire_format)


def apicurio_framed(schema_id: int, name: str, payload: bytes, wire_format: str = "apicurio") -> bytes:
    """Apicurio's serializer's framing of a payload: magic byte 0, the id (8 bytes for
    `apicurio_8_byte_ids`), then `Ref {string name = 1}` written delimited (its length first)."""
    ref = b"\x0a" + _varint(len(name.encode())) + name.encode()
    return (b"\x00" + struct.pack(">Q" if wire_format == "apicurio_8_byte_ids" else ">I", schema_id)
            + _varint(len(ref)) + ref + payload)


def _varint(n: int) -> bytes:
    out = b""
    while n >= 0x80:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


class ProtobufOrders(AvroOrders):
    """AvroOrders with `value_format: protobuf`, read as version 3 of the topic's subject."""

    def __init__(self, db_url: str, servers: str, topic: str, **source):
        super().__init__(db_url, servers, topic, value_format="protobuf",
                         value_reader_schema={"subject": f"{topic}-value", "version": 3}, **source)
        self.wire_format = source.get("wire_format", "confluent")
        self.texts = {v: proto(f"message Order {{ {fields} }}") for v, fields in ORDER.items()}
        self.classes = {v: message_class(text, "Order") for v, text in self.texts.items()}
        self.ids: dict[int, int] = {}

    def schema_id(self, version: int) -> int:
        """Version `version`'s id, registered (in order: version 1 first) on first use."""
        if version not in self.ids:
            self.ids[version] = registered(self.subject, self.texts[version])
        return self.ids[version]

    def encoded(self, version: int, order: dict) -> bytes:
        fields = self.classes[version].DESCRIPTOR.fields_by_name
        return framed(self.schema_id(version), self.classes[version](**{k: v for k, v in order.items()
                                                                         if k in fields}), self.wire_format)
