"""Conversions between the keyspace's dataclasses (backend.py) and etcd's v3 messages, both
ways: headers, key-values, events, compares and transaction operations. Pure functions."""

from __future__ import annotations

from broker.keyspace import backend as b
from broker.keyspace.etcdpb import kv_pb2, rpc_pb2

compare_fields = {
    b.CompareTarget.VERSION: "version",
    b.CompareTarget.CREATE: "create_revision",
    b.CompareTarget.MOD: "mod_revision",
    b.CompareTarget.VALUE: "value",
    b.CompareTarget.LEASE: "lease",
}


def header(h: rpc_pb2.ResponseHeader) -> b.Header:
    return b.Header(
        revision=h.revision, cluster_id=h.cluster_id, member_id=h.member_id, raft_term=h.raft_term
    )


def kv(kv: kv_pb2.KeyValue) -> b.KeyValue:
    return b.KeyValue(
        key=kv.key,
        value=kv.value,
        create_revision=kv.create_revision,
        mod_revision=kv.mod_revision,
        version=kv.version,
        lease=kv.lease,
    )


def event(ev: kv_pb2.Event) -> b.Event:
    return b.Event(b.EventType(ev.type), kv(ev.kv))


def compare(index: int, c: b.Compare) -> rpc_pb2.Compare:
    is_value = c.target is b.CompareTarget.VALUE
    # bool is an int subclass but never a meaningful revision, version or lease.
    if is_value != isinstance(c.value, bytes) or isinstance(c.value, bool):
        want = "bytes" if is_value else "int"
        raise TypeError(
            f"compares[{index}].value: {c.target.name} compares take {want} "
            f"(got {type(c.value).__name__})"
        )
    msg = rpc_pb2.Compare(
        key=c.key,
        # Our enums mirror etcd's by name and number.
        target=c.target.name,
        result=c.result.name,
    )
    setattr(msg, compare_fields[c.target], c.value)
    return msg


def request_op(op: b.Op) -> rpc_pb2.RequestOp:
    if isinstance(op, b.OpPut):
        put = rpc_pb2.PutRequest(key=op.key, value=op.value, lease=op.lease)
        return rpc_pb2.RequestOp(request_put=put)
    if isinstance(op, b.OpDelete):
        delete = rpc_pb2.DeleteRangeRequest(key=op.key, range_end=op.range_end or b"")
        return rpc_pb2.RequestOp(request_delete_range=delete)
    if isinstance(op, b.OpGet):
        get = rpc_pb2.RangeRequest(key=op.key, range_end=op.range_end or b"")
        return rpc_pb2.RequestOp(request_range=get)
    raise TypeError(f"txn op: expected OpPut, OpDelete or OpGet (got {type(op).__name__})")


def op_result(r: rpc_pb2.ResponseOp) -> tuple[b.KeyValue, ...] | int | None:
    kind = r.WhichOneof("response")
    if kind == "response_range":
        return tuple(kv(item) for item in r.response_range.kvs)
    if kind == "response_delete_range":
        return int(r.response_delete_range.deleted)
    return None
