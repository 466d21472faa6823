"""A journal's write head as one broker of its route reports it, without reading content.

One non-blocking, metadata-only Read at offset -1 (the write head): the broker answers
OFFSET_NOT_YET_AVAILABLE carrying the head, without looking up a fragment (so neither lost
content at the journal's start, which a read from 0 answers DATA_LOSS, nor a URL to sign gets
in the way), and it is no jump past removed content (read_metrics.py). What the head means
depends on who answers: a quorum journal's non-blocking read passes the read barrier (the
leader's commit offset), but an all-replicas broker answers from its fragment index, which for
a moment after the broker starts knows only its spool, not yet its fragment store: the head is
then too low. A caller that must not mistake that for lost content confirms a low head with
`confirm_write_head`: the fragment listing through the journal's primary, which waits for the
store's first listing (`broker.client.list_apply.list_all_fragments`), the journal's
suspension offset (a suspended journal's next append lands there, whatever its index holds:
append_suspend.py), and a second probe.
"""

from __future__ import annotations

from typing import Final

from broker.client.list_apply import get_journal, list_all_fragments
from broker.client.reader import Reader
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import NotJournalPrimaryBrokerError, OffsetNotYetAvailableError

__all__ = [
    "confirm_attempts_max",
    "confirm_write_head",
    "primary_listing",
    "probe_write_head",
]

# Listings `confirm_write_head` asks before giving up on reaching the journal's primary (each
# answer teaches the client the current route).
confirm_attempts_max: Final = 3


async def probe_write_head(client: JournalClient, journal: str) -> int:
    """The journal's write head (the offset its next append lands at), as answered by the
    member of its route the client picks. Raises the typed error of any other status
    (JournalNotFoundError for a journal that does not exist)."""
    reader = Reader(
        client, pb.ReadRequest(journal=journal, offset=-1, block=False, metadata_only=True)
    )
    try:
        await reader.read_chunk()
    except OffsetNotYetAvailableError:
        pass  # Nothing at the head yet, by definition: the response still carries it.
    finally:
        await reader.close()
    return reader.response.write_head


async def primary_listing(client: JournalClient, journal: str) -> pb.FragmentsResponse:
    """The journal's fragments as its primary lists them (once its fragment store has been
    listed). Raises the listing's error, or NotJournalPrimaryBrokerError (retriable) if a
    broker other than the primary answered each of `confirm_attempts_max` asks."""
    request = pb.FragmentsRequest(journal=journal)
    for attempt in range(1, confirm_attempts_max + 1):
        listing = await list_all_fragments(client, request, require_primary=True)
        header = listing.header
        route = header.route
        members = route.members
        if 0 <= route.primary < len(members) and members[route.primary] == header.process_id:
            return listing
        # The answer taught the client the route (list_all_fragments): ask again, now of
        # the primary it names, if it names one.
        if attempt == confirm_attempts_max:
            answered = f"{header.process_id.zone}/{header.process_id.suffix}".strip("/")
            raise NotJournalPrimaryBrokerError(
                f"listing fragments of {journal}: answered by {answered or 'a broker'}, not"
                " the journal's primary: its write head cannot be confirmed yet"
            )
    raise AssertionError("unreachable: the last attempt returns or raises")


async def confirm_write_head(client: JournalClient, journal: str, probed: int) -> int:
    """The write head, given a `probed` one that may be too low (the module docstring): the
    largest of it, the end of the journal's fragments as listed by its primary (once its
    fragment store has been listed), its suspension offset, and a second probe. Raises the
    listing's error (UNAVAILABLE while the store cannot be listed), or
    NotJournalPrimaryBrokerError (retriable) if a broker other than the journal's primary
    answered it: the client's route was stale, or the journal has no primary right now, and a
    replica that joined late may lack the primary's unpersisted content."""
    listing = await primary_listing(client, journal)
    listed = max((f.spec.end for f in listing.fragments), default=0)
    suspended = (await get_journal(client, journal)).suspend.offset
    return max(probed, listed, suspended, await probe_write_head(client, journal))
