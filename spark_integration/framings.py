"""The payloads a read takes besides JSON lines: CSV records and fixed-framed protobuf messages.

JSON lines have their bulk decoder (json_lines.py). CSV (`text/csv`) and protobuf
(`application/x-protobuf-fixed`) journals are decoded by the framings Gazette's readers use
(gazette_consumer.message), message by message (`ChunkDecoder`), into MessageBatches:

- CSV: a record's first field is its UUID (Gazette's CSVRecord); the `content` column is the
  record as text, and schema fields are read from the fields after the UUID, in order.
- protobuf: option protobufClass names the message class ("module:Class"); `content` is the
  payload (BINARY), and schema fields are the message's fields by name (as
  `json_format.MessageToDict` gives them, with the proto field names). The UUID is found as
  the message's `get_uuid()` (a class implementing Gazette's Message), else a string field
  `uuid` (or `UUID`), else a `uuid` field holding Go's `UUIDParts` (`node`: the ProducerID
  and flags, `clock`).

Content that does not frame or decode fails the read with GazetteJournalError naming offsets.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any
from uuid import UUID

import pyarrow as pa

from broker.protocol import labels
from gazette_consumer.message.csv_framing import CSVFraming, CSVRecord, encode_record
from gazette_consumer.message.message import Envelope
from gazette_consumer.message.protobuf_framing import FixedFraming
from gazette_consumer.message.uuid import build_uuid
from gazette_consumer.sequencer.decode import ChunkDecoder
from spark_integration.journal_io import GazetteJournalError
from spark_integration.json_lines import JSONLinesDecoder
from spark_integration.message_batch import MessageBatch, batch_of_envelopes
from spark_integration.range_decode import BatchDecoder, DecoderFactory

_LOW_48 = (1 << 48) - 1


class _ProtobufMessage:
    """A protobuf payload, parsed with the class of option protobufClass, and its UUID."""

    __slots__ = ("message", "payload", "uuid")
    message_class: Any = None

    def __init__(self, payload: bytes, message: Any, uuid: UUID | None) -> None:
        self.payload = payload
        self.message = message
        self.uuid = uuid

    def get_uuid(self) -> UUID | None:
        return self.uuid


def protobuf_type(class_path: str) -> type[_ProtobufMessage]:
    """A message type for `FixedFraming` decoding payloads with `class_path`'s class."""
    module_name, _, name = class_path.partition(":")
    try:
        message_class = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as err:
        raise GazetteJournalError(
            f"protobufClass {class_path!r} cannot be imported: {err}"
        ) from None

    class Parsed(_ProtobufMessage):
        @classmethod
        def FromString(cls, payload: bytes) -> Parsed:
            message = message_class.FromString(payload)
            return cls(payload, message, uuid_of_protobuf(message))

    return Parsed


def uuid_of_protobuf(message: Any) -> UUID | None:
    """The UUID of a protobuf message (see the module docstring)."""
    get_uuid = getattr(message, "get_uuid", None)
    if callable(get_uuid):
        uuid = get_uuid()
        return uuid if isinstance(uuid, UUID) else None
    for name in ("uuid", "UUID"):
        value = getattr(message, name, None)
        if isinstance(value, str):
            return UUID(value) if value else None
        if value is not None and hasattr(value, "node") and hasattr(value, "clock"):
            node, clock = int(value.node), int(value.clock)
            if not node and not clock:
                return None
            producer = (node >> 16 & _LOW_48).to_bytes(6, "big")
            return build_uuid(producer, clock, node & 0x3FF)  # type: ignore[arg-type]
    return None


def protobuf_fields(payload: bytes, class_path: str) -> Mapping[str, Any] | None:
    from google.protobuf import json_format

    module_name, _, name = class_path.partition(":")
    message_class = getattr(importlib.import_module(module_name), name)
    message = message_class.FromString(payload)
    # Fields at their default value too: proto3 does not encode a 0, which is still a 0.
    fields: dict[str, Any] = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    # Protobuf's JSON mapping writes 64-bit integers as text: give top-level ones back as the
    # integers they are, so that they fill integer columns.
    for name, value in fields.items():
        if isinstance(value, str) and isinstance(getattr(message, name, None), int):
            fields[name] = getattr(message, name)
        elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            numbers = list(getattr(message, name, ()))
            if numbers and all(isinstance(v, int) for v in numbers):
                fields[name] = numbers
    return fields


class FramedDecoder:
    """A BatchDecoder over a Gazette framing, message by message (see the module docstring)."""

    def __init__(
        self,
        journal: str,
        offset: int,
        decoder: ChunkDecoder,
        content: Callable[[list[Envelope[Any]]], pa.Array],
    ) -> None:
        self.journal = journal
        self._decoder = decoder
        self._content = content
        self._begin = offset

    def feed(self, content: bytes, offset: int) -> list[MessageBatch]:
        return self._batch(self._decoder.feed(content, offset))

    def flush(self) -> list[MessageBatch]:
        return self._batch(self._decoder.flush())

    def _batch(self, envelopes: list[Envelope[Any]]) -> list[MessageBatch]:
        decoder = self._decoder
        if decoder.error is not None:
            raise GazetteJournalError(f"journal {self.journal!r}: {decoder.error}")
        if decoder.skipped_bytes:
            raise GazetteJournalError(
                f"journal {self.journal!r}: content before offset {decoder.through} that does"
                " not frame (a message cut short, or longer than the limit)"
            )
        if not envelopes:
            return []
        return [batch_of_envelopes(self.journal, envelopes, self._content(envelopes))]


def _csv_content(envelopes: list[Envelope[Any]]) -> pa.Array:
    return pa.array([encode_record(env.message)[:-1].decode() for env in envelopes], pa.string())


def _protobuf_content(envelopes: list[Envelope[Any]]) -> pa.Array:
    return pa.array([env.message.payload for env in envelopes], pa.binary())


def decoder_factory(content_type: str, protobuf_class: str = "") -> DecoderFactory:
    """The BatchDecoder of journals of `content_type`."""
    if content_type == labels.CONTENT_TYPE_CSV:

        def csv(journal: str, offset: int) -> BatchDecoder:
            framing = CSVFraming()
            chunks = ChunkDecoder(journal, offset, framing, framing.new_decoder(CSVRecord))
            return FramedDecoder(journal, offset, chunks, _csv_content)

        return csv
    if content_type == labels.CONTENT_TYPE_PROTO_FIXED:
        message_type = protobuf_type(protobuf_class)

        def protobuf(journal: str, offset: int) -> BatchDecoder:
            framing = FixedFraming()
            chunks = ChunkDecoder(journal, offset, framing, framing.new_decoder(message_type))
            return FramedDecoder(journal, offset, chunks, _protobuf_content)

        return protobuf
    return JSONLinesDecoder
