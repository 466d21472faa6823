"""Wire compatibility with Gazette's protos.

Two kinds of evidence:

1. Descriptor tables, transcribed by hand from Gazette's current
   broker/protocol/protocol.proto, consumer/protocol/protocol.proto and
   consumer/recoverylog/recorded_op.proto (and the field tags of their
   generated Go code), compared with our generated descriptors: every message,
   field name, number and type; every enum value; every RPC and its streaming
   shape. Any extra, missing or renumbered field fails.
2. Exact bytes of a few messages, computed by hand from those field numbers
   and the protobuf encoding rules (tag = number << 3 | wire type; wire types
   0 varint, 1 fixed64, 2 length-delimited, 5 fixed32).
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import descriptor as _d
from google.protobuf.message import Message

from broker.protocol import consumer_pb2, protocol_pb2, recorded_op_pb2

D = "google.protobuf.Duration"

# message full name -> {field name: (number, type)}. Types are scalar names,
# full names of messages / enums, "repeated X", or "map<K, V>".
PROTOCOL_MESSAGES: dict[str, dict[str, tuple[int, str]]] = {
    "protocol.Label": {"name": (1, "string"), "value": (2, "string"), "prefix": (3, "bool")},
    "protocol.LabelSet": {"labels": (1, "repeated protocol.Label")},
    "protocol.LabelSelector": {
        "include": (1, "protocol.LabelSet"),
        "exclude": (2, "protocol.LabelSet"),
    },
    "protocol.JournalSpec": {
        "name": (1, "string"),
        "replication": (2, "int32"),
        "labels": (3, "protocol.LabelSet"),
        "fragment": (4, "protocol.JournalSpec.Fragment"),
        "flags": (6, "uint32"),
        "max_append_rate": (7, "int64"),
        "suspend": (8, "protocol.JournalSpec.Suspend"),
    },
    "protocol.JournalSpec.Fragment": {
        "length": (1, "int64"),
        "compression_codec": (2, "protocol.CompressionCodec"),
        "stores": (3, "repeated string"),
        "refresh_interval": (4, D),
        "retention": (5, D),
        "flush_interval": (6, D),
        "path_postfix_template": (7, "string"),
    },
    "protocol.JournalSpec.Suspend": {
        "level": (1, "protocol.JournalSpec.Suspend.Level"),
        "offset": (2, "int64"),
    },
    "protocol.ProcessSpec": {"id": (1, "protocol.ProcessSpec.ID"), "endpoint": (2, "string")},
    "protocol.ProcessSpec.ID": {"zone": (1, "string"), "suffix": (2, "string")},
    "protocol.BrokerSpec": {
        "process_spec": (1, "protocol.ProcessSpec"),
        "journal_limit": (2, "uint32"),
        "exiting": (3, "bool"),
    },
    "protocol.Fragment": {
        "journal": (1, "string"),
        "begin": (2, "int64"),
        "end": (3, "int64"),
        "sum": (4, "protocol.SHA1Sum"),
        "compression_codec": (5, "protocol.CompressionCodec"),
        "backing_store": (6, "string"),
        "mod_time": (7, "int64"),
        "path_postfix": (8, "string"),
    },
    "protocol.SHA1Sum": {"part1": (1, "fixed64"), "part2": (2, "fixed64"), "part3": (3, "fixed32")},
    "protocol.ReadRequest": {
        "header": (1, "protocol.Header"),
        "journal": (2, "string"),
        "offset": (3, "int64"),
        "block": (4, "bool"),
        "do_not_proxy": (5, "bool"),
        "metadata_only": (6, "bool"),
        "end_offset": (7, "int64"),
        "begin_mod_time": (8, "int64"),
        "min_etcd_revision": (9, "int64"),
    },
    "protocol.ReadResponse": {
        "status": (1, "protocol.Status"),
        "header": (2, "protocol.Header"),
        "offset": (3, "int64"),
        "write_head": (4, "int64"),
        "fragment": (5, "protocol.Fragment"),
        "fragment_url": (6, "string"),
        "content": (7, "bytes"),
    },
    "protocol.AppendRequest": {
        "header": (1, "protocol.Header"),
        "journal": (2, "string"),
        "do_not_proxy": (3, "bool"),
        "content": (4, "bytes"),
        "offset": (5, "int64"),
        "check_registers": (6, "protocol.LabelSelector"),
        "union_registers": (7, "protocol.LabelSet"),
        "subtract_registers": (8, "protocol.LabelSet"),
        "suspend": (9, "protocol.AppendRequest.Suspend"),
        "min_etcd_revision": (10, "int64"),
    },
    "protocol.AppendResponse": {
        "status": (1, "protocol.Status"),
        "header": (2, "protocol.Header"),
        "commit": (3, "protocol.Fragment"),
        "registers": (4, "protocol.LabelSet"),
        "total_chunks": (5, "int64"),
        "delayed_chunks": (6, "int64"),
        "store_health_error": (7, "string"),
    },
    "protocol.ReplicateRequest": {
        "header": (1, "protocol.Header"),
        "deprecated_journal": (2, "string"),
        "proposal": (3, "protocol.Fragment"),
        "content": (4, "bytes"),
        "content_delta": (5, "int64"),
        "acknowledge": (6, "bool"),
        "registers": (7, "protocol.LabelSet"),
    },
    "protocol.ReplicateResponse": {
        "status": (1, "protocol.Status"),
        "header": (2, "protocol.Header"),
        "fragment": (3, "protocol.Fragment"),
        "registers": (4, "protocol.LabelSet"),
    },
    "protocol.ListRequest": {
        "selector": (1, "protocol.LabelSelector"),
        "watch": (4, "bool"),
        "watch_resume": (5, "protocol.Header"),
    },
    "protocol.ListResponse": {
        "status": (1, "protocol.Status"),
        "header": (2, "protocol.Header"),
        "journals": (3, "repeated protocol.ListResponse.Journal"),
    },
    "protocol.ListResponse.Journal": {
        "spec": (1, "protocol.JournalSpec"),
        "mod_revision": (2, "int64"),
        "route": (3, "protocol.Route"),
        "create_revision": (4, "int64"),
    },
    "protocol.ApplyRequest": {"changes": (1, "repeated protocol.ApplyRequest.Change")},
    "protocol.ApplyRequest.Change": {
        "expect_mod_revision": (1, "int64"),
        "upsert": (2, "protocol.JournalSpec"),
        "delete": (3, "string"),
    },
    "protocol.ApplyResponse": {"status": (1, "protocol.Status"), "header": (2, "protocol.Header")},
    "protocol.FragmentsRequest": {
        "header": (1, "protocol.Header"),
        "journal": (2, "string"),
        "begin_mod_time": (3, "int64"),
        "end_mod_time": (4, "int64"),
        "next_page_token": (5, "int64"),
        "page_limit": (6, "int32"),
        "signatureTTL": (7, D),
        "do_not_proxy": (8, "bool"),
    },
    "protocol.FragmentsResponse": {
        "status": (1, "protocol.Status"),
        "header": (2, "protocol.Header"),
        "fragments": (3, "repeated protocol.FragmentsResponse._Fragment"),
        "next_page_token": (4, "int64"),
    },
    "protocol.FragmentsResponse._Fragment": {
        "spec": (1, "protocol.Fragment"),
        "signed_url": (2, "string"),
    },
    "protocol.Route": {
        "members": (1, "repeated protocol.ProcessSpec.ID"),
        "primary": (2, "int32"),
        "endpoints": (3, "repeated string"),
    },
    "protocol.Header": {
        "process_id": (1, "protocol.ProcessSpec.ID"),
        "route": (2, "protocol.Route"),
        "etcd": (3, "protocol.Header.Etcd"),
    },
    "protocol.Header.Etcd": {
        "cluster_id": (1, "uint64"),
        "member_id": (2, "uint64"),
        "revision": (3, "int64"),
        "raft_term": (4, "uint64"),
    },
    "protocol.FragmentStoreHealthRequest": {
        "fragment_store": (1, "string"),
        "check_delete": (2, "bool"),
        "check_delete_prefix": (3, "string"),
    },
    "protocol.FragmentStoreHealthResponse": {
        "status": (1, "protocol.Status"),
        "header": (2, "protocol.Header"),
        "store_health_error": (3, "string"),
    },
}

CONSUMER_MESSAGES: dict[str, dict[str, tuple[int, str]]] = {
    "consumer.ShardSpec": {
        "id": (1, "string"),
        "sources": (2, "repeated consumer.ShardSpec.Source"),
        "recovery_log_prefix": (3, "string"),
        "hint_prefix": (4, "string"),
        "hint_backups": (5, "int32"),
        "max_txn_duration": (6, D),
        "min_txn_duration": (7, D),
        "disable": (8, "bool"),
        "hot_standbys": (9, "uint32"),
        "labels": (10, "protocol.LabelSet"),
        "disable_wait_for_ack": (11, "bool"),
        "ring_buffer_size": (12, "uint32"),
        "read_channel_size": (13, "uint32"),
    },
    "consumer.ShardSpec.Source": {"journal": (1, "string"), "min_offset": (3, "int64")},
    "consumer.ConsumerSpec": {
        "process_spec": (1, "protocol.ProcessSpec"),
        "shard_limit": (2, "uint32"),
        "exiting": (3, "bool"),
    },
    "consumer.ReplicaStatus": {
        "code": (1, "consumer.ReplicaStatus.Code"),
        "errors": (2, "repeated string"),
    },
    "consumer.Checkpoint": {
        "sources": (1, "map<string, consumer.Checkpoint.Source>"),
        "ack_intents": (2, "map<string, bytes>"),
    },
    "consumer.Checkpoint.Source": {
        "read_through": (1, "int64"),
        "producers": (2, "repeated consumer.Checkpoint.Source.ProducerEntry"),
    },
    "consumer.Checkpoint.Source.ProducerEntry": {
        "id": (1, "bytes"),
        "state": (2, "consumer.Checkpoint.ProducerState"),
    },
    "consumer.Checkpoint.ProducerState": {"last_ack": (1, "fixed64"), "begin": (2, "int64")},
    "consumer.ListRequest": {
        "selector": (1, "protocol.LabelSelector"),
        "extension": (100, "bytes"),
    },
    "consumer.ListResponse": {
        "status": (1, "consumer.Status"),
        "header": (2, "protocol.Header"),
        "shards": (3, "repeated consumer.ListResponse.Shard"),
        "extension": (100, "bytes"),
    },
    "consumer.ListResponse.Shard": {
        "spec": (1, "consumer.ShardSpec"),
        "mod_revision": (2, "int64"),
        "route": (3, "protocol.Route"),
        "status": (4, "repeated consumer.ReplicaStatus"),
        "create_revision": (5, "int64"),
    },
    "consumer.ApplyRequest": {
        "changes": (1, "repeated consumer.ApplyRequest.Change"),
        "extension": (100, "bytes"),
    },
    "consumer.ApplyRequest.Change": {
        "expect_mod_revision": (1, "int64"),
        "upsert": (2, "consumer.ShardSpec"),
        "delete": (3, "string"),
        "primary_hints": (4, "recoverylog.FSMHints"),
    },
    "consumer.ApplyResponse": {
        "status": (1, "consumer.Status"),
        "header": (2, "protocol.Header"),
        "extension": (100, "bytes"),
    },
    "consumer.StatRequest": {
        "header": (1, "protocol.Header"),
        "shard": (2, "string"),
        "read_through": (3, "map<string, int64>"),
        "extension": (100, "bytes"),
    },
    "consumer.StatResponse": {
        "status": (1, "consumer.Status"),
        "header": (2, "protocol.Header"),
        "read_through": (3, "map<string, int64>"),
        "publish_at": (4, "map<string, int64>"),
        "extension": (100, "bytes"),
    },
    "consumer.GetHintsRequest": {"shard": (1, "string"), "extension": (100, "bytes")},
    "consumer.GetHintsResponse": {
        "status": (1, "consumer.Status"),
        "header": (2, "protocol.Header"),
        "primary_hints": (3, "consumer.GetHintsResponse.ResponseHints"),
        "backup_hints": (4, "repeated consumer.GetHintsResponse.ResponseHints"),
        "extension": (100, "bytes"),
    },
    "consumer.GetHintsResponse.ResponseHints": {"hints": (1, "recoverylog.FSMHints")},
    "consumer.UnassignRequest": {
        "shards": (1, "repeated string"),
        "only_failed": (2, "bool"),
        "dry_run": (3, "bool"),
    },
    "consumer.UnassignResponse": {
        "status": (1, "consumer.Status"),
        "shards": (2, "repeated string"),
    },
}

RECOVERYLOG_MESSAGES: dict[str, dict[str, tuple[int, str]]] = {
    "recoverylog.RecordedOp": {
        "seq_no": (1, "int64"),
        "checksum": (2, "fixed32"),
        "author": (3, "fixed32"),
        "create": (4, "recoverylog.RecordedOp.Create"),
        "link": (5, "recoverylog.RecordedOp.Link"),
        "unlink": (6, "recoverylog.RecordedOp.Link"),
        "write": (7, "recoverylog.RecordedOp.Write"),
        "property": (8, "recoverylog.Property"),
        "first_offset": (9, "int64"),
        "last_offset": (10, "int64"),
        "log": (11, "string"),
    },
    "recoverylog.RecordedOp.Create": {"path": (1, "string")},
    "recoverylog.RecordedOp.Link": {"fnode": (1, "int64"), "path": (2, "string")},
    "recoverylog.RecordedOp.Write": {
        "fnode": (1, "int64"),
        "offset": (2, "int64"),
        "length": (3, "int64"),
    },
    "recoverylog.Property": {"path": (1, "string"), "content": (2, "string")},
    "recoverylog.Segment": {
        "author": (1, "fixed32"),
        "first_seq_no": (2, "int64"),
        "first_offset": (3, "int64"),
        "first_checksum": (4, "fixed32"),
        "last_seq_no": (5, "int64"),
        "last_offset": (6, "int64"),
        "log": (7, "string"),
    },
    "recoverylog.FnodeSegments": {
        "fnode": (1, "int64"),
        "segments": (2, "repeated recoverylog.Segment"),
    },
    "recoverylog.FSMHints": {
        "log": (1, "string"),
        "live_nodes": (2, "repeated recoverylog.FnodeSegments"),
        "properties": (3, "repeated recoverylog.Property"),
    },
}

ENUMS: dict[str, dict[str, int]] = {
    "protocol.Status": {
        "OK": 0,
        "JOURNAL_NOT_FOUND": 1,
        "NO_JOURNAL_PRIMARY_BROKER": 2,
        "NOT_JOURNAL_PRIMARY_BROKER": 3,
        "NOT_JOURNAL_BROKER": 5,
        "INSUFFICIENT_JOURNAL_BROKERS": 4,
        "OFFSET_NOT_YET_AVAILABLE": 6,
        "WRONG_ROUTE": 7,
        "PROPOSAL_MISMATCH": 8,
        "ETCD_TRANSACTION_FAILED": 9,
        "NOT_ALLOWED": 10,
        "WRONG_APPEND_OFFSET": 11,
        "INDEX_HAS_GREATER_OFFSET": 12,
        "REGISTER_MISMATCH": 13,
        "SUSPENDED": 14,
        "FRAGMENT_STORE_UNHEALTHY": 15,
    },
    "protocol.CompressionCodec": {
        "INVALID": 0,
        "NONE": 1,
        "GZIP": 2,
        "ZSTANDARD": 3,
        "SNAPPY": 4,
        "GZIP_OFFLOAD_DECOMPRESSION": 5,
    },
    "protocol.JournalSpec.Flag": {"NOT_SPECIFIED": 0, "O_RDONLY": 1, "O_WRONLY": 2, "O_RDWR": 4},
    "protocol.JournalSpec.Suspend.Level": {"NONE": 0, "PARTIAL": 1, "FULL": 2},
    "protocol.AppendRequest.Suspend": {
        "SUSPEND_RESUME": 0,
        "SUSPEND_NO_RESUME": 1,
        "SUSPEND_IF_FLUSHED": 2,
        "SUSPEND_NOW": 3,
        "SUSPEND_KEEP": 4,
    },
    "consumer.Status": {
        "OK": 0,
        "SHARD_NOT_FOUND": 1,
        "NO_SHARD_PRIMARY": 2,
        "NOT_SHARD_PRIMARY": 3,
        "ETCD_TRANSACTION_FAILED": 4,
        "SHARD_STOPPED": 5,
    },
    "consumer.ReplicaStatus.Code": {
        "IDLE": 0,
        "BACKFILL": 100,
        "STANDBY": 200,
        "PRIMARY": 300,
        "FAILED": 400,
    },
}

# service -> {method: (request, response, client streams, server streams)}.
SERVICES: dict[str, dict[str, tuple[str, str, bool, bool]]] = {
    "protocol.Journal": {
        "List": ("protocol.ListRequest", "protocol.ListResponse", False, True),
        "Apply": ("protocol.ApplyRequest", "protocol.ApplyResponse", False, False),
        "Read": ("protocol.ReadRequest", "protocol.ReadResponse", False, True),
        "Append": ("protocol.AppendRequest", "protocol.AppendResponse", True, False),
        "Replicate": ("protocol.ReplicateRequest", "protocol.ReplicateResponse", True, True),
        "ListFragments": ("protocol.FragmentsRequest", "protocol.FragmentsResponse", False, False),
        "FragmentStoreHealth": (
            "protocol.FragmentStoreHealthRequest",
            "protocol.FragmentStoreHealthResponse",
            False,
            False,
        ),
    },
    "consumer.Shard": {
        "Stat": ("consumer.StatRequest", "consumer.StatResponse", False, False),
        "List": ("consumer.ListRequest", "consumer.ListResponse", False, False),
        "Apply": ("consumer.ApplyRequest", "consumer.ApplyResponse", False, False),
        "GetHints": ("consumer.GetHintsRequest", "consumer.GetHintsResponse", False, False),
        "Unassign": ("consumer.UnassignRequest", "consumer.UnassignResponse", False, False),
    },
}

FILES: list[tuple[Any, str, dict[str, dict[str, tuple[int, str]]]]] = [
    (protocol_pb2, "protocol", PROTOCOL_MESSAGES),
    (consumer_pb2, "consumer", CONSUMER_MESSAGES),
    (recorded_op_pb2, "recoverylog", RECOVERYLOG_MESSAGES),
]

_SCALARS = {
    _d.FieldDescriptor.TYPE_DOUBLE: "double",
    _d.FieldDescriptor.TYPE_FLOAT: "float",
    _d.FieldDescriptor.TYPE_INT64: "int64",
    _d.FieldDescriptor.TYPE_UINT64: "uint64",
    _d.FieldDescriptor.TYPE_INT32: "int32",
    _d.FieldDescriptor.TYPE_FIXED64: "fixed64",
    _d.FieldDescriptor.TYPE_FIXED32: "fixed32",
    _d.FieldDescriptor.TYPE_BOOL: "bool",
    _d.FieldDescriptor.TYPE_STRING: "string",
    _d.FieldDescriptor.TYPE_BYTES: "bytes",
    _d.FieldDescriptor.TYPE_UINT32: "uint32",
    _d.FieldDescriptor.TYPE_SFIXED32: "sfixed32",
    _d.FieldDescriptor.TYPE_SFIXED64: "sfixed64",
    _d.FieldDescriptor.TYPE_SINT32: "sint32",
    _d.FieldDescriptor.TYPE_SINT64: "sint64",
}


def _base_type(field: _d.FieldDescriptor) -> str:
    if field.type == _d.FieldDescriptor.TYPE_MESSAGE:
        return str(field.message_type.full_name)
    if field.type == _d.FieldDescriptor.TYPE_ENUM:
        return str(field.enum_type.full_name)
    return _SCALARS[field.type]


def _field_type(field: _d.FieldDescriptor) -> str:
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
        return f"map<{_base_type(key)}, {_base_type(value)}>"
    base = _base_type(field)
    return f"repeated {base}" if field.is_repeated else base


def _children(container: Any) -> list[_d.Descriptor]:
    """Top-level messages of a file, or nested messages of a message."""
    if isinstance(container, _d.FileDescriptor):
        return list(container.message_types_by_name.values())
    return list(container.nested_types)


def _messages(container: Any) -> list[_d.Descriptor]:
    """All messages under a file or message, nested ones included, no map entries."""
    found: list[_d.Descriptor] = []
    for message in _children(container):
        if message.GetOptions().map_entry:
            continue
        found.append(message)
        found.extend(_messages(message))
    return found


def _enums(container: Any) -> list[_d.EnumDescriptor]:
    found = list(container.enum_types_by_name.values())
    for message in _children(container):
        found.extend(_enums(message))
    return found


@pytest.mark.parametrize(("module", "package", "table"), FILES, ids=[f[1] for f in FILES])
def test_file_package_and_message_set(
    module: Any, package: str, table: dict[str, dict[str, tuple[int, str]]]
) -> None:
    assert module.DESCRIPTOR.package == package
    actual = {m.full_name for m in _messages(module.DESCRIPTOR)}
    assert actual == set(table)


def _message_cases() -> list[tuple[Any, str, dict[str, tuple[int, str]]]]:
    return [
        (module, name, fields) for module, _pkg, table in FILES for name, fields in table.items()
    ]


@pytest.mark.parametrize(
    ("module", "name", "expected"), _message_cases(), ids=[c[1] for c in _message_cases()]
)
def test_message_fields_match_gazette(
    module: Any, name: str, expected: dict[str, tuple[int, str]]
) -> None:
    by_name = {m.full_name: m for m in _messages(module.DESCRIPTOR)}
    message = by_name[name]
    actual = {f.name: (f.number, _field_type(f)) for f in message.fields}
    assert actual == expected
    # Gazette declares no oneofs (RecordedOp is a union by convention only)
    # and no proto3 `optional` (which would appear as synthetic oneofs).
    assert [o.name for o in message.oneofs] == []


def test_enums_match_gazette() -> None:
    actual: dict[str, dict[str, int]] = {}
    for module, _pkg, _table in FILES:
        for enum in _enums(module.DESCRIPTOR):
            actual[enum.full_name] = {v.name: v.number for v in enum.values}
    assert actual == ENUMS


def test_services_match_gazette() -> None:
    actual: dict[str, dict[str, tuple[str, str, bool, bool]]] = {}
    for module, _pkg, _table in FILES:
        for service in module.DESCRIPTOR.services_by_name.values():
            actual[service.full_name] = {
                m.name: (
                    m.input_type.full_name,
                    m.output_type.full_name,
                    m.client_streaming,
                    m.server_streaming,
                )
                for m in service.methods
            }
    assert actual == SERVICES


def test_grpc_method_paths() -> None:
    # gRPC routes on "/<package>.<Service>/<Method>"; spot-check what Go
    # clients dial.
    journal = protocol_pb2.DESCRIPTOR.services_by_name["Journal"]
    shard = consumer_pb2.DESCRIPTOR.services_by_name["Shard"]
    paths = {f"/{s.full_name}/{m.name}" for s in (journal, shard) for m in s.methods}
    assert "/protocol.Journal/Append" in paths
    assert "/protocol.Journal/Replicate" in paths
    assert "/consumer.Shard/Stat" in paths


# --- exact bytes -------------------------------------------------------------


def _assert_wire(message: Message, expected_hex: str) -> None:
    expected = bytes.fromhex(expected_hex)
    assert message.SerializeToString(deterministic=True).hex() == expected.hex()
    parsed = type(message).FromString(expected)
    assert parsed == message


def test_fragment_bytes() -> None:
    fragment = protocol_pb2.Fragment(
        journal="a/j",
        begin=1,
        end=257,
        sum=protocol_pb2.SHA1Sum(part1=1, part2=2, part3=3),
        compression_codec=protocol_pb2.GZIP,
    )
    _assert_wire(
        fragment,
        "0a03612f6a"  # 1 journal, LEN 3, "a/j"
        "1001"  # 2 begin, varint 1
        "188102"  # 3 end, varint 257 = 0x81 0x02
        "2217"  # 4 sum, LEN 23:
        "090100000000000000"  # . 1 part1, fixed64 1 (little-endian)
        "110200000000000000"  # . 2 part2, fixed64 2
        "1d03000000"  # . 3 part3, fixed32 3
        "2802",  # 5 compression_codec, varint GZIP=2
    )


def test_append_request_bytes() -> None:
    request = protocol_pb2.AppendRequest(
        journal="j",
        content=b"hi",
        offset=100,
        check_registers=protocol_pb2.LabelSelector(
            include=protocol_pb2.LabelSet(labels=[protocol_pb2.Label(name="k", value="v")])
        ),
        suspend=protocol_pb2.AppendRequest.SUSPEND_NO_RESUME,
    )
    _assert_wire(
        request,
        "12016a"  # 2 journal, LEN 1, "j"
        "22026869"  # 4 content, LEN 2, "hi"
        "2864"  # 5 offset, varint 100
        "320a"  # 6 check_registers, LEN 10:
        "0a08"  # . 1 include (LabelSet), LEN 8:
        "0a06"  # . . 1 labels (Label), LEN 6:
        "0a016b"  # . . . 1 name "k"
        "120176"  # . . . 2 value "v"
        "4801",  # 9 suspend, varint SUSPEND_NO_RESUME=1
    )


def test_journal_spec_suspend_bytes() -> None:
    spec = protocol_pb2.JournalSpec(
        name="j",
        suspend=protocol_pb2.JournalSpec.Suspend(
            level=protocol_pb2.JournalSpec.Suspend.FULL, offset=9
        ),
    )
    _assert_wire(
        spec,
        "0a016a"  # 1 name "j"
        "4204"  # 8 suspend, LEN 4:
        "0802"  # . 1 level, varint FULL=2
        "1009",  # . 2 offset, varint 9
    )


def test_header_etcd_bytes() -> None:
    header = protocol_pb2.Header(
        process_id=protocol_pb2.ProcessSpec.ID(zone="z", suffix="s"),
        route=protocol_pb2.Route(primary=-1),
        etcd=protocol_pb2.Header.Etcd(cluster_id=1, member_id=2, revision=300, raft_term=4),
    )
    _assert_wire(
        header,
        "0a06"  # 1 process_id, LEN 6:
        "0a017a"  # . 1 zone "z"
        "120173"  # . 2 suffix "s"
        "120b"  # 2 route, LEN 11:
        "10ffffffffffffffffff01"  # . 2 primary, int32 -1 as 10-byte varint
        "1a09"  # 3 etcd, LEN 9:
        "0801"  # . 1 cluster_id 1
        "1002"  # . 2 member_id 2
        "18ac02"  # . 3 revision 300 = 0xac 0x02
        "2004",  # . 4 raft_term 4
    )


def test_checkpoint_bytes() -> None:
    checkpoint = consumer_pb2.Checkpoint(
        sources={
            "j": consumer_pb2.Checkpoint.Source(
                read_through=5,
                producers=[
                    consumer_pb2.Checkpoint.Source.ProducerEntry(
                        id=bytes.fromhex("010203040506"),
                        state=consumer_pb2.Checkpoint.ProducerState(last_ack=7, begin=-1),
                    )
                ],
            )
        },
        ack_intents={"j": b"\x01"},
    )
    _assert_wire(
        checkpoint,
        "0a27"  # 1 sources (map entry), LEN 39:
        "0a016a"  # . 1 key "j"
        "1222"  # . 2 value (Source), LEN 34:
        "0805"  # . . 1 read_through 5
        "121e"  # . . 2 producers (ProducerEntry), LEN 30:
        "0a06010203040506"  # . . . 1 id, 6 bytes
        "1214"  # . . . 2 state (ProducerState), LEN 20:
        "090700000000000000"  # . . . . 1 last_ack, fixed64 7
        "10ffffffffffffffffff01"  # . . . . 2 begin, int64 -1
        "1206"  # 2 ack_intents (map entry), LEN 6:
        "0a016a"  # . 1 key "j"
        "120101",  # . 2 value, LEN 1, 0x01
    )


def test_replica_status_sparse_enum_bytes() -> None:
    replica = consumer_pb2.ReplicaStatus(code=consumer_pb2.ReplicaStatus.FAILED, errors=["x"])
    _assert_wire(
        replica,
        "089003"  # 1 code, varint FAILED=400 = 0x90 0x03
        "120178",  # 2 errors, "x"
    )


def test_recorded_op_bytes() -> None:
    op = recorded_op_pb2.RecordedOp(
        seq_no=2,
        checksum=0xDEADBEEF,
        author=0x01020304,
        write=recorded_op_pb2.RecordedOp.Write(fnode=1, offset=10, length=3),
    )
    _assert_wire(
        op,
        "0802"  # 1 seq_no 2
        "15efbeadde"  # 2 checksum, fixed32 0xdeadbeef little-endian
        "1d04030201"  # 3 author, fixed32 0x01020304 little-endian
        "3a06"  # 7 write, LEN 6:
        "0801"  # . 1 fnode 1
        "100a"  # . 2 offset 10
        "1803",  # . 3 length 3
    )


def test_fsm_hints_bytes() -> None:
    hints = recorded_op_pb2.FSMHints(
        log="l",
        live_nodes=[
            recorded_op_pb2.FnodeSegments(
                fnode=3,
                segments=[recorded_op_pb2.Segment(author=1, first_seq_no=3, last_seq_no=4)],
            )
        ],
        properties=[recorded_op_pb2.Property(path="p", content="c")],
    )
    _assert_wire(
        hints,
        "0a016c"  # 1 log "l"
        "120d"  # 2 live_nodes (FnodeSegments), LEN 13:
        "0803"  # . 1 fnode 3
        "1209"  # . 2 segments (Segment), LEN 9:
        "0d01000000"  # . . 1 author, fixed32 1
        "1003"  # . . 2 first_seq_no 3
        "2804"  # . . 5 last_seq_no 4
        "1a06"  # 3 properties (Property), LEN 6:
        "0a0170"  # . 1 path "p"
        "120163",  # . 2 content "c"
    )


def test_unknown_fields_are_preserved() -> None:
    # A newer Gazette may add fields; a proxying broker must pass them on.
    data = bytes.fromhex(
        "0a016a"  # 1 journal "j"
        "980601"  # 99 (unknown to Fragment), varint 1: tag 99 << 3 = 792 = 0x98 0x06
    )
    fragment = protocol_pb2.Fragment.FromString(data)
    assert fragment.journal == "j"
    assert fragment.SerializeToString() == data


# --- Fields of Gazette's current protocol (issue 15): bytes a Go peer sends or expects ---------


def test_append_request_suspend_keep_and_min_etcd_revision_bytes() -> None:
    request = protocol_pb2.AppendRequest(
        journal="j", suspend=protocol_pb2.AppendRequest.SUSPEND_KEEP, min_etcd_revision=300
    )
    _assert_wire(
        request,
        "12016a"  # 2 journal "j"
        "4804"  # 9 suspend, varint SUSPEND_KEEP=4
        "50ac02",  # 10 min_etcd_revision, varint 300
    )


def test_read_request_min_etcd_revision_bytes() -> None:
    _assert_wire(
        protocol_pb2.ReadRequest(journal="j", min_etcd_revision=9),
        "12016a"  # 2 journal "j"
        "4809",  # 9 min_etcd_revision, varint 9
    )


def test_fragment_store_health_request_bytes() -> None:
    request = protocol_pb2.FragmentStoreHealthRequest(
        fragment_store="s", check_delete=True, check_delete_prefix="p/"
    )
    _assert_wire(
        request,
        "0a0173"  # 1 fragment_store "s"
        "1001"  # 2 check_delete, varint true
        "1a02702f",  # 3 check_delete_prefix, LEN 2, "p/"
    )


def test_consumer_spec_exiting_and_shard_create_revision_bytes() -> None:
    _assert_wire(
        consumer_pb2.ConsumerSpec(shard_limit=2, exiting=True),
        "1002"  # 2 shard_limit, varint 2
        "1801",  # 3 exiting, varint true
    )
    _assert_wire(
        consumer_pb2.ListResponse.Shard(mod_revision=7, create_revision=5),
        "1007"  # 2 mod_revision, varint 7
        "2805",  # 5 create_revision, varint 5
    )


def test_apply_change_primary_hints_bytes() -> None:
    change = consumer_pb2.ApplyRequest.Change(
        expect_mod_revision=-1, primary_hints=recorded_op_pb2.FSMHints(log="l")
    )
    _assert_wire(
        change,
        "08ffffffffffffffffff01"  # 1 expect_mod_revision, int64 -1 as 10-byte varint
        "2203"  # 4 primary_hints, LEN 3:
        "0a016c",  # . 1 log "l"
    )
