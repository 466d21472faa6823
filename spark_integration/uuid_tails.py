"""The UUIDs of JSON lines read from the lines' tails, without decoding the JSON (sans-IO): what
scans need (offsets and UUIDs only: the streaming planner's walk, look-aheads, look-backs), and
the UUID columns of a partition's decode with content (json_lines.py), which still decodes
every line to check it but no longer lists and parses the decoded UUID strings.

Gazette's writers of this package put the UUID last (`{...,"UUID":"<36 characters>"}`, an ACK
`{"UUID":"<36 characters>"}`): arrow_json.py, publish.py. For such a piece of lines the UUID
texts are bytes at fixed distances from each newline, taken for all lines at once as one
(n, 47) byte matrix (`,"UUID":"` or `{"UUID":"`, 36 characters, `"}`), and parsed by
uuid_columns.py: no msgspec decode of every line, no list of strings, no copy of the piece.

Exactness. A scan must see the UUID the full decode (json_lines.bulk_batch and the general
path, both msgspec) sees: the top-level "UUID" member. In a line that is valid JSON and ends
with such a tail, the tail is a member of the top-level object: the closing `"` before the
final `}` and the `"` after `:` are unescaped (preceded by a hex digit and by `:`), so the 36
characters are a whole string value; its key is the literal `UUID` (its quotes are unescaped
too: preceded by `D`, and by `,` or `{`); and the final `}`, the line's last character, closes
the object the member is in: the top-level one. It is that object's last member, and of
duplicate keys msgspec keeps the last (as Go's encoding/json does; test_uuid_tails.py holds
msgspec to it), so another "UUID" member before it, however spelled, changes nothing. A piece
whose every line does not end so (another format, a line without a UUID, a UUID not in
canonical form) is declined, and the caller decodes it fully. Lines that are not valid JSON
are not checked here: the partitions' full decode fails the read on them whatever the plan
says (json_lines.py).

Cost (one 4 MiB piece of ~17,700 lines of ~200 bytes): ~3 ms, against ~13 ms for the full
decode without content (msgspec's decode of every line ~5 ms, the list of UUID strings and
their join ~3 ms).
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from spark_integration.message_batch import MessageBatch
from spark_integration.raw_json import UUID_FIELD
from spark_integration.uuid_columns import UUID_TEXT_BYTES, UUIDColumns, parse_texts

_KEY: Final = f'"{UUID_FIELD}":"'.encode()  # The member's key, its colon, the value's quote.
_CLOSE: Final = b'"}'
TAIL_BYTES: Final = 1 + len(_KEY) + UUID_TEXT_BYTES + len(_CLOSE)  # `,` or `{` first.
_TEXT_AT: Final = 1 + len(_KEY)
_KEY_WORD: Final = np.frombuffer(_KEY, np.uint64)[0]
_CLOSE_WORD: Final = np.frombuffer(_CLOSE, np.uint16)[0]
_NEWLINE: Final = 10
_COMMA: Final = ord(",")
_BRACE: Final = ord("{")


def tail_batch(journal: str, offset: int, piece: bytes) -> MessageBatch | None:
    """The messages of `piece` (whole lines, beginning at `offset`) without content, as
    `json_lines.bulk_batch(..., content=False)` gives them, or None if the lines' tails do
    not settle their UUIDs (see the module docstring)."""
    if not piece.endswith(b"\n"):
        return None
    data = np.frombuffer(piece, np.uint8)
    newlines = np.flatnonzero(data == _NEWLINE)
    starts = np.empty(len(newlines), np.int64)
    starts[0] = 0
    starts[1:] = newlines[:-1] + 1
    tails = tail_uuids(data, starts, newlines)
    if tails is None:
        return None
    parts, uuids = tails
    return lines_batch(journal, offset, starts, newlines, parts, uuids)


def tail_uuids(
    data: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], newlines: npt.NDArray[np.intp]
) -> tuple[UUIDColumns, pa.StringArray] | None:
    """The UUID columns and texts of the lines of `data` (starting at `starts`, each ending at
    its newline, the last at the end of `data`), read from their tails; None if the tails do
    not settle them (see the module docstring)."""
    n = len(newlines)
    if bool(np.any(newlines - starts < TAIL_BYTES)):
        return None
    windows = np.lib.stride_tricks.sliding_window_view(data, TAIL_BYTES)
    tails = windows[newlines - TAIL_BYTES]  # (n, TAIL_BYTES): a copy of the tails only.
    # The fixed bytes compared as words: `"UUID":"` is 8 bytes, `"}` 2.
    key = np.ascontiguousarray(tails[:, 1:_TEXT_AT]).view(np.uint64)[:, 0]
    close = np.ascontiguousarray(tails[:, _TEXT_AT + UUID_TEXT_BYTES :]).view(np.uint16)[:, 0]
    opening = tails[:, 0]
    ok = (key == _KEY_WORD) & (close == _CLOSE_WORD) & ((opening == _COMMA) | (opening == _BRACE))
    if not bool(np.all(ok)):
        return None
    texts = np.ascontiguousarray(tails[:, _TEXT_AT : _TEXT_AT + UUID_TEXT_BYTES])
    parts = parse_texts(texts)
    if not bool(np.all(parts.parsed | parts.nil)):
        return None  # Not a Gazette UUID: the full decode names it.
    # As bulk_batch builds them: the texts, null where the UUID is nil.
    text_offsets = np.arange(0, (n + 1) * UUID_TEXT_BYTES, UUID_TEXT_BYTES, dtype=np.int32)
    return parts, uuid_text_array(parts, text_offsets, texts)


def uuid_text_array(
    parts: UUIDColumns, text_offsets: npt.NDArray[np.int32], texts: npt.NDArray[np.uint8] | bytes
) -> pa.StringArray:
    """The UUID texts of lines (`text_offsets` into `texts`), null where none parsed (no UUID,
    or the nil UUID)."""
    validity = None
    if not bool(np.all(parts.parsed)):
        validity = pa.py_buffer(np.packbits(parts.parsed, bitorder="little"))
    n = len(text_offsets) - 1
    return pa.StringArray.from_buffers(n, pa.py_buffer(text_offsets), pa.py_buffer(texts), validity)


def lines_batch(
    journal: str,
    offset: int,
    starts: npt.NDArray[np.int64],
    newlines: npt.NDArray[np.intp],
    parts: UUIDColumns,
    uuids: pa.StringArray,
    content: pa.Array | None = None,
) -> MessageBatch:
    """The MessageBatch of the lines starting at `starts` and ending at `newlines` of a piece
    at `offset`: their UUID columns and texts, and `content` (None: a scan's, no content)."""
    return MessageBatch(
        journal,
        starts + offset,
        newlines.astype(np.int64) + (offset + 1),
        parts.producers,
        parts.clocks,
        parts.flags,
        uuids,
        pa.nulls(len(newlines), pa.string()) if content is None else content,
    )
