"""Which incarnation of a source journal a checkpoint's offsets belong to.

A journal deleted and created again under the same name starts over at offset 0. A checkpoint
that read the old journal through offset N then means nothing in the new one, yet a shard
resumed there waits for the new head to pass N and reads on from N: everything appended below
is skipped without an error (Gazette does exactly that). A head below the checkpoint shows it
(source_heads.py), but only until the new journal grows past N.

So the checkpoint also records, per source, the etcd create revision of the journal its offset
was read from, and a primary compares it with the journal's current create revision (one List
of its sources) before it reads: a different revision means the journal was created again.
That alone does not mean its content changed: created again over the same fragment store, a
journal has its persisted content back at the same offsets, and Gazette treats it as the same
journal. Only its content can tell, so the checkpoint also records a *fingerprint*: an offset
at or below the checkpoint's and the SHA-1 of the `FINGERPRINT_BYTES` before it (taken once, by
reading them, when the shard first resumes reading a journal incarnation; every later
checkpoint of that incarnation carries it on, a journal being append-only). A journal created
again whose bytes there hash the same holds the old content (restored); otherwise, or without a
fingerprint, it holds new content, and the spec's ``gazette.dev/checkpoint-ahead`` policy
applies as to a head found behind (source_heads.find_recreated). While a primary reads, its
readers check the create revision again whenever a Read RPC of theirs ended (a broker stopping,
a journal deleted: `verify_source`), before the next one reads on; a change restarts the
shard, whose start decides as above.

Where it is kept. Gazette's ``consumer.Checkpoint.Source`` has no such fields, so they are
written as fields `CREATE_REVISION_FIELD` (a varint) and `FINGERPRINT_FIELD` (bytes) of the
Source, unknown to Gazette's message: Go's decoder (and Gazette's stores) skip them, protobuf
keeps them through parsing, copying and encoding, and a checkpoint without them (written by
Go, or before this) is simply not checked until the shard's next commit records them.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf.unknown_fields import UnknownFieldSet

from broker.client.list_apply import list_journals
from broker.client.reader import DataLossError
from broker.client.retry_reader import RetryReader
from broker.client.route_cache import JournalClient
from broker.logging import get_logger
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import JournalNotFoundError, OffsetNotYetAvailableError

__all__ = [
    "CREATE_REVISION_FIELD",
    "FINGERPRINT_BYTES",
    "FINGERPRINT_FIELD",
    "Fingerprint",
    "SourceMarks",
    "SourceRecreatedError",
    "content_fingerprint",
    "create_revisions_of",
    "current_create_revisions",
    "fingerprints_of",
    "verify_source",
]

_log = get_logger(__name__)

# Field number of the create revision in a checkpoint's Source message: far above Gazette's
# (1, 2), so that a field Gazette adds later is not mistaken for it.
CREATE_REVISION_FIELD: Final = 1000
FINGERPRINT_FIELD: Final = 1001
_VARINT: Final = 0  # Wire types.
_BYTES: Final = 2
# Bytes a fingerprint hashes (fewer at a journal's start): enough that new content matching old
# by chance is out of the question (messages carry UUIDs), one small read to take or check.
FINGERPRINT_BYTES: Final = 256
# Attempts of a fingerprint's read on transient errors (as the head probes: the shard's own
# retry follows).
_READ_ATTEMPTS_MAX: Final = 4
# A fingerprint that could not be taken in the background is tried again after this long.
FINGERPRINT_RETRY_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """The SHA-1 of a journal's bytes [offset - min(offset, FINGERPRINT_BYTES), offset)."""

    offset: int
    digest: bytes

    def encode(self) -> bytes:
        return self.offset.to_bytes(8, "big") + self.digest

    @classmethod
    def decode(cls, data: bytes) -> Fingerprint | None:
        if len(data) != 8 + 20:
            return None  # Not ours: ignored (never taken for a match).
        return cls(int.from_bytes(data[:8], "big"), bytes(data[8:]))


