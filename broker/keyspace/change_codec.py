"""The bytes of a Change (a write-ahead log record) and of a StoreState (a snapshot). Sans-IO.

A small fixed binary layout (little-endian, length-prefixed bytes) rather than JSON or
protobuf: keys and values are arbitrary bytes, and replaying the log is start-up time. Framing
and checksums are wal.py's; a payload that passes its checksum yet does not decode here is a bug
or a foreign file, reported as ChangeDecodeError.

Layouts (i64: signed 64-bit, u32: unsigned 32-bit, bytes: u32 length + content):

    event      u8 type, i64 create, i64 mod, i64 version, i64 lease, bytes key, bytes value
    change     u8 kind, then per kind:
                 1 committed      i64 revision, u32 n, n events
                 2 lease granted  i64 lease ID, i64 TTL (s)
                 3 lease revoked  i64 lease ID, i64 revision (0: no keys), u32 n, n events
                 4 compacted      i64 revision
    state      u32 format, i64 revision, i64 compact revision, i64 next lease ID,
               u32 n, n (i64 lease ID, i64 TTL), u32 n, n last events, u32 n, n KeyValues
               (a KeyValue is an event's layout without the type)
"""

from __future__ import annotations

import struct

from broker.keyspace.backend import Event, EventType, KeyValue
from broker.keyspace.changes import (
    Change,
    Commit,
    Committed,
    Compacted,
    LeaseGranted,
    LeaseRevoked,
    StoreState,
)

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_KV_HEAD = struct.Struct("<qqqqII")  # create, mod, version, lease, key length, value length

_COMMITTED, _LEASE_GRANTED, _LEASE_REVOKED, _COMPACTED = 1, 2, 3, 4
_STATE_FORMAT = 1


class ChangeDecodeError(ValueError):
    """A record's payload is not a change (or a snapshot's is not a state) this code wrote."""


def encode_change(change: Change) -> bytes:
    out = bytearray()
    match change:
        case Committed(commit):
            out += _U8.pack(_COMMITTED) + _I64.pack(commit.revision)
            _put_events(out, commit.events)
        case LeaseGranted(lease_id, ttl_s):
            out += _U8.pack(_LEASE_GRANTED) + _I64.pack(lease_id) + _I64.pack(ttl_s)
        case LeaseRevoked(lease_id, commit):
            out += _U8.pack(_LEASE_REVOKED) + _I64.pack(lease_id)
            out += _I64.pack(commit.revision if commit is not None else 0)
            _put_events(out, commit.events if commit is not None else ())
        case Compacted(revision):
            out += _U8.pack(_COMPACTED) + _I64.pack(revision)
    return bytes(out)


def decode_change(data: bytes) -> Change:
    """The change ``data`` encodes. Its commits carry no priors (``None`` for each event):
    MVCCStore.redo recomputes them from the state they are applied to."""
    r = _Reader(data)
    kind = r.u8()
    change: Change
    if kind == _COMMITTED:
        revision = r.i64()
        change = Committed(_commit(revision, r.events()))
    elif kind == _LEASE_GRANTED:
        change = LeaseGranted(r.i64(), r.i64())
    elif kind == _LEASE_REVOKED:
        lease_id, revision, events = r.i64(), r.i64(), r.events()
        if (revision == 0) != (not events):
            raise ChangeDecodeError("lease revocation: revision and events disagree")
        change = LeaseRevoked(lease_id, _commit(revision, events) if events else None)
    elif kind == _COMPACTED:
        change = Compacted(r.i64())
    else:
        raise ChangeDecodeError(f"unknown change kind {kind}")
    r.end()
    return change


def encode_state(state: StoreState) -> bytes:
    out = bytearray(_U32.pack(_STATE_FORMAT))
    out += _I64.pack(state.revision) + _I64.pack(state.compact_revision)
    out += _I64.pack(state.next_lease_id) + _U32.pack(len(state.leases))
    for lease_id, ttl_s in state.leases:
        out += _I64.pack(lease_id) + _I64.pack(ttl_s)
    _put_events(out, state.last_events)
    out += _U32.pack(len(state.kvs))
    for kv in state.kvs:
        _put_kv(out, kv)
    return bytes(out)


def decode_state(data: bytes) -> StoreState:
    r = _Reader(data)
    if (fmt := r.u32()) != _STATE_FORMAT:
        raise ChangeDecodeError(f"snapshot format {fmt} is not {_STATE_FORMAT}")
    revision, compact_revision, next_lease_id = r.i64(), r.i64(), r.i64()
    leases = tuple((r.i64(), r.i64()) for _ in range(r.u32()))
    last_events = r.events()
    kvs = tuple(r.kv() for _ in range(r.u32()))
    r.end()
    return StoreState(revision, compact_revision, next_lease_id, leases, kvs, last_events)


def _commit(revision: int, events: tuple[Event, ...]) -> Commit:
    return Commit(revision, events, (None,) * len(events))


def _put_events(out: bytearray, events: tuple[Event, ...]) -> None:
    out += _U32.pack(len(events))
    for event in events:
        out += _U8.pack(event.type)
        _put_kv(out, event.kv)


def _put_kv(out: bytearray, kv: KeyValue) -> None:
    out += _KV_HEAD.pack(
        kv.create_revision, kv.mod_revision, kv.version, kv.lease, len(kv.key), len(kv.value)
    )
    out += kv.key
    out += kv.value


class _Reader:
    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def _unpack(self, s: struct.Struct) -> tuple[int, ...]:
        if self._pos + s.size > len(self._data):
            raise ChangeDecodeError(f"truncated at byte {self._pos} of {len(self._data)}")
        values = s.unpack_from(self._data, self._pos)
        self._pos += s.size
        return values

    def u8(self) -> int:
        return self._unpack(_U8)[0]

    def u32(self) -> int:
        return self._unpack(_U32)[0]

    def i64(self) -> int:
        return self._unpack(_I64)[0]

    def kv(self) -> KeyValue:
        create, mod, version, lease, key_len, value_len = self._unpack(_KV_HEAD)
        end = self._pos + key_len + value_len
        if end > len(self._data):
            raise ChangeDecodeError(f"truncated key/value at byte {self._pos}")
        key = self._data[self._pos : self._pos + key_len]
        value = self._data[self._pos + key_len : end]
        self._pos = end
        return KeyValue(key, value, create, mod, version, lease)

    def events(self) -> tuple[Event, ...]:
        events = []
        for _ in range(self.u32()):
            kind = self.u8()
            if kind not in (EventType.PUT, EventType.DELETE):
                raise ChangeDecodeError(f"unknown event type {kind}")
            events.append(Event(EventType(kind), self.kv()))
        return tuple(events)

    def end(self) -> None:
        if self._pos != len(self._data):
            raise ChangeDecodeError(f"{len(self._data) - self._pos} bytes left over")
