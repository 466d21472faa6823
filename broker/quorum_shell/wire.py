"""The quorum replication RPC's wire form (sans-IO): one envelope per protocol message.

Quorum journals are replicated over a service of their own, `gazette.quorum.Replica`, so that
`protocol.Journal` and every Gazette message keep their fields (Go clients and brokers never
see it). Its one method, `Deliver`, carries an envelope: the journal, the destination node and
one message of broker/quorum/messages.py. The core is built for a network that drops,
duplicates and reorders, so delivery is one unary call per message, fire and forget; answers
are messages of their own.

Encoding: JSON with a type tag per value and base64 for entry content. Fields added after
format 1 (`_OPTIONAL_FIELDS`: the registers of entries and bases, the leader's head on
Truncate and Snapshot, a lost member's nonce on its answers and its alignment) are left out while they hold
their default and filled with it when absent, so that brokers without them still decode what
a journal without registers sends, and this one decodes theirs. Decoding accepts only
the protocol's own value types (a fixed table: nothing is instantiated by name beyond it) and
raises `WireDecodeError` naming what was wrong. A protobuf service would be leaner; JSON keeps
this slice small, and the envelope carries a format number so that a later encoding can
replace it.

Types a receiver does not know. A broker of an earlier version refuses a message of a type
added since with INVALID_ARGUMENT "quorum deliver: unknown type '<name>'" (`UnknownTypeError`,
the wording every version has used); the sender's transport recognises exactly that refusal
(`refused_type`) and reports it to the sender as a typed outcome, apart from a lost message.
The read index's two messages (`ReadIndexAsk`, `ReadIndexAnswer`: broker/quorum/read_index.py,
`READ_INDEX_TYPES`) are such types during a rolling upgrade: an upgraded follower whose ask an
older leader refuses serves non-blocking reads, for that leader's term, up to its own commit
offset as before the read index (committed content, not read-your-writes), and says so once
per term in a warning (quorum_shell/read_barrier.py). Replication itself is unaffected.
`decode_envelope(raw, unknown=...)` decodes as such an older broker does (tests).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

from broker.quorum.entry import Entry, EntryId, LogBase
from broker.quorum.messages import (
    AddFollower,
    BecomeLeader,
    Heartbeat,
    NewTerm,
    NewTermResponse,
    ReplicaResponse,
    Replicate,
    ReplyStatus,
    Snapshot,
    Truncate,
)
from broker.quorum.read_index import ReadIndexAnswer, ReadIndexAsk

WIRE_FORMAT = 1
SERVICE = "gazette.quorum.Replica"
DELIVER_METHOD = f"/{SERVICE}/Deliver"
# An envelope larger than this is refused on decode (a Replicate message is at most
# QuorumConfig.replicate_bytes_max of content, a third more in base64).
ENVELOPE_BYTES_MAX = 4 << 20

_TYPES: dict[str, type] = {
    t.__name__: t
    for t in (
        AddFollower,
        BecomeLeader,
        Entry,
        EntryId,
        Heartbeat,
        LogBase,
        NewTerm,
        NewTermResponse,
        ReadIndexAnswer,
        ReadIndexAsk,
        ReplicaResponse,
        Replicate,
        Snapshot,
        Truncate,
    )
}
MESSAGE_TYPES = (
    AddFollower,
    BecomeLeader,
    Heartbeat,
    NewTerm,
    NewTermResponse,
    ReadIndexAnswer,
    ReadIndexAsk,
    ReplicaResponse,
    Replicate,
    Snapshot,
    Truncate,
)


# (type, field) added after format 1: left out when at their default, defaulted when absent.
_OPTIONAL_FIELDS = frozenset(
    {
        ("Entry", "registers"),
        ("LogBase", "registers"),
        ("Truncate", "leader_head"),
        ("Snapshot", "leader_head"),
        ("NewTermResponse", "nonce"),
        ("ReplicaResponse", "nonce"),
        ("Truncate", "nonce"),
        ("Snapshot", "nonce"),
        ("Heartbeat", "established"),
        ("BecomeLeader", "changing"),
    }
)


class WireDecodeError(ValueError):
    """An envelope that is not a valid quorum message."""


class UnknownTypeError(WireDecodeError):
    """A value of a type this decoder does not know (a sender of a later version)."""

    def __init__(self, type_name: object) -> None:
        super().__init__(f"unknown type {type_name!r}")
        self.type_name = type_name


# The types the read index added (a broker of an earlier version refuses them).
READ_INDEX_TYPES = frozenset({ReadIndexAsk.__name__, ReadIndexAnswer.__name__})
# How the receiving broker's Deliver handler words a refused envelope (transport.py), and the
# refusal of an unknown type within it: what `refused_type` recognises.
REFUSAL_PREFIX = "quorum deliver: "
_UNKNOWN_TYPE_REFUSAL = re.compile(re.escape(REFUSAL_PREFIX) + r"unknown type '(\w+)'")


def refused_type(details: str) -> str | None:
    """The type named by a receiver's INVALID_ARGUMENT refusal `details` if it refused a type
    its decoder does not know (see the module docstring); None for any other refusal."""
    match = _UNKNOWN_TYPE_REFUSAL.fullmatch(details)
    return match.group(1) if match else None


@dataclass(frozen=True, slots=True)
class Envelope:
    journal: str
    to: str  # the destination node's name (a member, or a member's coordinator)
    message: object


def _encode_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"@b": base64.b64encode(value).decode()}
    if isinstance(value, ReplyStatus):
        return {"@s": value.value}
    if isinstance(value, tuple):
        return [_encode_value(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if _TYPES.get(name) is not type(value):
            raise TypeError(f"not a quorum wire type: {name}")
        out = {"@": name}
        for f in dataclasses.fields(value):
            field_value = getattr(value, f.name)
            if (name, f.name) in _OPTIONAL_FIELDS and field_value == f.default:
                continue
            out[f.name] = _encode_value(field_value)
        return out
    if isinstance(value, str | int):  # bools included (NewTermResponse.voter)
        return value
    raise TypeError(f"not a quorum wire value: {value!r}")


def _decode_value(doc: Any, unknown: frozenset[str]) -> Any:
    if isinstance(doc, list):
        return tuple(_decode_value(v, unknown) for v in doc)
    if isinstance(doc, dict):
        if "@b" in doc:
            return base64.b64decode(doc["@b"], validate=True)
        if "@s" in doc:
            return ReplyStatus(doc["@s"])
        name = doc.get("@", "")
        cls = None if name in unknown else _TYPES.get(name)
        if cls is None:
            raise UnknownTypeError(doc.get("@"))
        names = {f.name for f in dataclasses.fields(cls)}
        optional = {n for n in names if (cls.__name__, n) in _OPTIONAL_FIELDS}
        given = set(doc) - {"@"}
        if not names - optional <= given <= names:
            raise WireDecodeError(f"{cls.__name__}: fields {sorted(given)} (want {sorted(names)})")
        value = cls(**{k: _decode_value(v, unknown) for k, v in doc.items() if k != "@"})
        registers = getattr(value, "registers", None)
        if registers is not None and not _is_registers(registers):
            raise WireDecodeError(f"{cls.__name__}: registers must be [name, value] strings")
        return value
    if isinstance(doc, str | int):  # bools included (NewTermResponse.voter)
        return doc
    raise WireDecodeError(f"unexpected value {doc!r}")


def _is_registers(value: object) -> bool:
    return isinstance(value, tuple) and all(
        isinstance(label, tuple) and len(label) == 2 and all(isinstance(t, str) for t in label)
        for label in value
    )


def encode_envelope(envelope: Envelope) -> bytes:
    if not isinstance(envelope.message, MESSAGE_TYPES):
        raise TypeError(f"not a quorum message: {envelope.message!r}")
    doc = {
        "format": WIRE_FORMAT,
        "journal": envelope.journal,
        "to": envelope.to,
        "message": _encode_value(envelope.message),
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_envelope(raw: bytes, *, unknown: frozenset[str] = frozenset()) -> Envelope:
    """The envelope `raw` holds; WireDecodeError naming what was wrong. `unknown`: type names
    decoded as a broker without them does (refused with UnknownTypeError)."""
    if len(raw) > ENVELOPE_BYTES_MAX:
        raise WireDecodeError(f"envelope of {len(raw)} bytes (max {ENVELOPE_BYTES_MAX})")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise WireDecodeError(f"envelope is not JSON: {err}") from err
    if not isinstance(doc, dict) or doc.get("format") != WIRE_FORMAT:
        raise WireDecodeError(f"envelope format must be {WIRE_FORMAT}")
    journal, to = doc.get("journal"), doc.get("to")
    if not isinstance(journal, str) or not isinstance(to, str):
        raise WireDecodeError("envelope: journal and to must be strings")
    try:
        message = _decode_value(doc.get("message"), unknown)
    except (TypeError, ValueError) as err:
        if isinstance(err, WireDecodeError):
            raise
        raise WireDecodeError(f"envelope message: {err}") from err
    if not isinstance(message, MESSAGE_TYPES):
        raise WireDecodeError(f"envelope message is not a quorum message: {message!r}")
    return Envelope(journal, to, message)
