"""A journal's write head as one broker of its route reports it, without reading content.

One non-blocking, metadata-only Read from offset 0: the answer carries the write head whether
the journal has content (OK) or not (OFFSET_NOT_YET_AVAILABLE), and reading from offset 0 is
not counted as a jump past removed content (read_metrics.py). What the head means depends on
who answers: a quorum journal's non-blocking read passes the read barrier (the leader's commit
offset), but an all-replicas broker answers from its fragment index, which for a moment after
the broker starts knows only its spool, not yet its fragment store: the head is then too low.
A caller that must not mistake that for lost content confirms a low head with
`confirm_write_head`: the fragment listing through the journal's primary, which waits for the
store's first listing (`broker.client.list_apply.list_all_fragments`), and a second probe.
"""

from __future__ import annotations

from broker.client.list_apply import list_all_fragments
from broker.client.reader import Reader
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import OffsetNotYetAvailableError

__all__ = ["confirm_write_head", "probe_write_head"]


async def probe_write_head(client: JournalClient, journal: str) -> int:
    """The journal's write head (the offset its next append lands at), as answered by the
    member of its route the client picks. Raises the typed error of any other status
    (JournalNotFoundError for a journal that does not exist)."""
    reader = Reader(
        client, pb.ReadRequest(journal=journal, offset=0, block=False, metadata_only=True)
    )
    try:
        await reader.read_chunk()
    except OffsetNotYetAvailableError:
        pass  # An empty journal: the metadata response still carries its head.
    finally:
        await reader.close()
    return reader.response.write_head


async def confirm_write_head(client: JournalClient, journal: str, probed: int) -> int:
    """The write head, given a `probed` one that may be too low (the module docstring): the
    largest of it, the end of the journal's fragments as listed through its primary (once its
    fragment store has been listed), and a second probe. Raises the listing's error
    (UNAVAILABLE while the store cannot be listed)."""
    request = pb.FragmentsRequest(journal=journal)
    listing = await list_all_fragments(client, request, require_primary=True)
    listed = max((f.spec.end for f in listing.fragments), default=0)
    return max(probed, listed, await probe_write_head(client, journal))
