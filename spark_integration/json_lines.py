"""JSON-lines content in, `MessageBatch`es out, a piece of whole lines at a time (sans-IO).

The bulk path, per piece (`decode_piece_bytes` of content, cut after its last newline):

- the lines are found with one numpy pass over the bytes;
- every line is decoded at once, as the elements of one JSON array (the newlines between them
  turned into commas, in a buffer the decoder reuses: a fresh one for each piece cost more in
  page faults than the copy), by a msgspec decoder that keeps only the top-level "UUID" field:
  each line is checked to be a whole JSON object, as the general path's decoder checks it;
- the UUID columns are read from the lines' tails where the writers' framing lets it
  (uuid_tails.py: then they are the decode's), else from the decoded texts, parsed at once
  (uuid_columns.py); the content column is the piece's bytes without the newlines, checked to
  be UTF-8 by Arrow.

Scans that need only offsets and UUIDs (a look-back, a look-ahead for ACKs, streaming
planning: range_read.py) use `scan_decoder`, which skips the content column, and reads the
UUIDs from the lines' tails where the writers' framing lets it (uuid_tails.py: ~3 ms a 4 MiB
piece against ~13 ms), decoding the piece as above where it does not.

Fed chunks are held as they come and joined once a piece is due (the piece's only copy: a
fragment's chunk that ends with a newline is decoded as it came).

Anything the bulk path does not take (a line that is not a JSON object, a UUID that is not in
canonical form, bytes that are not UTF-8) sends the piece down the general path: the framing
and decoder Gazette's readers use (`ChunkDecoder`, raw_json.py), which decodes what they accept
exactly as they do, and fails the read with `GazetteJournalError` naming the offsets of what
they do not (a line that is not a JSON object with a valid UUID, a line longer than the limit),
never skipping it.

Content arrives in chunks of any size, cut anywhere; a line cut by a chunk is carried to the
next one. An offset jump (content removed from the journal: the reader's source decided it may
be skipped, see sources.py) drops the line that was cut by it.
"""

from __future__ import annotations

from typing import Final, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from gazette_consumer.message.framing import MESSAGE_BYTES_MAX_DEFAULT
from spark_integration.journal_io import GazetteJournalError
from spark_integration.message_batch import MessageBatch, batch_of_envelopes
from spark_integration.raw_json import UUID_FIELD, RawLine, new_decoder
from spark_integration.uuid_columns import UUID_TEXT_BYTES, UUIDColumns, parse_texts
from spark_integration.uuid_tails import lines_batch, tail_batch, tail_uuids, uuid_text_array

# Content decoded at once: big enough that per-piece costs vanish, small enough to keep a
# partition's memory flat.
decode_piece_bytes: Final = 4 << 20
_NEWLINE: Final = 10
_COMMA: Final = 44

T = TypeVar("T")


class _UUIDText(msgspec.Struct, gc=False):
    """A line's top-level object, only its "UUID" member kept. Untracked by the garbage
    collector (a string cannot make a cycle): ~17,000 tracked objects a piece made the decode
    ~40% dearer, in the collections their allocation set off."""

    uuid: str = msgspec.field(default="", name=UUID_FIELD)


_LINES_DECODER: Final = msgspec.json.Decoder(list[_UUIDText])