class SourceMarks:
    """What a primary's checkpoints record of each source journal it reads: the create
    revision of the incarnation read, and a fingerprint of its content.

    A source without a fingerprint yet (a shard that started at offset 0, or whose bytes at
    its offset could not be read) gets one in the background once a checkpoint read past 0 of
    it: `stamp` starts the read (`fetch`, one per journal at a time, tried again at most every
    `FINGERPRINT_RETRY_S`), and the checkpoints after it completes carry it. `close` cancels
    reads under way."""

    def __init__(
        self,
        revisions: Mapping[str, int] | None = None,
        fingerprints: Mapping[str, Fingerprint] | None = None,
        *,
        fetch: Callable[[str, int], Awaitable[Fingerprint | None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.revisions = dict(revisions or {})
        self.fingerprints = dict(fingerprints or {})
        self._fetch, self._clock = fetch, clock
        self._fetching: dict[str, asyncio.Task[None]] = {}
        self._tried: dict[str, float] = {}

    def stamp(self, cp: cpb.Checkpoint) -> None:
        """Record the marks in `cp`, for each of its sources (replacing ones recorded)."""
        for journal, source in cp.sources.items():
            revision = self.revisions.get(journal, 0)
            if revision <= 0:
                continue
            source.DiscardUnknownFields()  # Ours are the only unknown fields a Source carries.
            data = _varint((CREATE_REVISION_FIELD << 3) | _VARINT) + _varint(revision)
            fingerprint = self.fingerprints.get(journal)
            if fingerprint is not None:
                encoded = fingerprint.encode()
                data += _varint((FINGERPRINT_FIELD << 3) | _BYTES) + _varint(len(encoded))
                data += encoded
            elif source.read_through > 0:
                self._start_fetch(journal, source.read_through)
            source.MergeFromString(data)

    def _start_fetch(self, journal: str, offset: int) -> None:
        if self._fetch is None or journal in self._fetching:
            return
        now = self._clock()
        if now - self._tried.get(journal, -FINGERPRINT_RETRY_S) < FINGERPRINT_RETRY_S:
            return
        self._tried[journal] = now
        self._fetching[journal] = asyncio.ensure_future(self._fetch_one(journal, offset))

    async def _fetch_one(self, journal: str, offset: int) -> None:
        assert self._fetch is not None
        try:
            fingerprint = await self._fetch(journal, offset)
        except Exception as err:  # Tried again later; until then, no fingerprint is recorded.
            _log.info("source fingerprint not taken", journal=journal, error=str(err))
            fingerprint = None
        finally:
            del self._fetching[journal]
        if fingerprint is not None:
            self.fingerprints.setdefault(journal, fingerprint)

    async def fetched(self) -> None:
        """Wait for the fingerprint reads under way to end (whatever their outcome)."""
        tasks = list(self._fetching.values())
        if tasks:
            await asyncio.wait(tasks)

    async def close(self) -> None:
        tasks = list(self._fetching.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


class SourceRecreatedError(Exception):
    """A source journal is not the one the shard's offsets were read from: it was deleted and
    created again (its etcd create revision changed)."""

    def __init__(self, journal: str, read_from: int, current: int) -> None:
        self.journal, self.read_from, self.current = journal, read_from, current
        super().__init__(
            f"source journal {journal!r} was deleted and created again (etcd create revision"
            f" {read_from}, now {current}): the offsets the shard read it through may belong to"
            " the journal that is gone"
        )


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _unknown(cp: cpb.Checkpoint, number: int, wire_type: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for journal, source in cp.sources.items():
        unknown = UnknownFieldSet(source)
        for i in range(len(unknown)):
            f = unknown[i]
            if f.field_number == number and f.wire_type == wire_type:
                out[journal] = f.data
    return out


def create_revisions_of(cp: cpb.Checkpoint) -> dict[str, int]:
    """The create revisions `cp` records, by journal (journals without one are left out)."""
    return _unknown(cp, CREATE_REVISION_FIELD, _VARINT)


def fingerprints_of(cp: cpb.Checkpoint) -> dict[str, Fingerprint]:
    """The fingerprints `cp` records, by journal (journals without one are left out)."""
    out = {}
    for journal, data in _unknown(cp, FINGERPRINT_FIELD, _BYTES).items():
        fingerprint = Fingerprint.decode(data)
        if fingerprint is not None:
            out[journal] = fingerprint
    return out


async def content_fingerprint(
    client: JournalClient, journal: str, offset: int
) -> Fingerprint | None:
    """The fingerprint of `journal` at `offset`, read now; None if its bytes there cannot be
    read (gone: removed by retention, lost; or not written yet). Raises what else the read
    raises after its retries (a broker unreachable)."""
    size = min(offset, FINGERPRINT_BYTES)
    if size <= 0:
        return None
    begin = offset - size
    reader = RetryReader(
        client,
        pb.ReadRequest(journal=journal, offset=begin, end_offset=offset, block=False),
        attempts_max=_READ_ATTEMPTS_MAX,
    )
    data = bytearray()
    try:
        while len(data) < size:
            chunk = await reader.read_chunk()
            if not chunk.content or chunk.offset != begin + len(data):
                return None  # Ended short, or jumped over missing content.
            data += chunk.content
    except (DataLossError, OffsetNotYetAvailableError):
        return None
    finally:
        await reader.close()
    return Fingerprint(offset, hashlib.sha1(bytes(data[:size])).digest())


async def current_create_revisions(
    client: JournalClient, journals: Sequence[str]
) -> dict[str, int]:
    """The create revision of each of `journals` (one List RPC); raises JournalNotFoundError
    naming the first journal that does not exist."""
    if not journals:
        return {}
    selector = pb.LabelSelector(include=gl.label_set([(gl.META_NAME, j) for j in journals]))
    listed = await list_journals(client, selector)
    found = {j.spec.name: j.create_revision for j in listed.journals}
    for journal in journals:
        if journal not in found:
            raise JournalNotFoundError(f"source journal {journal!r} does not exist")
    return found


async def verify_source(client: JournalClient, journal: str, read_from: int) -> None:
    """Raise SourceRecreatedError if `journal`'s create revision is no longer `read_from`
    (JournalNotFoundError if it is gone)."""
    current = (await current_create_revisions(client, [journal]))[journal]
    # 0 is unknown (a broker older than the field), never a change.
    if 0 < read_from != current > 0:
        raise SourceRecreatedError(journal, read_from, current)
