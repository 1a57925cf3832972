"""A registry's Protobuf schemas put together for the decoder (exactly_once.formats._protobuf_schemas),
without a registry: serialized files named as their importers name them (a Confluent registry
names each "default"), reference names that would leave the compile folder refused, a message
that holds itself refused."""

from __future__ import annotations

import base64

import pytest
from google.protobuf import descriptor_pb2

from exactly_once.formats._protobuf_schemas import ROOT, descriptor_set, first_message, message_columns

F = descriptor_pb2.FieldDescriptorProto


def serialized(file: descriptor_pb2.FileDescriptorProto) -> str:
    return base64.b64encode(file.SerializeToString()).decode()


def test_serialized_schemas_take_the_names_their_imports_use():
    common = descriptor_pb2.FileDescriptorProto(name="default", package="tests.proto", syntax="proto3")
    money = common.message_type.add(name="Money")
    money.field.add(name="currency", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    money.field.add(name="units", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    root = descriptor_pb2.FileDescriptorProto(name="default", package="tests.proto", syntax="proto3",
                                              dependency=["shop/common.proto"])
    priced = root.message_type.add(name="Priced")
    priced.field.add(name="id", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    priced.field.add(name="price", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                     type_name=".tests.proto.Money")
    found = {"schema": serialized(root), "references": [{"name": "shop/common.proto", "subject": "c", "version": 1}]}
    asked = []
    made = descriptor_set(found, lambda subject, version: asked.append((subject, version)) or
                          {"schema": serialized(common)})
    files = descriptor_pb2.FileDescriptorSet.FromString(made).file
    assert asked == [("c", 1)]
    assert [f.name for f in files] == ["shop/common.proto", ROOT] and list(files[1].dependency) == ["shop/common.proto"]
    assert first_message(made) == "tests.proto.Priced"
    assert message_columns(made, "tests.proto.Priced") == {"id": "string",
                                                          "price": "struct<`currency`: string, `units`: bigint>"}


@pytest.mark.parametrize("name", ["../outside.proto", "/etc/outside.proto", "a/../../outside.proto"])
def test_a_reference_name_leaving_the_compile_folder_is_refused(name):
    found = {"schema": f'syntax = "proto3"; import "{name}"; message M {{ string id = 1; }}',
             "references": [{"name": name, "subject": "s", "version": 1}]}
    with pytest.raises(ValueError, match="is not a relative path inside the schema's folder"):
        descriptor_set(found, lambda subject, version: {"schema": 'syntax = "proto3"; message N {}'})


def test_a_message_holding_itself_is_refused_naming_the_field():
    file = descriptor_pb2.FileDescriptorProto(name="default", package="t", syntax="proto3")
    node = file.message_type.add(name="Node")
    node.field.add(name="id", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    node.field.add(name="next", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".t.Node")
    tree = file.message_type.add(name="Tree")
    tree.field.add(name="root", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".t.Node")
    made = descriptor_set({"schema": serialized(file)}, lambda subject, version: {})
    with pytest.raises(ValueError, match="field next: message t.Node holds itself"):
        message_columns(made, "t.Node")
    with pytest.raises(ValueError, match="field next: message t.Node holds itself"):
        message_columns(made, "t.Tree")
