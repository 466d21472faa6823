"""CSV framing (``text/csv``): one RFC 4180 record per message, with no header row.

Gazette frames CSV with Go's ``encoding/csv`` defaults, and this module reproduces them byte for
byte: fields are separated by ``,``, records end with ``\\n``; a field is quoted only if it holds
``,``, ``"``, ``\\r`` or ``\\n``, begins with a space character, or is exactly ``\\.``; quotes in a
quoted field are doubled. A quoted field may span lines, so a frame ends at the first newline
outside quotes. Reading, ``\\r\\n`` line endings become ``\\n``, empty lines are skipped (they hold
no record), and every record must have as many fields as the first one a decoder saw.

By convention (Gazette's ``CSVRecord``) the first field of a message is its UUID.
``message_bytes_max`` bounds a record, excluding its newline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, Protocol, Self, TypeVar, cast, runtime_checkable
from uuid import UUID

from gazette_consumer.message.framing import (
    CONTENT_TYPE_CSV,
    Frame,
    FrameTooLargeError,
    Framing,
    MessageDecodeError,
    MessageEncodeError,
    TruncatedFrameError,
    Unpacker,
    UnpackEvent,
    check_message_size,
)
from gazette_consumer.message.uuid import InvalidUUIDError

T = TypeVar("T")

_QUOTE = 0x22
_COMMA = 0x2C
_NEWLINE = b"\n"

# Characters Go's unicode.IsSpace accepts (the Unicode White_Space property). A field beginning
# with one is quoted so that readers which trim leading space keep it. str.isspace() differs
# (it also accepts U+001C..U+001F), so it would not reproduce Go's bytes.
_GO_SPACE = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)
_NEEDS_QUOTES = (",", '"', "\r", "\n")


@runtime_checkable
class CSVFrameable(Protocol):
    """A message type that converts to and from the fields of one CSV record."""

    def to_csv_fields(self) -> Sequence[str]: ...

    @classmethod
    def from_csv_fields(cls, fields: list[str]) -> Self: ...


class CSVRecord(list[str]):
    """A minimal CSV message: a list of fields whose first field is the message UUID."""

    def to_csv_fields(self) -> Sequence[str]:
        return self

    @classmethod
    def from_csv_fields(cls, fields: list[str]) -> Self:
        if not fields:
            raise ValueError("record has no fields, but its first field must be a UUID")
        try:
            UUID(fields[0])
        except ValueError as err:
            raise ValueError(f"first field {fields[0]!r} is not a UUID") from err
        return cls(fields)

    def get_uuid(self) -> UUID | None:
        if not self or not self[0]:
            return None
        try:
            return UUID(self[0])
        except ValueError as err:
            raise InvalidUUIDError(f"first field {self[0]!r} is not a UUID") from err

    def set_uuid(self, uuid: UUID) -> None:
        if not self:
            self.append(str(uuid))
        else:
            self[0] = str(uuid)

    def new_acknowledgement(self, journal: str) -> CSVRecord:
        # Same width as this record, so that readers' field-count checks hold.
        return CSVRecord([""] * max(len(self), 1))


def _needs_quotes(field: str) -> bool:
    if field == "":
        return False
    if field == "\\.":
        return True  # A lone "\." ends input in some (PostgreSQL) CSV readers.
    return any(c in field for c in _NEEDS_QUOTES) or field[0] in _GO_SPACE


def encode_record(fields: Sequence[str]) -> bytes:
    """Encode one record as Go's csv.Writer does."""
    parts = [
        '"' + field.replace('"', '""') + '"' if _needs_quotes(field) else field for field in fields
    ]
    return (",".join(parts) + "\n").encode("utf-8")


class CSVSyntaxError(ValueError):
    """A record does not parse as CSV."""


