"""Which incarnation of a source journal a checkpoint's offsets belong to.

A journal deleted and created again under the same name starts over at offset 0. A checkpoint
that read the old journal through offset N then means nothing in the new one, yet a shard
resumed there waits for the new head to pass N and reads on from N: everything appended below
is skipped without an error (Gazette does exactly that). A head below the checkpoint shows it
(source_heads.py), but only until the new journal grows past N.

So the checkpoint also records, per source, the etcd create revision of the journal its offset
was read from, and a primary compares it with the journal's current create revision (one List
of its sources) before it reads: a different revision means the journal was created again.
The spec's ``gazette.dev/checkpoint-ahead`` policy then applies as to a head found behind
(source_heads.find_recreated), unless the journal was created again over the content the
shard read: restored from its fragment store (specs applied again to a rebuilt etcd), which
Gazette resumes. What tells the two apart is the checkpoint's fingerprint of the bytes just
below its offset, taken at every commit from what the reader consumed
(gazette_consumer/sequencer/read_tails.py), compared with the journal's bytes there now
(`restored_sources`). It is exact: content appended to the new journal starts at its first
offset or at the end of what its store kept, so if the bytes just below the offset are those
read, the store kept everything below the offset, and nothing new lies there (two earlier
attempts, "a stored fragment holds the last offset read" and a fingerprint taken once per
incarnation below an earlier offset, each passed new content persisted below or past the
checkpoint: reviews broke them). Its one limit: new content identical, byte for byte, over
those `TAIL_BYTES` at the same offsets (messages with Gazette UUIDs never are: each carries
its producer's random id and a clock) is taken for the old. A checkpoint without a
fingerprint (the reader did not hold the bytes, or it was written by Go or before this) is
handled by the policy. While a primary reads, its readers check the create revision again (`verify_source`)
when each Read RPC of theirs first answers with content, before handing it out, and before the
next RPC after one ended (a broker stopping, a journal deleted); a change restarts the shard,
whose start decides as above.

Where it is kept. Gazette's ``consumer.Checkpoint.Source`` has no such field, so the revision is
written as field number `CREATE_REVISION_FIELD` of the Source, a varint unknown to Gazette's
message: Go's decoder (and Gazette's stores) skip it, protobuf keeps it through parsing,
copying and encoding, and a checkpoint without it (written by Go, or before this) is simply not
checked until the shard's next commit records it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Final

from google.protobuf.unknown_fields import UnknownFieldSet
from prometheus_client import Counter

from broker.client.list_apply import list_journals
from broker.client.reader import DataLossError
from broker.client.retry_reader import RetryReader
from broker.client.route_cache import JournalClient
from broker.logging import get_logger
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import JournalNotFoundError, OffsetNotYetAvailableError
from gazette_consumer.sequencer.read_tails import tail_digest, tail_range

__all__ = [
    "CREATE_REVISION_FIELD",
    "FINGERPRINT_FIELD",
    "RESTORED_TOTAL",
    "SourceFingerprints",
    "SourceRecreatedError",
    "StaleListingError",
    "StaleReadError",
    "create_revisions_of",
    "current_create_revisions",
    "fingerprints_of",
    "known_fingerprints",
    "list_sources",
    "restored_sources",
    "stamp_create_revisions",
    "tails_now",
    "verify_source",
]

_log = get_logger(__name__)

# Field number of the create revision in a checkpoint's Source message: far above Gazette's
# (1, 2), so that a field Gazette adds later is not mistaken for it.
CREATE_REVISION_FIELD: Final = 1000
# And the fingerprint of the bytes just below its offset (gazette_consumer/sequencer/
# read_tails.py): a SHA-256 digest, as bytes.
FINGERPRINT_FIELD: Final = 1001
_VARINT: Final = 0  # Wire types.
_BYTES: Final = 2
_TAG: Final = (CREATE_REVISION_FIELD << 3) | _VARINT
_FINGERPRINT_TAG: Final = (FINGERPRINT_FIELD << 3) | _BYTES


class SourceRecreatedError(Exception):
    """A source journal is not the one the shard's offsets were read from: it was deleted and
    created again (its etcd create revision changed)."""

    def __init__(self, journal: str, read_from: int, current: int) -> None:
        self.journal, self.read_from, self.current = journal, read_from, current
        super().__init__(
            f"source journal {journal!r} was deleted and created again (etcd create revision"
            f" {read_from}, now {current}): the offsets the shard read it through belong to the"
            " journal that is gone"
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


def stamp_create_revisions(
    cp: cpb.Checkpoint,
    revisions: Mapping[str, int],
    fingerprints: Mapping[str, bytes] | None = None,
) -> None:
    """Record in `cp` the create revision of each of its sources that `revisions` names, and
    with it the source's fingerprint if `fingerprints` has one (replacing those recorded
    before; a fingerprint is kept only beside a revision: it describes that incarnation)."""
    fingerprints = fingerprints or {}
    for journal, revision in revisions.items():
        if journal not in cp.sources or revision <= 0:
            continue
        source = cp.sources[journal]
        source.DiscardUnknownFields()  # Ours are the only unknown fields a Source carries.
        stamp = _varint(_TAG) + _varint(revision)
        digest = fingerprints.get(journal)
        if digest:
            stamp += _varint(_FINGERPRINT_TAG) + _varint(len(digest)) + digest
        source.MergeFromString(stamp)


class SourceFingerprints:
    """Each source's fingerprint for the checkpoints a shard commits (`at`): the reader's, of the
    bytes it consumed just below the checkpoint's offset (`take`, ReadCommittedIter.fingerprint),
    else the last one known at the same offset (`known`: journal -> (offset, digest), at first
    the stored checkpoint's); a source whose offset moved without the reader holding the bytes
    below it has none."""

    def __init__(
        self,
        known: Mapping[str, tuple[int, bytes]],
        take: Callable[[str, int], bytes | None] | None,
    ) -> None:
        self._known = dict(known)
        self._take = take

    def at(self, cp: cpb.Checkpoint) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for journal, source in cp.sources.items():
            offset = source.read_through
            known = self._known.get(journal)
            if known is not None and known[0] == offset:
                out[journal] = known[1]  # Not moved: the bytes below it are the same.
                continue
            fresh = self._take(journal, offset) if self._take is not None else None
            if fresh is not None:
                self._known[journal] = (offset, fresh)
            known = self._known.get(journal)
            if known is not None and known[0] == offset:
                out[journal] = known[1]
            elif known is not None:
                del self._known[journal]
        return out


def known_fingerprints(cp: cpb.Checkpoint) -> dict[str, tuple[int, bytes]]:
    """`cp`'s fingerprints with the offsets they were taken at, by journal."""
    return {j: (cp.sources[j].read_through, d) for j, d in fingerprints_of(cp).items()}


def fingerprints_of(cp: cpb.Checkpoint) -> dict[str, bytes]:
    """The fingerprints `cp` records (read_tails.py), by journal."""
    return {j: bytes(data) for j, data in _our_fields(cp, FINGERPRINT_FIELD, _BYTES).items()}


def create_revisions_of(cp: cpb.Checkpoint) -> dict[str, int]:
    """The create revisions `cp` records, by journal (journals without one are left out)."""
    return {j: int(data) for j, data in _our_fields(cp, CREATE_REVISION_FIELD, _VARINT).items()}


def _our_fields(cp: cpb.Checkpoint, number: int, wire_type: int) -> dict[str, Any]:
    """Per journal of `cp`, the data of its Source's unknown field `number` of `wire_type`."""
    out: dict[str, Any] = {}
    for journal, source in cp.sources.items():
        unknown = UnknownFieldSet(source)
        for i in range(len(unknown)):
            field = unknown[i]
            if field.field_number == number and field.wire_type == wire_type:
                out[journal] = field.data
    return out


class StaleReadError(Exception):
    """A source's Read was answered by a broker whose view of etcd predates the journal the
    shard reads: what it served may be the journal deleted before it. Not retried by the
    reader (its content is held back, never handed out); the shard starts over (transient)."""


class StaleListingError(ConnectionError):
    """The broker asked for a journal's create revision answered from an older view of etcd
    than the read being checked (transient: its view catches up)."""


async def list_sources(
    client: JournalClient, journals: Sequence[str], at_least: int = 0
) -> dict[str, pb.ListResponse.Journal]:
    """Each of `journals` as listed (one List RPC); raises JournalNotFoundError naming the
    first journal that does not exist, and StaleListingError if the broker listed them from
    an etcd revision below `at_least`."""
    if not journals:
        return {}
    selector = pb.LabelSelector(include=gl.label_set([(gl.META_NAME, j) for j in journals]))
    listed = await list_journals(client, selector)
    listed_at = listed.header.etcd.revision
    if listed_at < at_least:
        raise StaleListingError(
            f"listing {', '.join(journals)}: the broker answered from etcd revision {listed_at},"
            f" older than the read being checked ({at_least}); asking again"
        )
    found = {j.spec.name: j for j in listed.journals}
    for journal in journals:
        if journal not in found:
            raise JournalNotFoundError(f"source journal {journal!r} does not exist")
    return found


async def current_create_revisions(
    client: JournalClient, journals: Sequence[str], at_least: int = 0
) -> dict[str, int]:
    """The create revision of each of `journals` (`list_sources`)."""
    listed = await list_sources(client, journals, at_least)
    return {j: listed[j].create_revision for j in journals}


async def verify_source(
    client: JournalClient, journal: str, read_from: int, at_least: int = 0
) -> None:
    """Raise SourceRecreatedError if `journal`'s create revision is no longer `read_from`
    (JournalNotFoundError if it is gone), as of etcd revision `at_least` or later: that of the
    read checked, which an older view could show as the incarnation before it
    (StaleListingError, transient, if the broker asked lags it)."""
    if 0 < at_least < read_from:
        raise StaleReadError(
            f"source journal {journal!r}: a read was answered from etcd revision {at_least},"
            f" before the journal the shard reads was created (revision {read_from}): a broker"
            " that had not seen it yet may have served the journal deleted before it"
        )
    current = (await current_create_revisions(client, [journal], at_least))[journal]
    # 0 is unknown (a broker older than the field), never a change.
    if 0 < read_from != current > 0:
        raise SourceRecreatedError(journal, read_from, current)


RESTORED_TOTAL: Final = Counter(
    "gazette_consumer_source_restored_total",
    "Source journals found at a primary's start created again over the content the shard read"
    " (restored from their fragment store), and resumed",
    ["journal"],
)

# A restored journal's tail is read within this (a bounded non-blocking read of TAIL_BYTES).
tail_read_timeout_s: Final = 30.0
# Tails read at once when a primary starts (a shard may read hundreds of journals).
tail_reads_max: Final = 16


async def restored_sources(
    client: JournalClient,
    offsets: Mapping[str, int],
    recorded: Mapping[str, int],
    current: Mapping[str, int],
    fingerprints: Mapping[str, bytes],
    quorum: AbstractSet[str] = frozenset(),
) -> set[str]:
    """The journals of `offsets` (journal -> the checkpoint's read-through offset) created
    again since the checkpoint (`recorded` and `current` create revisions differ, neither 0)
    whose bytes just below the checkpoint's offset are now those the shard read (its
    `fingerprints`): content restored from their fragment store, which the shard resumes (see
    the module docstring). Transient errors reading a tail propagate (the shard retries); a
    tail that cannot be read (not there, lost) is not restored. Journals of `quorum` are never
    (found by review): a quorum leader without a replica on its broker appends without
    checking its stores, so a journal created again may take new content below the end of
    what its store kept, which the premise above rules out."""
    gate = asyncio.Semaphore(tail_reads_max)

    async def restored(journal: str, offset: int, digest: bytes) -> bool:
        async with gate:
            tail = await _tail_now(client, journal, offset, current[journal])
        return tail is not None and tail_digest(tail) == digest

    asked = []
    for journal, offset in sorted(offsets.items()):
        was, now = recorded.get(journal, 0), current.get(journal, 0)
        digest = fingerprints.get(journal)
        if offset <= 0 or was <= 0 or now <= 0 or was == now or not digest:
            continue
        if journal in quorum:
            continue  # Their content below the store's end may be new (`restored_sources`).
        asked.append((journal, offset, digest))
    found = await asyncio.gather(*(restored(*a) for a in asked))
    out = {journal for (journal, _, _), same in zip(asked, found, strict=True) if same}
    for journal in out:
        RESTORED_TOTAL.labels(journal).inc()
    return out


async def tails_now(
    client: JournalClient,
    known: Mapping[str, tuple[int, bytes]],
    current: Mapping[str, int],
) -> dict[str, tuple[int, bytes]]:
    """Per journal of `known` (journal -> its fingerprint's offset and digest), the bytes below
    that offset now, if their digest is the known one: what a reader resumed there is seeded
    with (ReadCommittedIter.seed_tail), so that its next checkpoint has a fingerprint even if
    it read fewer than TAIL_BYTES since (found by review: a commit soon after a start dropped
    it). Tails that cannot be read (any error: logged) or differ are left out."""
    gate = asyncio.Semaphore(tail_reads_max)

    async def tail(journal: str, offset: int) -> bytes | None:
        try:
            async with gate:
                return await _tail_now(client, journal, offset, current.get(journal, 0))
        except Exception as err:  # A seed is optional (found by review): never a failed start.
            _log.warning(
                "could not read the bytes below a source's checkpoint: its next checkpoint may"
                " have no fingerprint",
                journal=journal,
                offset=offset,
                error=repr(err),
            )
            return None

    asked = sorted((j, o, d) for j, (o, d) in known.items() if o > 0)
    found = await asyncio.gather(*(tail(j, o) for j, o, _ in asked))
    out: dict[str, tuple[int, bytes]] = {}
    for (journal, offset, digest), content in zip(asked, found, strict=True):
        if content is not None and tail_digest(content) == digest:
            out[journal] = (offset - len(content), content)
    return out


async def _tail_now(
    client: JournalClient, journal: str, offset: int, incarnation: int
) -> bytes | None:
    """The journal's bytes in `tail_range(offset)` now, or None if they cannot all be read.
    Raises StaleListingError (transient) if the broker that served them had not seen the
    journal's `incarnation` (its create revision) yet: it may have served the journal
    deleted before it (found by review)."""
    begin, end = tail_range(offset)
    reader = RetryReader(client, pb.ReadRequest(journal=journal, offset=begin, end_offset=end))
    parts: list[bytes] = []
    at = begin
    try:
        async with asyncio.timeout(tail_read_timeout_s):
            while at < end:
                chunk = await reader.read_chunk()
                if not chunk.content or chunk.offset != at:
                    return None  # Ended short, or jumped over content lost.
                parts.append(chunk.content)
                at += len(chunk.content)
        served_at = reader.header.etcd.revision
        if 0 < served_at < incarnation:
            raise StaleListingError(
                f"reading {journal}: answered from etcd revision {served_at}, before the"
                f" journal was created (revision {incarnation}); asking again"
            )
    except (OffsetNotYetAvailableError, DataLossError):
        return None  # Not there (its head is below the offset), or lost.
    finally:
        await reader.close()
    return b"".join(parts)[: end - begin]
