"""A protobuf message class for the Spark tests' protobuf journals, importable by Spark's
workers as option protobufClass "tests.spark_integration.proto_testkit:Event".

Built from a descriptor in a pool of its own (no generated module, nothing in the default
pool): `Event { string uuid = 1; string text = 2; int64 n = 3; }`, whose string `uuid` field
holds the Gazette UUID, one of the ways the data source finds a protobuf message's UUID.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PROTOBUF_CLASS = "tests.spark_integration.proto_testkit:Event"


def _event_class() -> Any:
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="gazette_spark_test/event.proto", package="gazette_spark_test", syntax="proto3"
    )
    message = proto.message_type.add(name="Event")
    for number, (name, kind) in enumerate(
        (("uuid", field.TYPE_STRING), ("text", field.TYPE_STRING), ("n", field.TYPE_INT64)), 1
    ):
        message.field.add(name=name, number=number, type=kind, label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("gazette_spark_test.Event"))


Event = _event_class()
