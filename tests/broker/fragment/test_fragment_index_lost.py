"""FragmentIndex's lost ranges (broker/fragment/lost.py): fragments that vanish from a listing,
or whose files are empty, are answered as lost rather than as gaps; pruning by retention, a
store dropped from the spec, and a listing racing this broker's own upload are not loss; a
fragment covering the range again clears it. Through the real refresher and a memory store."""

from __future__ import annotations

import asyncio

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.fragment import naming
from broker.fragment.codecs import CompressionCodec
from broker.fragment.index import FragmentIndex, IndexRefresher, offset_jump_age_s
from broker.fragment.lost import lost_fragments_max, retention_clock_skew_s
from broker.fragment.stores.memory_store import MemoryBuckets, MemoryStore
from broker.fragment.stores.registry import StoreRegistry
from broker.fragment.verify import IntegrityFailure
from broker.protocol import protocol_pb2 as pb

JOURNAL = "a/journal"
NOW = 1_700_000_000.0
STORE = "memory://bucket/root/"
OTHER_STORE = "memory://other/"


def persisted(begin: int, end: int, mod_time: int = int(NOW), store: str = STORE) -> pb.Fragment:
    return pb.Fragment(
        journal=JOURNAL,
        begin=begin,
        end=end,
        compression_codec=pb.NONE,
        mod_time=mod_time,
        backing_store=store,
    )


def new_index() -> FragmentIndex:
    return FragmentIndex(JOURNAL, clock=lambda: NOW)


def listed(index: FragmentIndex, fragments: list[pb.Fragment], **kwargs: object) -> None:
    """One listing of STORE replacing the remote fragments."""
    index.replace_remote(fragments, listed_stores=[STORE], **kwargs)  # type: ignore[arg-type]


def test_a_vanished_fragment_is_lost_not_a_gap() -> None:
    index = new_index()
    listed(index, [persisted(0, 10), persisted(10, 20), persisted(20, 30)])
    listed(index, [persisted(0, 10), persisted(20, 30)])
    result = index.query(12)
    assert not result.found and result.lost is not None
    assert (result.offset, result.lost.begin, result.lost.end) == (12, 10, 20)
    assert result.lost.failure is IntegrityFailure.MISSING
    assert "vanished from the store" in str(result.lost.error())
    assert index.query(5).found and index.query(25).found  # Its neighbours are served.


def test_a_jump_over_a_lost_range_lands_on_it() -> None:
    index = new_index()
    old = int(NOW - offset_jump_age_s) - 1
    listed(index, [persisted(0, 10), persisted(100, 110, old), persisted(110, 120, old)])
    listed(index, [persisted(0, 10), persisted(110, 120, old)])
    # From 0, or over an old gap, reads jump gaps; never over lost content.
    for offset in (10, 50):
        result = index.query(offset)
        assert result.lost is not None and result.offset == 100


def test_an_unexplained_gap_before_a_lost_range_still_waits() -> None:
    index = new_index()
    listed(index, [persisted(10, 20), persisted(20, 30)])
    listed(index, [persisted(20, 30)])  # [10, 20) lost; [0, 10) was never known.
    result = index.query(5)
    assert not result.found and result.lost is None and result.offset == 5


def test_an_empty_file_is_lost() -> None:
    index = new_index()
    listed(index, [persisted(0, 10)], damaged=[persisted(10, 20)])
    result = index.query(15)
    assert result.lost is not None and result.lost.failure is IntegrityFailure.EMPTY
    assert "its file in the store is empty" in str(result.lost.error())


def test_pruned_by_retention_or_a_dropped_store_is_not_lost() -> None:
    retention = 7 * 24 * 3600.0
    index = new_index()
    old = int(NOW - retention + retention_clock_skew_s) - 1
    listed(index, [persisted(0, 10, mod_time=old), persisted(10, 20)])
    listed(index, [persisted(10, 20)], retention_s=retention)
    assert index.lost_fragments() == []
    index.replace_remote(
        [persisted(10, 20), persisted(20, 30, store=OTHER_STORE)],
        listed_stores=[STORE, OTHER_STORE],
    )
    index.replace_remote([persisted(10, 20)], listed_stores=[STORE])  # OTHER_STORE dropped.
    assert index.lost_fragments() == []
    index.replace_remote([])  # Without listed_stores (a journal without stores): no tracking.
    assert index.lost_fragments() == []