def parse_record(text: str) -> list[str]:
    """Parse one record (without its final newline) into fields, as Go's csv.Reader does."""
    fields: list[str] = []
    pos, size = 0, len(text)
    while True:
        if pos < size and text[pos] == '"':
            pieces: list[str] = []
            pos += 1
            while True:
                quote = text.find('"', pos)
                if quote < 0:
                    raise CSVSyntaxError('extraneous or missing " in quoted-field')
                pieces.append(text[pos:quote])
                if text.startswith('"', quote + 1):
                    pieces.append('"')
                    pos = quote + 2
                    continue
                pos = quote + 1
                break
            fields.append("".join(pieces))
            if pos == size:
                return fields
            if text[pos] != ",":
                raise CSVSyntaxError('extraneous or missing " in quoted-field')
            pos += 1
            continue
        comma = text.find(",", pos)
        end = size if comma < 0 else comma
        field = text[pos:end]
        if '"' in field:
            raise CSVSyntaxError('bare " in non-quoted-field')
        fields.append(field)
        if comma < 0:
            return fields
        pos = comma + 1


class CSVDecoder(Generic[T]):
    """Decodes CSV frames into ``message_type``: a CSVFrameable, or ``list`` for raw fields.

    ``fields_per_record`` follows Go's csv.Reader: 0 takes the count from the first record and
    requires it of every later one, a positive value is required exactly, a negative one disables
    the check. Use one decoder per journal read, as Go uses one csv.Reader per read.
    """

    def __init__(self, message_type: type[T], fields_per_record: int = 0) -> None:
        self._raw = message_type is list
        build = getattr(message_type, "from_csv_fields", None)
        if not self._raw and not callable(build):
            raise TypeError(
                f"{message_type.__name__} cannot be decoded from CSV "
                "(must be list or implement from_csv_fields)"
            )
        self._build = build
        self.fields_per_record = fields_per_record

    def decode(self, frame: Frame) -> T:
        try:
            text = frame.data.decode("utf-8").replace("\r\n", "\n").removesuffix("\n")
            fields = parse_record(text)
        except (UnicodeDecodeError, CSVSyntaxError) as err:
            raise MessageDecodeError(
                frame.journal, frame.begin, frame.end, f"malformed CSV record: {err}"
            ) from err
        if self.fields_per_record == 0:
            self.fields_per_record = len(fields)
        elif 0 < self.fields_per_record != len(fields):
            raise MessageDecodeError(
                frame.journal,
                frame.begin,
                frame.end,
                f"wrong number of fields: {len(fields)}, expected {self.fields_per_record}",
            )
        if self._raw or self._build is None:
            return cast(T, fields)
        try:
            return cast(T, self._build(fields))
        except ValueError as err:
            raise MessageDecodeError(
                frame.journal, frame.begin, frame.end, f"invalid CSV message: {err}"
            ) from err


