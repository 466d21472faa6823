"""The bytes a read-committed reader consumed just below an offset, as a fingerprint (sans-IO).

A shard's checkpoint says how far it read each source journal, and which incarnation of it (its
etcd create revision, gazette_consumer/source_revisions.py). A journal deleted and created
again may be new content, which resuming at the checkpoint would skip, or the same content
restored from its fragment store (Gazette resumes it). What tells them apart exactly is the
content itself: a digest of the `TAIL_BYTES` just below the checkpoint's offset, taken at every
commit from the bytes the reader consumed, compared with the same range of the journal now. New
content starts at the new journal's first offset or at the end of what its store kept, so if
the range just below the offset holds the bytes the shard read, nothing below the offset is
new (see `source_revisions.py` for the argument and its limit).

`ReadTails` keeps, per journal, references to the last two chunks consumed (no copy) and a copy
of the `TAIL_BYTES` before them (at most that many bytes copied per chunk), which covers the
offsets a checkpoint can stand at (the read-through offset of what was consumed, never more
than a chunk or so behind the chunk being decoded) whatever the chunks' sizes (a live journal
of small appends is a chunk per append; found by review), and holds per source journal at
most two chunks and `TAIL_BYTES`. A reader resumed at a checkpoint is seeded with the bytes
below it (`seed`, read again at its start and checked against the checkpoint's fingerprint),
so a commit soon after a start has one too. An offset they do not cover (content skipped by
an offset jump) has no fingerprint: the check then knows nothing, and falls back to the safe
answer.
"""

from __future__ import annotations

import hashlib
from typing import Final

TAIL_BYTES: Final = 256
"""The bytes below a checkpoint's offset its fingerprint covers (fewer only below offset 256)."""


def tail_digest(content: bytes) -> bytes:
    """The fingerprint of the bytes below an offset (SHA-256)."""
    return hashlib.sha256(content).digest()


def tail_range(offset: int) -> tuple[int, int]:
    """The range a fingerprint at `offset` covers."""
    return max(0, offset - TAIL_BYTES), offset


class ReadTails:
    """See the module docstring."""

    __slots__ = ("_chunks",)

    def __init__(self) -> None:
        # Per journal: contiguous (offset, content) pieces, oldest first: a copy of at most
        # TAIL_BYTES, then the last two chunks consumed (fewer at first).
        self._chunks: dict[str, list[tuple[int, bytes]]] = {}

    def add(self, journal: str, offset: int, content: bytes) -> None:
        """`content`, read at `offset`, was taken for decoding (chunks of a journal come in
        order; one after a gap drops those before it)."""
        if not content:
            return
        pieces = self._chunks.get(journal)
        if pieces is None or (pieces and pieces[-1][0] + len(pieces[-1][1]) != offset):
            pieces = self._chunks[journal] = []
        pieces.append((offset, content))
        if len(pieces) > 3:
            # Fold the oldest two into a copy of their last TAIL_BYTES.
            (at, first), (_, second) = pieces[0], pieces[1]
            kept = (first[-TAIL_BYTES:] + second[-TAIL_BYTES:])[-TAIL_BYTES:]
            end = at + len(first) + len(second)
            pieces[:2] = [(end - len(kept), kept)]

    def seed(self, journal: str, offset: int, content: bytes) -> None:
        """Hold `content`, the journal's bytes at `offset`, before any chunk is consumed: the
        bytes below where a reader resumes."""
        self.add(journal, offset, content)

    def fingerprint(self, journal: str, offset: int) -> bytes | None:
        """The digest of the bytes consumed in `tail_range(offset)`, or None if they are not
        all held."""
        begin, end = tail_range(offset)
        pieces = self._chunks.get(journal)
        if end <= 0 or not pieces:
            return None
        if pieces[0][0] > begin or pieces[-1][0] + len(pieces[-1][1]) < end:
            return None
        parts = []
        for at, content in pieces:
            stop = at + len(content)
            if stop <= begin:
                continue
            if at >= end:
                break
            parts.append(content[max(begin - at, 0) : min(end, stop) - at])
        return tail_digest(b"".join(parts))