def test_a_fragment_covering_the_range_again_clears_it() -> None:
    index = new_index()
    listed(index, [persisted(0, 10), persisted(10, 20)])
    listed(index, [persisted(0, 10)])
    assert [(f.begin, f.end) for f in index.lost_fragments()] == [(10, 20)]
    listed(index, [persisted(0, 10), persisted(5, 25)])  # Re-uploaded, cut differently.
    assert index.lost_fragments() == []
    assert index.query(12).found


def test_lost_content_older_than_begin_mod_time_is_skipped() -> None:
    index = new_index()
    listed(index, [persisted(0, 10, mod_time=100), persisted(10, 20, mod_time=300)])
    listed(index, [persisted(10, 20, mod_time=300)])
    assert index.query(5).lost is not None
    result = index.query(5, begin_mod_time=200)
    assert result.found and result.offset == 10


def test_a_listing_racing_this_brokers_upload_loses_nothing() -> None:
    index = new_index()
    listed(index, [persisted(0, 10)])
    mark = index.listing_mark()
    index.add_persisted(persisted(10, 20))  # Uploaded while the listing ran...
    listed(index, [persisted(0, 10)], since=mark)  # ...so the listing lacks it.
    assert index.lost_fragments() == [] and index.query(12).found
    # The next listing began after the upload: a fragment missing from it is gone.
    listed(index, [persisted(0, 10)], since=index.listing_mark())
    assert index.query(12).lost is not None


def test_lost_ranges_are_bounded() -> None:
    index = new_index()
    count = lost_fragments_max + 3
    listed(index, [persisted(i * 10, i * 10 + 10) for i in range(count)])
    listed(index, [])
    lost = index.lost_fragments()
    assert len(lost) == lost_fragments_max and lost[0].begin == 30  # The lowest forgotten.


async def test_a_blocking_read_of_a_lost_range_returns_at_once() -> None:
    index = new_index()
    listed(index, [persisted(0, 10), persisted(10, 20)])
    listed(index, [persisted(0, 10)])
    async with asyncio.timeout(5):
        result = await index.wait_for(12)
    assert result.lost is not None


async def test_the_refresher_reports_deleted_and_emptied_files() -> None:
    buckets = MemoryBuckets(clock=lambda: NOW)
    registry = StoreRegistry({"memory": lambda url: MemoryStore(url, buckets=buckets)})
    store = registry.get(STORE)
    content = b"0123456789"
    fragments = []
    for begin in (0, 10, 20):
        f = persisted(begin, begin + 10)
        f.sum.CopyFrom(naming.content_sum(content))
        f.compression_codec = naming.pb_codec(CompressionCodec.NONE)
        await store.put(f, content)
        fragments.append(f)
    spec = pb.JournalSpec(
        name=JOURNAL,
        replication=1,
        fragment=pb.JournalSpec.Fragment(
            length=1 << 20,
            compression_codec=pb.NONE,
            stores=[STORE],
            refresh_interval=Duration(seconds=30),
            retention=Duration(seconds=24 * 3600),
        ),
    )
    index = new_index()
    refresher = IndexRefresher(index, lambda: spec, registry)
    assert await refresher.refresh()
    await store.delete(fragments[1])
    await store.put(fragments[2], b"")  # Emptied in place (a put replaces in memory://).
    assert await refresher.refresh()
    failures = [(f.begin, f.failure) for f in index.lost_fragments()]
    assert failures == [(10, IntegrityFailure.MISSING), (20, IntegrityFailure.EMPTY)]
    for offset in (10, 25):
        assert index.query(offset).lost is not None


@pytest.mark.parametrize("retention_s", [0.0, 3600.0])
def test_retention_zero_keeps_lost_ranges(retention_s: float) -> None:
    index = new_index()
    old = int(NOW - 30 * 24 * 3600)
    listed(index, [persisted(0, 10, mod_time=old)])
    listed(index, [], retention_s=retention_s)
    assert bool(index.lost_fragments()) is (retention_s == 0.0)