class CSVUnpacker(Unpacker):
    """Finds record boundaries: the first newline outside a quoted field.

    A ``"`` opens a quoted field only at the start of a field (the record's start, or after a
    comma), as in Go; inside one, ``""`` is an escaped quote. Elsewhere a quote is a syntax error
    left for the decoder to report, and the record still ends at its line's end.
    """

    def __init__(self, journal: str, offset: int, message_bytes_max: int) -> None:
        super().__init__(journal, offset, message_bytes_max)
        self._resume = 0  # Buffer index from which to resume scanning.
        self._in_quotes = False
        # Offset where an over-long record began, while we discard it up to its end.
        self._skip_begin: int | None = None

    def _scan(self, buf: bytearray, view: memoryview, begin: int, events: list[UnpackEvent]) -> int:
        size = len(buf)
        record, i, in_quotes = 0, self._resume, self._in_quotes
        while True:
            if in_quotes:
                quote = buf.find(b'"', i)
                if quote < 0 or quote + 1 == size:
                    # Whether a final quote closes the field or escapes the next one
                    # depends on a byte not yet fed: rescan it next time.
                    i = size if quote < 0 else quote
                    break
                if buf[quote + 1] == _QUOTE:
                    i = quote + 2
                else:
                    in_quotes, i = False, quote + 1
                continue

            newline = buf.find(_NEWLINE, i)
            line_end = size if newline < 0 else newline
            quote = buf.find(b'"', i, line_end)
            while quote >= 0 and quote != record and buf[quote - 1] != _COMMA:
                quote = buf.find(b'"', quote + 1, line_end)
            if quote >= 0:
                in_quotes, i = True, quote + 1
                continue
            if newline < 0:
                i = size
                break
            self._emit(view, record, newline, begin, events)
            record = i = newline + 1

        if self._skip_begin is None and size - record > self.message_bytes_max:
            self._skip_begin = begin + record
        consumed = record
        if self._skip_begin is not None:
            # Drop all but the byte before the scan position: it tells whether a quote there
            # starts a field. Scanning positions are always past the dropped record start.
            consumed = max(record, i - 1)
        self._resume, self._in_quotes = i - consumed, in_quotes
        return consumed

    def _emit(
        self,
        view: memoryview,
        record: int,
        newline: int,
        begin: int,
        events: list[UnpackEvent],
    ) -> None:
        end = newline + 1
        if self._skip_begin is not None:
            events.append(
                FrameTooLargeError(
                    self.journal,
                    self._skip_begin,
                    begin + end,
                    "CSV record exceeds message_bytes_max",
                )
            )
            self._skip_begin = None
            return
        length = newline - record
        if length == 0 or (length == 1 and view[record] == 0x0D):
            return  # An empty line holds no record; Go's reader skips it too.
        if length > self.message_bytes_max:
            events.append(
                FrameTooLargeError(
                    self.journal,
                    begin + record,
                    begin + end,
                    f"CSV record of {length} bytes exceeds message_bytes_max "
                    f"{self.message_bytes_max}",
                )
            )
            return
        events.append(Frame(bytes(view[record:end]), begin + record, begin + end, self.journal))

    def _finish(self, buf: bytearray, begin: int, events: list[UnpackEvent]) -> None:
        end = begin + len(buf)
        if self._skip_begin is not None:
            events.append(
                FrameTooLargeError(
                    self.journal, self._skip_begin, end, "CSV record exceeds message_bytes_max"
                )
            )
        elif buf:
            events.append(
                TruncatedFrameError(self.journal, begin, end, "CSV record has no final newline")
            )
        self._resume, self._in_quotes, self._skip_begin = 0, False, None


class CSVFraming(Framing):
    content_type = CONTENT_TYPE_CSV

    def marshal_into(self, message: object, buf: bytearray) -> int:
        fields = _fields_of(message)
        if not fields or fields == [""]:
            # Go would write an empty line, which every CSV reader skips: the message would vanish.
            raise MessageEncodeError(
                f"{type(message).__name__} message has no non-empty field, so its CSV record "
                "would be an empty line"
            )
        try:
            encoded = encode_record(fields)
        except UnicodeEncodeError as err:
            raise MessageEncodeError(
                f"{type(message).__name__} message is not UTF-8 encodable: {err}"
            ) from err
        check_message_size(self, message, len(encoded) - 1)
        buf += encoded
        return len(encoded)

    def new_unpacker(self, journal: str, offset: int) -> CSVUnpacker:
        return CSVUnpacker(journal, offset, self.message_bytes_max)

    def new_decoder(self, message_type: type[T]) -> CSVDecoder[T]:
        return CSVDecoder(message_type)


def _fields_of(message: object) -> list[str]:
    if isinstance(message, CSVFrameable):
        fields = list(message.to_csv_fields())
    elif isinstance(message, list | tuple):
        fields = list(message)
    else:
        raise MessageEncodeError(
            f"{type(message).__name__} is not CSV-frameable (must be a sequence of str or "
            "implement to_csv_fields)"
        )
    for index, field in enumerate(fields):
        if not isinstance(field, str):
            raise MessageEncodeError(
                f"{type(message).__name__} field {index} is {type(field).__name__}, expected str"
            )
    return fields
