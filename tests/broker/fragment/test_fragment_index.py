"""FragmentIndex: local and persisted fragments, queries with jumps, blocking waits, refreshes;
and a property test of queries against a brute-force model of what the index must know."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from google.protobuf.duration_pb2 import Duration
from hypothesis import given
from hypothesis import strategies as st

from broker.fragment import naming
from broker.fragment.codecs import CompressionCodec
from broker.fragment.index import (
    FragmentIndex,
    IndexClosedError,
    IndexRefresher,
    offset_jump_age_s,
    refresh_interval_s,
    relist_delay_s,
)
from broker.fragment.spool import LocalFragment
from broker.fragment.spool_file import MemorySpoolFile
from broker.fragment.stores.base import ListedObject, StoreError, StoreURL
from broker.fragment.stores.memory_store import MemoryBuckets, MemoryStore
from broker.fragment.stores.registry import StoreRegistry
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import ValidationError

JOURNAL = "a/journal"
NOW = 1_700_000_000.0
STORE = "memory://bucket/root/"


def fragment(begin: int, end: int, *, mod_time: int = 0, store: str = "") -> pb.Fragment:
    return pb.Fragment(
        journal=JOURNAL,
        begin=begin,
        end=end,
        compression_codec=pb.NONE,
        mod_time=mod_time,
        backing_store=store,
    )


def local(begin: int, end: int, file: MemorySpoolFile | None = None) -> LocalFragment:
    if file is None:
        file = MemorySpoolFile()
        file.pwrite(bytes(end - begin), 0)
    return LocalFragment(fragment(begin, end), file)


def persisted(begin: int, end: int, mod_time: int = int(NOW)) -> pb.Fragment:
    return fragment(begin, end, mod_time=mod_time, store=STORE)


def ranges(index: FragmentIndex) -> list[tuple[int, int, bool]]:
    """(begin, end, is_local) of every indexed fragment."""
    return [(f.begin, f.end, f.file is not None) for f in index.snapshot()]


def new_index() -> FragmentIndex:
    return FragmentIndex(JOURNAL, clock=lambda: NOW)


# --- Updates -----------------------------------------------------------------------------------


def test_empty_index_has_nothing_at_zero_or_at_the_head() -> None:
    index = new_index()
    for offset in (0, -1, 10):
        result = index.query(offset)
        assert not result.found
        assert result.offset == max(offset, 0)
        assert result.write_head == 0
    assert (index.begin_offset, index.end_offset, index.has_local) == (0, 0, False)


def test_spool_commits_are_served_with_their_file() -> None:
    index = new_index()
    file = MemorySpoolFile()
    file.pwrite(b"0123456789", 0)
    index.spool_commit(LocalFragment(fragment(100, 104), file))
    index.spool_commit(LocalFragment(fragment(100, 110), file))  # Same fragment, extended.
    assert ranges(index) == [(100, 110, True)]
    result = index.query(105)
    assert result.found and result.file is file
    assert (result.offset, result.write_head) == (105, 110)
    assert result.fragment == fragment(100, 110)
    # Queries hand out copies: changing one changes nothing in the index.
    assert result.fragment is not None
    result.fragment.end = 999
    assert index.end_offset == 110


def test_replace_remote_keeps_local_fragments_it_does_not_cover() -> None:
    index = new_index()
    index.spool_commit(local(0, 10))
    index.spool_commit(local(10, 20))
    index.spool_commit(local(20, 30))
    assert not index.first_refresh.is_set()
    # [0, 10) and [10, 20) are covered by two remote fragments cut differently; [20, 30) is not.
    index.replace_remote([persisted(0, 5), persisted(5, 20)])
    assert index.first_refresh.is_set()
    assert ranges(index) == [(0, 5, False), (5, 20, False), (20, 30, True)]
    assert [f.begin for f in index.local_fragments()] == [20]
    # A listing that no longer has [0, 20) does not bring the dropped local fragments back.
    index.replace_remote([])
    assert ranges(index) == [(20, 30, True)]


def test_add_persisted_switches_reads_to_the_store() -> None:
    index = new_index()
    index.spool_commit(local(0, 10))
    index.add_persisted(persisted(0, 10))
    assert ranges(index) == [(0, 10, False)]
    assert not index.has_local
    result = index.query(3)
    assert result.file is None
    assert result.fragment is not None and result.fragment.backing_store == STORE


def test_bad_updates_are_refused_and_change_nothing() -> None:
    index = new_index()
    index.spool_commit(local(0, 10))
    before = ranges(index)
    other = LocalFragment(pb.Fragment(journal="other/journal", begin=10, end=20), MemorySpoolFile())
    with pytest.raises(ValidationError, match="journal: must be the index's journal"):
        index.spool_commit(other)
    with pytest.raises(ValidationError, match="backing_store: must be set"):
        index.add_persisted(fragment(0, 10, mod_time=1))
    with pytest.raises(ValidationError, match="journal"):
        index.replace_remote([pb.Fragment(journal="other/journal", begin=0, end=5)])
    with pytest.raises(ValidationError, match="offset: must be >= -1"):
        index.query(-2)
    assert ranges(index) == before
    assert not index.first_refresh.is_set()


# --- Queries -----------------------------------------------------------------------------------


def test_read_from_zero_jumps_to_the_first_persisted_fragment() -> None:
    index = new_index()
    index.replace_remote([persisted(100, 200)])
    result = index.query(0)
    assert result.found and result.offset == 100


def test_recent_gaps_block_old_gaps_are_jumped() -> None:
    index = new_index()
    index.replace_remote([persisted(0, 10), persisted(20, 30)])
    assert not index.query(12).found  # [20, 30) is recent: the gap may yet be filled.
    index.replace_remote(
        [persisted(0, 10), persisted(20, 30, mod_time=int(NOW - offset_jump_age_s) - 1)]
    )
    result = index.query(12)
    assert result.found and result.offset == 20


def test_local_fragments_are_never_jumped_to() -> None:
    index = new_index()
    index.spool_commit(local(50, 60))
    result = index.query(0)
    assert not result.found and result.offset == 0 and result.write_head == 60


def test_begin_mod_time_skips_older_fragments() -> None:
    index = new_index()
    index.replace_remote([persisted(0, 10, mod_time=100), persisted(10, 20, mod_time=300)])
    index.spool_commit(local(20, 30))
    assert index.query(5, begin_mod_time=200).offset == 10
    # Every persisted fragment is older: the read lands on the local (unpersisted) one.
    result = index.query(0, begin_mod_time=1000)
    assert result.offset == 20 and result.file is not None


def test_offset_minus_one_is_the_write_head() -> None:
    index = new_index()
    index.spool_commit(local(0, 10))
    result = index.query(-1)
    assert (result.found, result.offset, result.write_head) == (False, 10, 10)


# --- Waiting -----------------------------------------------------------------------------------


class WatchedIndex(FragmentIndex):
    """A FragmentIndex that says when a waiter starts waiting, so tests need no sleeps."""

    def __init__(self) -> None:
        super().__init__(JOURNAL, clock=lambda: NOW)
        self.waiting = asyncio.Event()

    async def wait_for(self, offset: int, **kwargs: object) -> object:  # type: ignore[override]
        self.waiting.set()
        return await super().wait_for(offset, **kwargs)  # type: ignore[arg-type]


async def test_wait_for_is_woken_by_a_commit_at_the_head() -> None:
    index = WatchedIndex()
    index.spool_commit(local(0, 10))
    waiter = asyncio.create_task(index.wait_for(-1))
    await index.waiting.wait()  # The waiter is suspended: nothing covers offset 10 yet.
    assert not waiter.done()
    index.spool_commit(local(10, 15))
    result = await waiter
    assert result.offset == 10 and result.fragment is not None and result.fragment.end == 15


async def test_wait_for_times_out_and_fails_on_close() -> None:
    index = WatchedIndex()
    with pytest.raises(TimeoutError):
        await index.wait_for(0, timeout_s=0.01)
    waiter = asyncio.create_task(index.wait_for(0))
    await index.waiting.wait()
    index.close()
    with pytest.raises(IndexClosedError):
        await waiter


async def test_wait_first_refresh() -> None:
    index = new_index()
    task = asyncio.create_task(index.wait_first_refresh(timeout_s=5))
    await asyncio.sleep(0)
    assert not task.done()
    index.replace_remote([])
    await task


def test_close_closes_the_files_it_still_holds() -> None:
    index = new_index()
    kept, dropped = local(10, 20), local(0, 10)
    index.spool_commit(dropped)
    index.spool_commit(kept)
    index.replace_remote([persisted(0, 10)])
    index.close()
    assert kept.file.closed and not dropped.file.closed
    with pytest.raises(IndexClosedError):
        index.spool_commit(local(20, 30))


# --- Refreshing --------------------------------------------------------------------------------


class FlakyListStore(MemoryStore):
    """A memory store whose listings fail while `failing` is set."""

    failing = False

    async def _list(self, prefix: str) -> list[ListedObject]:
        if self.failing:
            raise StoreError("listing unavailable (injected)")
        return await super()._list(prefix)


def spec_with(stores: list[str], refresh_s: int = 30) -> pb.JournalSpec:
    return pb.JournalSpec(
        name=JOURNAL,
        replication=1,
        fragment=pb.JournalSpec.Fragment(
            length=1 << 20,
            compression_codec=pb.NONE,
            stores=stores,
            refresh_interval=Duration(seconds=refresh_s),
        ),
    )


async def test_refresher_lists_every_store_and_backs_off_on_failure() -> None:
    buckets = MemoryBuckets(clock=lambda: NOW)
    made: dict[str, FlakyListStore] = {}

    def build(url: StoreURL) -> FlakyListStore:
        made[url.url] = FlakyListStore(url, buckets=buckets)
        return made[url.url]

    registry = StoreRegistry({"memory": build})
    stores = ["memory://one/", "memory://two/x/"]
    content = b"hello"
    for url, begin in zip(stores, (0, 5), strict=True):
        f = pb.Fragment(
            journal=JOURNAL,
            begin=begin,
            end=begin + len(content),
            sum=naming.content_sum(content),
            compression_codec=naming.pb_codec(CompressionCodec.NONE),
        )
        await registry.get(url).put(f, content)

    spec: pb.JournalSpec | None = spec_with(stores)
    index = new_index()
    refresher = IndexRefresher(index, lambda: spec, registry)
    index.spool_commit(local(10, 12))
    assert await refresher.step() == 30.0
    assert ranges(index) == [(0, 5, False), (5, 10, False), (10, 12, True)]
    assert {f.backing_store for f in index.fragments()[:2]} == set(stores)

    made[stores[1]].failing = True
    delays = [await refresher.step() for _ in range(7)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]  # Doubling, capped at the interval.
    assert ranges(index)[:2] == [(0, 5, False), (5, 10, False)]  # A failed listing changes nothing.
    made[stores[1]].failing = False
    assert await refresher.step() == 30.0 and refresher.failures == 0

    spec = None  # The journal was deleted: listings stop changing the index.
    assert not await refresher.refresh()


async def test_refresher_run_sleeps_the_interval_and_stops_when_closed() -> None:
    index = new_index()
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)
        if len(slept) == 3:
            index.close()

    registry = StoreRegistry({})
    await IndexRefresher(index, lambda: spec_with([], refresh_s=5), registry, sleep=sleep).run()
    assert slept == [5.0, 5.0, 5.0]


async def test_refresher_lists_again_soon_when_the_index_asks() -> None:
    # A read that finds a listed fragment pruned asks for a listing (relist_wanted): the
    # refresher serves it after a short pause rather than at its interval (an hour here).
    buckets = MemoryBuckets(clock=lambda: NOW)
    url = "memory://relist/"
    registry = StoreRegistry({"memory": lambda u: MemoryStore(u, buckets=buckets)})
    index = new_index()
    slept: list[float] = []
    never = asyncio.Event()

    async def sleep(delay: float) -> None:
        slept.append(delay)
        if delay != relist_delay_s:
            await never.wait()  # The regular interval does not pass in this test.

    refresher = IndexRefresher(
        index, lambda: spec_with([url], refresh_s=3600), registry, sleep=sleep
    )
    running = asyncio.create_task(refresher.run())
    try:
        async with asyncio.timeout(10):
            await index.first_refresh.wait()
            content = b"listed later"
            fragment = pb.Fragment(
                journal=JOURNAL,
                begin=0,
                end=len(content),
                sum=naming.content_sum(content),
                compression_codec=naming.pb_codec(CompressionCodec.NONE),
            )
            await registry.get(url).put(fragment, content)
            index.relist_wanted.set()
            result = await index.wait_for(0)  # Listed by the next listing.
        assert result.fragment is not None and result.fragment.end == len(content)
        assert slept == [3600.0, relist_delay_s]
        assert not index.relist_wanted.is_set()
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


def test_refresh_interval_is_clamped() -> None:
    assert refresh_interval_s(spec_with([], refresh_s=0)) == 1.0
    assert refresh_interval_s(spec_with([], refresh_s=10**6)) == 24 * 3600.0


# --- Property: queries agree with a brute-force model --------------------------------------------


@dataclass
class Model:
    """What the index must know: local ranges not yet covered by a store, and store ranges."""

    local: list[tuple[int, int]]
    remote: list[tuple[int, int]]

    @staticmethod
    def covered(span: tuple[int, int], by: list[tuple[int, int]]) -> bool:
        # Covered by the union of `by`: every offset (or, for an empty span, its point).
        begin, end = span
        points = range(begin, end) if end > begin else [begin]
        return all(any(b <= p and (p < e or (p == e == end)) for b, e in by) for p in points) and (
            end > begin or any(b <= begin <= e for b, e in by)
        )

    def answer(self, offset: int) -> tuple[int, int] | None:
        """The longest end of a fragment covering `offset`, with that end; None if none."""
        ends = [e for b, e in self.local + self.remote if b <= offset < e]
        return (offset, max(ends)) if ends else None

    def head(self) -> int:
        return max((e for _, e in self.local + self.remote), default=0)


spans = st.tuples(st.integers(0, 40), st.integers(0, 12)).map(lambda t: (t[0], t[0] + t[1]))
ops = st.one_of(
    st.tuples(st.just("commit"), spans),
    st.tuples(st.just("persist"), spans),
    st.tuples(st.just("replace"), st.lists(spans, max_size=4)),
)


@given(st.lists(ops, max_size=25), st.lists(st.integers(1, 55), min_size=1, max_size=10))
def test_queries_match_a_model(operations: list[tuple[str, object]], offsets: list[int]) -> None:
    index = new_index()
    model = Model([], [])
    for op, arg in operations:
        if op == "commit":
            span = arg
            assert isinstance(span, tuple)
            index.spool_commit(local(*span))
            model.local.append(span)
        elif op == "persist":
            span = arg
            assert isinstance(span, tuple)
            index.add_persisted(persisted(*span))
            model.remote.append(span)
            model.local = [s for s in model.local if not Model.covered(s, [span])]
        else:
            listing = arg
            assert isinstance(listing, list)
            index.replace_remote([persisted(b, e) for b, e in listing])
            model.remote = list(listing)
            model.local = [s for s in model.local if not Model.covered(s, listing)]

    assert index.end_offset == model.head()
    for offset in offsets:
        # Offsets > 0 with recent fragments never jump: the answer is pure coverage.
        result = index.query(offset)
        expect = model.answer(offset)
        if expect is None:
            assert not result.found and result.offset == offset
            continue
        assert result.fragment is not None
        assert (result.offset, result.fragment.end) == expect
        assert result.fragment.begin <= offset
        if result.file is not None:
            assert (result.fragment.begin, result.fragment.end) in model.local