class Scratch:
    """A buffer reused from piece to piece (by one decoder, never two at once): a fresh 4 MiB
    allocation for each piece costs ~2,000 page faults filling it, ~5 ms of system time where
    the copy into it costs ~0.1 ms."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def view(self, size: int) -> memoryview:
        """`size` bytes of the buffer (grown to the largest size asked: a piece's)."""
        if len(self._buffer) < size:
            self._buffer = bytearray(size)
        return memoryview(self._buffer)[:size]


def _decode_lines(
    piece: bytes,
    newlines: npt.NDArray[np.intp],
    decoder: msgspec.json.Decoder[list[T]],
    scratch: Scratch | None,
) -> list[T] | None:
    """The lines of `piece` (ending at `newlines`) decoded at once by `decoder`, as the elements
    of one JSON array; None unless each line is one JSON value that `decoder` takes."""
    # "[" + the lines, each newline but the last a comma + "]": one copy of the piece.
    size = len(piece) + 1
    with scratch.view(size) if scratch is not None else memoryview(bytearray(size)) as blob:
        blob[0] = ord("[")
        blob[1:] = piece
        np.frombuffer(blob, np.uint8)[newlines + 1] = _COMMA
        blob[-1] = ord("]")
        try:
            decoded = decoder.decode(blob)
        except (msgspec.DecodeError, ValueError):
            return None
    if len(decoded) != len(newlines):
        return None  # A line held more than one JSON value.
    return decoded


def bulk_batch(
    journal: str,
    offset: int,
    piece: bytes,
    *,
    content: bool = True,
    tails: bool = True,
    scratch: Scratch | None = None,
) -> MessageBatch | None:
    """The messages of `piece` (whole lines, beginning at `offset`), or None if the bulk path
    does not take it (see the module docstring). Without `content` the batch's content column
    is all nulls (a scan that needs only offsets and UUIDs skips building and checking it).
    With content, the UUID columns are read from the lines' tails where they settle them
    (`tails` False: from the decoded strings, as a test compares). `scratch`:
    the caller's buffer for the decode's copy of the piece (None: a fresh one)."""
    data = np.frombuffer(piece, np.uint8)
    newlines = np.flatnonzero(data == _NEWLINE)
    n = len(newlines)
    if n == 0 or newlines[-1] != len(piece) - 1:
        return None
    starts = np.empty(n, np.int64)
    starts[0] = 0
    starts[1:] = newlines[:-1] + 1
    # (A scan without content tried the tails before: uuid_tails.tail_batch.)
    from_tails = tail_uuids(data, starts, newlines) if content and tails else None
    # Every line is decoded all the same: what the bulk path takes is checked as before (each
    # line one JSON object, its "UUID" members strings); the tails' UUIDs are then the ones
    # the decode read (uuid_tails.py), without the list of its strings and their parse.
    decoded = _decode_lines(piece, newlines, _LINES_DECODER, scratch)
    if decoded is None:
        return None
    if from_tails is not None:
        parts, uuids = from_tails
    else:
        found = _uuid_columns(decoded)
        if found is None:
            return None
        parts, uuids = found
    if not content:
        return lines_batch(journal, offset, starts, newlines, parts, uuids)
    # The content: each line with its newline, checked to be UTF-8, then without it (the
    # newline is one byte: a slice of code units drops it).
    value_offsets = np.empty(n + 1, np.int32)
    value_offsets[:n] = starts
    value_offsets[n] = len(piece)
    lines = pa.StringArray.from_buffers(n, pa.py_buffer(value_offsets), pa.py_buffer(piece))
    # Lines are cut at newlines, which no multi-byte UTF-8 sequence holds: the piece is UTF-8
    # if and only if every line is. ASCII (the common case) is checked fastest.
    if not piece.isascii():
        try:
            piece.decode("utf-8")
        except UnicodeDecodeError:
            return None  # Not UTF-8: the general path replaces what is not.
    # (Imported here: a scan, the driver's planning walk among them, builds no content, and
    # pyarrow.compute's first import costs ~0.3 s of CPU.)
    import pyarrow.compute as pc

    content = pc.utf8_slice_codeunits(lines, 0, -1)
    return lines_batch(journal, offset, starts, newlines, parts, uuids, content)


def _uuid_columns(decoded: list[_UUIDText]) -> tuple[UUIDColumns, pa.StringArray] | None:
    """The UUID columns and texts of decoded lines; None if a UUID is not a canonical Gazette
    one (the general path parses or names it)."""
    n = len(decoded)
    # The UUID texts as one buffer, not through pa.array: its first call in a process imports
    # pandas (~0.4 s), which the driver's planning walk (a scan, content-less) needs nowhere.
    texts = [d.uuid for d in decoded]
    lengths = np.fromiter(map(len, texts), np.int32, n)
    with_uuid = lengths == UUID_TEXT_BYTES
    if not np.all(with_uuid | (lengths == 0)):
        return None  # A UUID not in canonical form: the general path parses it.
    try:
        text_bytes = "".join(texts).encode("ascii")
    except UnicodeEncodeError:
        return None  # Not canonical either.
    matrix = np.zeros((n, UUID_TEXT_BYTES), np.uint8)
    if len(text_bytes):
        matrix[with_uuid] = np.frombuffer(text_bytes, np.uint8).reshape(-1, UUID_TEXT_BYTES)
    parts = parse_texts(matrix)
    if not np.all(parts.parsed | parts.nil | ~with_uuid):
        return None  # Not a Gazette UUID: the general path names it.
    text_offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=text_offsets[1:])
    # Rows without a UUID (none, or the nil UUID) are null.
    return parts, uuid_text_array(parts, text_offsets, text_bytes)


