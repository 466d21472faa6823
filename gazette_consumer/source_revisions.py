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
(source_heads.find_recreated), even to a journal created again over the same fragment store,
whose persisted content is back at the same offsets: nothing at hand tells that from new
content appended past the checkpoint since, which resuming would skip (its docstring says
why). While a primary reads, its readers check the create revision again (`verify_source`)
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

from collections.abc import Mapping, Sequence
from typing import Final

from google.protobuf.unknown_fields import UnknownFieldSet

from broker.client.list_apply import list_journals
from broker.client.route_cache import JournalClient
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import JournalNotFoundError

__all__ = [
    "CREATE_REVISION_FIELD",
    "SourceRecreatedError",
    "StaleListingError",
    "create_revisions_of",
    "current_create_revisions",
    "stamp_create_revisions",
    "verify_source",
]

# Field number of the create revision in a checkpoint's Source message: far above Gazette's
# (1, 2), so that a field Gazette adds later is not mistaken for it.
CREATE_REVISION_FIELD: Final = 1000
_VARINT: Final = 0  # Wire type.
_TAG: Final = (CREATE_REVISION_FIELD << 3) | _VARINT


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


def stamp_create_revisions(cp: cpb.Checkpoint, revisions: Mapping[str, int]) -> None:
    """Record in `cp` the create revision of each of its sources that `revisions` names
    (replacing one recorded before)."""
    for journal, revision in revisions.items():
        if journal not in cp.sources or revision <= 0:
            continue
        source = cp.sources[journal]
        source.DiscardUnknownFields()  # Ours is the only unknown field a Source carries.
        source.MergeFromString(_varint(_TAG) + _varint(revision))


def create_revisions_of(cp: cpb.Checkpoint) -> dict[str, int]:
    """The create revisions `cp` records, by journal (journals without one are left out)."""
    out: dict[str, int] = {}
    for journal, source in cp.sources.items():
        unknown = UnknownFieldSet(source)
        for i in range(len(unknown)):
            field = unknown[i]
            if field.field_number == CREATE_REVISION_FIELD and field.wire_type == _VARINT:
                out[journal] = field.data
    return out


class StaleListingError(ConnectionError):
    """The broker asked for a journal's create revision answered from an older view of etcd
    than the read being checked (transient: its view catches up)."""


async def current_create_revisions(
    client: JournalClient, journals: Sequence[str], at_least: int = 0
) -> dict[str, int]:
    """The create revision of each of `journals` (one List RPC); raises JournalNotFoundError
    naming the first journal that does not exist, and StaleListingError if the broker listed
    them from an etcd revision below `at_least`."""
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
    found = {j.spec.name: j.create_revision for j in listed.journals}
    for journal in journals:
        if journal not in found:
            raise JournalNotFoundError(f"source journal {journal!r} does not exist")
    return found


async def verify_source(
    client: JournalClient, journal: str, read_from: int, at_least: int = 0
) -> None:
    """Raise SourceRecreatedError if `journal`'s create revision is no longer `read_from`
    (JournalNotFoundError if it is gone), as of etcd revision `at_least` or later: that of the
    read checked, which an older view could show as the incarnation before it
    (StaleListingError, transient, if the broker asked lags it)."""
    current = (await current_create_revisions(client, [journal], at_least))[journal]
    # 0 is unknown (a broker older than the field), never a change.
    if 0 < read_from != current > 0:
        raise SourceRecreatedError(journal, read_from, current)
