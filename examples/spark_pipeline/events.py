"""The protobuf message of docs/spark.md's protobuf examples, importable by Spark's workers as
option protobufClass "examples.spark_pipeline.events:Event".

`Event { string uuid = 1; string key = 2; int64 n = 3; }`, built from a descriptor in a pool of
its own (as a generated `_pb2` module would define it): its string field `uuid` holds the
Gazette UUID, which the data source sets when it writes and finds when it reads.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def _event_class() -> Any:
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="gazette_examples/event.proto", package="gazette_examples", syntax="proto3"
    )
    message = proto.message_type.add(name="Event")
    for number, (name, kind) in enumerate(
        (("uuid", field.TYPE_STRING), ("key", field.TYPE_STRING), ("n", field.TYPE_INT64)), 1
    ):
        message.field.add(name=name, number=number, type=kind, label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("gazette_examples.Event"))


Event = _event_class()