def general_batch(journal: str, offset: int, piece: bytes, *, final: bool) -> MessageBatch:
    """The messages of `piece` decoded one by one as Gazette's readers decode them; raises
    GazetteJournalError for content they would not deliver. `final`: the piece ends the read
    (a line left without its newline is an error, not carried)."""
    decoder = new_decoder(journal, offset)
    envelopes = decoder.feed(piece, offset)
    if decoder.error is None and final:
        envelopes += decoder.flush()
    if decoder.error is not None:
        raise GazetteJournalError(f"journal {journal!r}: {decoder.error}")
    if decoder.skipped_bytes:
        raise GazetteJournalError(
            f"journal {journal!r}: content in [{offset}, {offset + len(piece)}) that is not"
            " whole JSON lines (a message cut short, or longer than the limit)"
        )
    lines: list[RawLine] = [env.message for env in envelopes]
    content = pa.array([m.line.decode("utf-8", errors="replace") for m in lines], pa.string())
    return batch_of_envelopes(journal, envelopes, content)


class JSONLinesDecoder:
    """Chunks of one journal's content in (in order; offsets may jump forward), MessageBatches
    out. Call `feed` per chunk, then `flush` at the end of a bounded read. Without `content`,
    batches carry no content (`bulk_batch`): for scans of offsets and UUIDs only."""

    def __init__(
        self,
        journal: str,
        offset: int,
        *,
        piece_bytes: int = decode_piece_bytes,
        line_bytes_max: int = MESSAGE_BYTES_MAX_DEFAULT,
        content: bool = True,
    ) -> None:
        self.journal = journal
        self._content = content
        self._piece_bytes = piece_bytes
        self._line_bytes_max = line_bytes_max
        # Content not decoded yet, as fed: joined once when decoded (a chunk that is a whole
        # piece of lines, the common case, is decoded as it came, without a copy).
        self._chunks: list[bytes] = []
        self._held = 0  # Bytes in `_chunks`.
        self._newline = False  # Whether a chunk fed since the last decode holds a newline.
        self._buffer_offset = offset  # Where `_chunks` begin.
        self._scratch = Scratch()  # For bulk_batch's copy of each piece.

    @property
    def offset(self) -> int:
        """The offset of the next byte expected."""
        return self._buffer_offset + self._held

    def feed(self, content: bytes, offset: int) -> list[MessageBatch]:
        out: list[MessageBatch] = []
        if offset != self.offset:
            # A jump over removed content: the whole lines before it are still messages; only
            # a line it cut lost its end with it.
            out = self._decode(final=False)
            self._chunks, self._held = [], 0
            self._buffer_offset = offset
        if not content:
            return out
        self._chunks.append(bytes(content))
        self._held += len(content)
        self._newline = self._newline or content.rfind(b"\n") >= 0
        # (Without a newline since the last decode, there is nothing to decode yet, but a line
        # over the limit to report.)
        if self._held < self._piece_bytes or not (
            self._newline or self._held > self._line_bytes_max
        ):
            return out
        return out + self._decode(final=False)

    def flush(self) -> list[MessageBatch]:
        """End of the read: what remains must be whole lines."""
        return self._decode(final=True)

    def _decode(self, *, final: bool) -> list[MessageBatch]:
        buffer = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._newline = False
        cut = buffer.rfind(b"\n") + 1
        if final and cut != len(buffer):
            raise GazetteJournalError(
                f"journal {self.journal!r}: content in [{self._buffer_offset + cut},"
                f" {self.offset}) that is not whole JSON lines: it ends without a newline (a"
                " message cut short)"
            )
        if cut == 0:
            if len(buffer) > self._line_bytes_max:
                raise GazetteJournalError(
                    f"journal {self.journal!r}: content from offset {self._buffer_offset} that is"
                    f" not whole JSON lines: a line longer than the limit of"
                    f" {self._line_bytes_max} bytes"
                )
            self._chunks = [buffer] if buffer else []
            return []
        piece = buffer if cut == len(buffer) else buffer[:cut]
        rest = buffer[cut:]
        self._chunks, self._held = ([rest] if rest else []), len(rest)
        offset = self._buffer_offset
        self._buffer_offset += cut
        batch = None
        if not self._content:
            batch = tail_batch(self.journal, offset, piece)
        if batch is None:
            batch = bulk_batch(
                self.journal, offset, piece, content=self._content, scratch=self._scratch
            )
        if batch is None:
            batch = general_batch(self.journal, offset, piece, final=True)
        return [batch] if len(batch) else []


def scan_decoder(journal: str, offset: int) -> JSONLinesDecoder:
    """A decoder of JSON lines for scans: offsets and UUIDs, no content."""
    return JSONLinesDecoder(journal, offset, content=False)
