"""JSON-lines messages as the data source sees them: the line itself, plus its Gazette UUID.

Reading, a DataFrame row carries the JSON line as written (`content`), so the decoder keeps each
line and parses only its "UUID" field, which the Sequencer needs. Writing, a row becomes a JSON
object to which the Publisher adds the "UUID" field, as Gazette's Go JSON messages carry it: Go
and Python consumers of the journal read these messages like any others.
"""

from __future__ import annotations

from typing import Any, Final
from uuid import UUID

import msgspec

from gazette_consumer.message.framing import Frame, MessageDecodeError
from gazette_consumer.message.json_framing import JSONFraming
from gazette_consumer.message.message import UUID_ATTRIBUTE, UUIDOf
from gazette_consumer.message.uuid import NIL_UUID
from gazette_consumer.sequencer.decode import ChunkDecoder

UUID_FIELD: Final = "UUID"


class _UUIDOnly(msgspec.Struct):
    # Other fields are skipped by msgspec without being materialised.
    uuid: UUID = msgspec.field(default=NIL_UUID, name=UUID_FIELD)


class RawLine:
    """A read JSON line (without its newline) and its UUID (None if it has none)."""

    __slots__ = ("line", "uuid")

    def __init__(self, line: bytes, uuid: UUID | None) -> None:
        self.line = line
        self.uuid = uuid

    def get_uuid(self) -> UUID | None:
        return self.uuid

    def set_uuid(self, uuid: UUID) -> None:
        self.uuid = uuid

    def new_acknowledgement(self, journal: str) -> RawLine:
        return RawLine(b"{}", None)


class RawLineDecoder:
    """A framing decoder (see `ChunkDecoder`) producing RawLines, with the batch fast path."""

    uuid_of: Final[UUIDOf] = UUID_ATTRIBUTE
    """A RawLine keeps its UUID (or None) in its ``uuid`` attribute: `EnvelopeBuilder` reads
    the attribute itself for `UUID_ATTRIBUTE`, where calling a function costs a Python frame
    per line."""

    def __init__(self) -> None:
        self._decoder = msgspec.json.Decoder(_UUIDOnly)

    def _line(self, payload: bytes) -> RawLine:
        uuid = self._decoder.decode(payload).uuid
        return RawLine(payload, None if uuid.int == 0 else uuid)

    def decode_payloads(self, payloads: list[bytes]) -> list[RawLine]:
        return [self._line(p) for p in payloads]

    def decode(self, frame: Frame) -> RawLine:
        data = frame.data[:-1] if frame.data.endswith(b"\n") else frame.data
        try:
            return self._line(data)
        except msgspec.DecodeError as err:  # ValidationError (a bad UUID) is a subclass.
            raise MessageDecodeError(
                frame.journal, frame.begin, frame.end, f"not a JSON object with a UUID: {err}"
            ) from err


def new_decoder(journal: str, offset: int) -> ChunkDecoder:
    """A ChunkDecoder of a JSON-lines journal from `offset`, into RawLines."""
    return ChunkDecoder(journal, offset, JSONFraming(), RawLineDecoder())


class JSONRow(dict[str, Any]):
    """A row to publish: a JSON object that takes its UUID as a field (msgspec encodes it as a
    plain dict)."""

    __slots__ = ()

    def get_uuid(self) -> UUID | None:
        value = self.get(UUID_FIELD)
        return UUID(value) if isinstance(value, str) else None

    def set_uuid(self, uuid: UUID) -> None:
        self[UUID_FIELD] = str(uuid)

    def new_acknowledgement(self, journal: str) -> JSONRow:
        return JSONRow()
