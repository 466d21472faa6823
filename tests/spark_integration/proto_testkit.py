"""A protobuf message class for the Spark tests' protobuf journals, importable by Spark's
workers as option protobufClass "tests.spark_integration.proto_testkit:Event".

Built from a descriptor in a pool of its own (no generated module, nothing in the default
pool): `Event { string uuid = 1; string text = 2; int64 n = 3; }` (and `Tally`, below), whose string `uuid` field
holds the Gazette UUID, one of the ways the data source finds a protobuf message's UUID.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PROTOBUF_CLASS = "tests.spark_integration.proto_testkit:Event"
TALLY_CLASS = "tests.spark_integration.proto_testkit:Tally"
_FIELD = descriptor_pb2.FieldDescriptorProto


def _message_class(name: str, fields: tuple[tuple[str, int], ...]) -> Any:
    proto = descriptor_pb2.FileDescriptorProto(
        name=f"gazette_spark_test/{name.lower()}.proto",
        package="gazette_spark_test",
        syntax="proto3",
    )
    message = proto.message_type.add(name=name)
    for number, (field, kind) in enumerate(fields, 1):
        message.field.add(name=field, number=number, type=kind, label=_FIELD.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"gazette_spark_test.{name}"))


Event = _message_class(
    "Event", (("uuid", _FIELD.TYPE_STRING), ("text", _FIELD.TYPE_STRING), ("n", _FIELD.TYPE_INT64))
)
# `Tally { string uuid = 1; string key = 2; uint32 count = 3; }`: a count of -1 cannot be encoded.
Tally = _message_class(
    "Tally",
    (("uuid", _FIELD.TYPE_STRING), ("key", _FIELD.TYPE_STRING), ("count", _FIELD.TYPE_UINT32)),
)
