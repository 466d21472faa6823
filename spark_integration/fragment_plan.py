"""Planning reads from the fragment index: a journal's fragments, and ranges cut at them.

A journal's content is a sequence of fragments (broker/fragment): the broker's index knows them
all, persisted or not (ListFragments), and a store's listing knows the persisted ones (option
`store`, which needs no broker). Planning lists them once, on the driver, keeps those that no
other covers (`CoverSet`: stores may hold overlapping fragmentations of the same offsets), and
cuts each journal's range into partitions at fragment boundaries (`split_ranges`, sans-IO):
fragments hold whole appends, so a fragment boundary is a message boundary. Each partition
carries the fragments it reads (and those of the look-back before it: range_start.py), with
their signed URLs, so that executors read them straight from the store (sources.py).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from google.protobuf.duration_pb2 import Duration

from broker.client.list_apply import list_all_fragments
from broker.client.route_cache import JournalClient
from broker.fragment.cover_set import CoverSet
from broker.protocol import protocol_pb2 as pb
from spark_integration.sources import FragmentRef

if TYPE_CHECKING:
    from broker.fragment.stores.registry import StoreRegistry  # Its backends: sources.py.

# How long the signed URLs handed to executors stay valid (Gazette's bound: a week). A task
# that starts later reads those fragments through a broker instead.
signed_url_ttl_s: Final = 7 * 86_400
# Partitions cut by default (minPartitions not given) are no smaller than this: each partition
# of a read-committed read looks back before its start and ahead past its end, which costs
# less than splitting gains only for partitions of some size.
auto_partition_bytes_min: Final = 16 << 20


@dataclass(frozen=True)
class JournalFragments:
    """A journal's fragments that no other covers, in offset order, and where its content
    ends: the write head (broker mode) or the end of its last persisted fragment (store mode)."""

    journal: str
    fragments: tuple[FragmentRef, ...]
    head: int

    @property
    def begin(self) -> int:
        """The first offset any fragment holds (content before it was removed)."""
        return self.fragments[0].begin if self.fragments else self.head

    def overlapping(self, begin: int, end: int) -> tuple[FragmentRef, ...]:
        """The fragments holding any of [begin, end)."""
        return tuple(f for f in self.fragments if f.end > begin and f.begin < end)


def _covering(refs: Sequence[FragmentRef]) -> tuple[FragmentRef, ...]:
    cover: CoverSet[FragmentRef] = CoverSet()
    # The latest of equal ranges wins (CoverSet keeps the last added); persisted ones last.
    for ref in sorted(refs, key=lambda r: (r.begin, r.end, r.persisted)):
        cover.add(ref)
    return tuple(cover)


async def broker_fragments(client: JournalClient, journal: str, head: int) -> JournalFragments:
    """The fragments the broker's index knows, persisted ones with signed URLs. The head is
    never below what they hold: `head` came from a non-blocking read, which a broker that has
    not listed its fragment store yet answers too low (broker/client/write_head.py), and a
    batch read planned to it would have left out committed content without an error; the
    listing waits for the store."""
    request = pb.FragmentsRequest(journal=journal, signatureTTL=Duration(seconds=signed_url_ttl_s))
    listing = await list_all_fragments(client, request)
    refs = [FragmentRef.of(item.spec, item.signed_url) for item in listing.fragments]
    covering = _covering([r for r in refs if r.begin < r.end])
    listed = covering[-1].end if covering else 0
    return JournalFragments(journal, covering, max(head, listed))


async def store_fragments(registry: StoreRegistry, store: str, journal: str) -> JournalFragments:
    """The fragments `store` holds (those whose file is damaged too: reading them reports
    their loss, rather than a gap)."""
    listing = await registry.get(store).listing(journal)
    refs = [FragmentRef.of(f) for f in (*listing.fragments, *listing.damaged) if f.begin < f.end]
    covering = _covering(refs)
    return JournalFragments(journal, covering, covering[-1].end if covering else 0)


def store_stream_head(fragments: JournalFragments, now_s: float, grace_s: float) -> int:
    """Where a store-only stream may read to: the end of the persisted fragments, but for a gap
    between them (content not in the store) followed by a fragment persisted less than
    `grace_s` ago, where the content before the gap ends. Brokers do not persist strictly in
    order (an upload whose round failed is retried after the ones behind it), so a young gap
    is most likely an upload still to come: reading past it would report it lost (or skip it,
    with failOnDataLoss false) a moment before it lands. An older gap is read as lost content
    (sources.py), so that a real loss does not stall the query without an error."""
    refs = fragments.fragments
    if not refs:
        return fragments.head
    end = refs[0].end
    for ref in refs[1:]:
        if ref.begin > end and now_s - ref.fragment().mod_time < grace_s:
            return end
        end = max(end, ref.end)
    return end


def split_ranges(
    fragments: Sequence[FragmentRef], begin: int, end: int, target_bytes: int
) -> list[tuple[int, int]]:
    """[begin, end) cut at fragment boundaries into ranges of about `target_bytes` (each at
    least that, but the last; a fragment is never cut)."""
    if end <= begin:
        return []
    ranges = []
    start = begin
    for ref in fragments:
        boundary = ref.end
        if boundary <= start or boundary >= end:
            continue
        if boundary - start >= target_bytes:
            ranges.append((start, boundary))
            start = boundary
    ranges.append((start, end))
    return ranges


def auto_partitions() -> int:
    """Partitions a read is cut into by default: one per core of the planning host (Spark's
    default parallelism in local mode), as Spark users expect of a large read."""
    return max(1, os.cpu_count() or 1)


def target_bytes(total_bytes: int, max_partition_bytes: int, min_partitions: int) -> int:
    """The size partitions are cut to: at most `max_partition_bytes`, and small enough that
    the read has at least `min_partitions` (when its journals can be cut that finely). 0 is
    the default: `auto_partitions()`, but none smaller than `auto_partition_bytes_min`."""
    floor = 1
    if min_partitions == 0:
        min_partitions = auto_partitions()
        floor = min(max_partition_bytes, auto_partition_bytes_min)
    if min_partitions > 1 and total_bytes:
        return max(floor, min(max_partition_bytes, math.ceil(total_bytes / min_partitions)))
    return max_partition_bytes
