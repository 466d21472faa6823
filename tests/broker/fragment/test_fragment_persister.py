"""Persister: uploads with bounded retries against a fault-injecting store, hand-over of the
persisted fragment to the index, file ownership, the bounded queue and replica delays."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.fragment import codecs, naming
from broker.fragment.codecs import CompressionCodec
from broker.fragment.index import FragmentIndex
from broker.fragment.persister import (
    Outcome,
    Persister,
    PersisterClosedError,
    PersistQueueFullError,
)
from broker.fragment.spool import CompletedSpool, LocalFragment, Spool
from broker.fragment.spool_file import MemorySpoolFile
from broker.fragment.stores.base import Content, StoreError, StoreURL
from broker.fragment.stores.memory_store import MemoryBuckets, MemoryStore
from broker.fragment.stores.registry import StoreRegistry
from broker.protocol import protocol_pb2 as pb

JOURNAL = "a/journal"
STORE = "memory://bucket/prefix/"
NOW = 1_700_000_000.0


class FaultyStore(MemoryStore):
    """A memory store whose puts fail `put_failures` times (then succeed), counting calls."""

    def __init__(self, url: StoreURL, buckets: MemoryBuckets) -> None:
        super().__init__(url, buckets=buckets)
        self.put_failures = 0
        self.puts = 0
        self.exists_calls = 0

    async def _put(self, key: str, content: Content, content_encoding: str) -> None:
        self.puts += 1
        if self.put_failures > 0:
            self.put_failures -= 1
            raise StoreError("put failed (injected)")
        await super()._put(key, content, content_encoding)

    async def _exists(self, key: str) -> bool:
        self.exists_calls += 1
        return await super()._exists(key)


class Env:
    def __init__(self, *, stores: list[str] | None = None, **persister_args: object) -> None:
        self.buckets = MemoryBuckets(clock=lambda: NOW)
        self.stores: dict[str, FaultyStore] = {}
        self.registry = StoreRegistry({"memory": self._build})
        self.spec: pb.JournalSpec | None = pb.JournalSpec(
            name=JOURNAL,
            replication=1,
            fragment=pb.JournalSpec.Fragment(
                length=1 << 20,
                compression_codec=pb.GZIP,
                stores=[STORE] if stores is None else stores,
                refresh_interval=Duration(seconds=60),
            ),
        )
        self.index = FragmentIndex(JOURNAL, clock=lambda: NOW)
        self.sleeps: list[float] = []
        self.now = NOW
        persister_args.setdefault("sleep", self._sleep)
        persister_args.setdefault("new_file", MemorySpoolFile)
        self.persister = Persister(
            self.registry,
            lambda journal: self.spec if journal == JOURNAL else None,
            clock=lambda: self.now,
            **persister_args,  # type: ignore[arg-type]
        )

    def _build(self, url: StoreURL) -> FaultyStore:
        self.stores[url.url] = FaultyStore(url, self.buckets)
        return self.stores[url.url]

    async def _sleep(self, delay: float) -> None:
        self.sleeps.append(delay)
        self.now += delay

    @property
    def store(self) -> FaultyStore:
        store = self.registry.get(STORE)
        assert isinstance(store, FaultyStore)
        return store

    async def stored(self, fragment: pb.Fragment) -> bytes:
        f = pb.Fragment()
        f.CopyFrom(fragment)
        f.backing_store = STORE
        raw = await self.store.read(f, 1 << 30)
        return codecs.decompress(f.compression_codec, raw)


def completed(
    begin: int,
    content: bytes,
    *,
    codec: CompressionCodec = CompressionCodec.NONE,
    primary: bool = True,
    index: FragmentIndex | None = None,
) -> CompletedSpool:
    """A completed spool of `content`, also committed to `index` as a local fragment."""
    file = MemorySpoolFile()
    file.pwrite(content, 0)
    fragment = pb.Fragment(
        journal=JOURNAL,
        begin=begin,
        end=begin + len(content),
        sum=naming.content_sum(content),
        compression_codec=naming.pb_codec(codec),
    )
    if index is not None:
        index.spool_commit(LocalFragment(fragment, file))
    return CompletedSpool(
        fragment=fragment,
        registers=pb.LabelSet(),
        first_append_time=NOW,
        content_file=file,
        compressed_file=None,
        compressed_length=0,
        primary=primary,
    )


async def test_persists_to_the_first_store_and_hands_over_to_the_index() -> None:
    env = Env(stores=[STORE, "memory://other/"])
    done = completed(100, b"some content\n", index=env.index)
    assert await env.persister.persist(done, env.index) is Outcome.PERSISTED
    assert await env.stored(done.fragment) == b"some content\n"
    assert "memory://other/" not in env.stores  # Only the first store is written.
    # Reads now go through the store: the index indexes the persisted fragment, not the file.
    result = env.index.query(105)
    assert result.file is None and result.fragment is not None
    assert (result.fragment.backing_store, result.fragment.mod_time) == (STORE, int(NOW))
    assert not env.index.has_local
    assert done.content_file.closed


async def test_compresses_when_the_spool_did_not() -> None:
    env = Env()
    content = b"line of text\n" * 1000
    done = completed(0, content, codec=CompressionCodec.ZSTANDARD)
    assert await env.persister.persist(done) is Outcome.PERSISTED
    assert await env.stored(done.fragment) == content
    keys = [k for k, _ in env.buckets.items("bucket", "")]
    assert keys == ["prefix/" + naming.content_path(done.fragment)]
    assert keys[0].endswith(".zst")


async def test_a_cancelled_persist_waits_for_its_compression_thread() -> None:
    # The compressing thread reads the content file, which whoever owns it may close (and a
    # memory spool's blocks go to other spools) once the persist ends: a cancellation must
    # not end it while the thread still reads.
    gate, made = threading.Event(), list[MemorySpoolFile]()

    def gated_file() -> MemorySpoolFile:
        gate.wait(timeout=30)
        made.append(MemorySpoolFile())
        return made[-1]

    env = Env(new_file=gated_file)
    done = completed(0, b"line of text\n" * 100, codec=CompressionCodec.GZIP)
    persist = asyncio.ensure_future(env.persister.persist(done))
    await asyncio.sleep(0.05)  # Into the thread, held at the gate.
    persist.cancel()
    await asyncio.sleep(0.05)
    assert not persist.done()  # Waiting for the thread, which still reads the content.
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await persist
    assert [f.closed for f in made] == [True]  # Its output, which nobody takes, discarded.


async def test_uploads_the_primary_spools_compressed_file() -> None:
    env = Env()
    index = FragmentIndex(JOURNAL)
    completions: list[CompletedSpool] = []

    class Observer:
        def on_commit(self, fragment: LocalFragment) -> None:
            index.spool_commit(fragment)

        def on_complete(self, c: CompletedSpool) -> None:
            completions.append(c)

    spool = Spool(JOURNAL, Observer(), new_file=MemorySpoolFile, clock=lambda: NOW)
    roll = pb.Fragment(journal=JOURNAL, begin=0, end=0, compression_codec=pb.GZIP)
    spool.must_apply(pb.ReplicateRequest(proposal=roll, registers=pb.LabelSet()))
    spool.apply(pb.ReplicateRequest(content=b"hello, world\n"), primary=True)
    spool.apply(pb.ReplicateRequest(proposal=spool.next(), registers=pb.LabelSet()), primary=True)
    end = spool.fragment.end
    spool.apply(
        pb.ReplicateRequest(
            proposal=pb.Fragment(journal=JOURNAL, begin=end, end=end, compression_codec=pb.GZIP),
            registers=pb.LabelSet(),
        ),
        primary=True,  # A primary's roll completes the compression.
    )
    (done,) = completions
    assert done.compressed_file is not None
    assert await env.persister.persist(done, index) is Outcome.PERSISTED
    assert await env.stored(done.fragment) == b"hello, world\n"
    assert done.compressed_file.closed and done.content_file.closed
    assert index.query(0).file is None


async def test_retries_with_backoff_until_the_store_recovers() -> None:
    env = Env(attempts_max=5, backoff_initial_s=0.5)
    env.store.put_failures = 3
    done = completed(0, b"abc", index=env.index)
    assert await env.persister.persist(done, env.index) is Outcome.PERSISTED
    assert env.store.puts == 4
    assert env.sleeps == [0.5, 1.0, 2.0]
    assert env.persister.stats.failed_attempts == 3
    assert await env.stored(done.fragment) == b"abc"


async def test_gives_up_after_attempts_max_and_keeps_the_content_local() -> None:
    env = Env(attempts_max=3, backoff_initial_s=1.0, backoff_max_s=1.5)
    env.store.put_failures = 100
    done = completed(0, b"abc", index=env.index)
    assert await env.persister.persist(done, env.index) is Outcome.GAVE_UP
    assert env.store.puts == 3
    assert env.sleeps == [1.0, 1.5]  # Capped back-off, and none after the last attempt.
    assert env.persister.stats.outcomes[Outcome.GAVE_UP] == 1
    # Nothing is lost: the index still serves the content from the (still open) local file.
    result = env.index.query(1)
    assert result.file is done.content_file and not done.content_file.closed
    assert result.file.pread(3, 0) == b"abc"


async def test_already_present_counts_as_done() -> None:
    env = Env()
    first = completed(0, b"same bytes")
    assert await env.persister.persist(first) is Outcome.PERSISTED
    again = completed(0, b"same bytes", index=env.index)
    assert await env.persister.persist(again, env.index) is Outcome.ALREADY_PRESENT
    assert env.store.puts == 1
    assert env.index.query(0).file is None
    assert again.content_file.closed


async def test_no_store_and_removed_journal_leave_content_to_the_index() -> None:
    env = Env(stores=[])
    done = completed(0, b"abc", index=env.index)
    assert await env.persister.persist(done, env.index) is Outcome.NO_STORE
    assert env.index.query(0).file is done.content_file and not done.content_file.closed

    env.spec = None
    gone = completed(3, b"def", index=env.index)
    assert await env.persister.persist(gone, env.index) is Outcome.JOURNAL_REMOVED
    assert not gone.content_file.closed
    # The index closes what it still holds when it is closed itself.
    env.index.close()
    assert done.content_file.closed and gone.content_file.closed


async def test_empty_fragments_are_not_uploaded() -> None:
    env = Env()
    assert await env.persister.persist(completed(7, b"")) is Outcome.EMPTY
    assert env.store.exists_calls == 0


async def test_queue_is_bounded() -> None:
    index = FragmentIndex(JOURNAL)
    # index_of: the broker's lookup of a journal's local replica.
    env = Env(queue_len_max=2, index_of=lambda journal: index)
    first, second, third = (completed(i, b"x") for i in range(3))
    env.persister.submit_nowait(first)
    env.persister.submit_nowait(second)
    with pytest.raises(PersistQueueFullError):
        env.persister.submit_nowait(third)
    assert env.persister.pending == 2
    # The spool's hook never raises: the fragment stays local, counted.
    fourth = completed(3, b"y", index=index)
    env.persister.on_complete(fourth)
    assert env.persister.stats.outcomes[Outcome.QUEUE_FULL] == 1
    assert index.query(3).file is fourth.content_file and not fourth.content_file.closed
    # A blocking submit waits for room.
    waiter = asyncio.create_task(env.persister.submit(third))
    await asyncio.sleep(0)
    assert not waiter.done()
    await env.persister.run(drain=True)
    await waiter
    await env.persister.run(drain=True)
    assert env.persister.stats.outcomes[Outcome.PERSISTED] == 3
    env.persister.close()
    with pytest.raises(PersisterClosedError):
        env.persister.submit_nowait(completed(9, b"z"))


async def test_replicas_wait_for_the_primary_and_find_it_done() -> None:
    env = Env(replica_delay_s=120.0)
    replica = completed(0, b"replicated", primary=False, index=env.index)
    env.persister.submit_nowait(replica, env.index)
    # Meanwhile, the primary uploads the same fragment.
    primary_copy = completed(0, b"replicated")
    await env.persister.persist(primary_copy)
    puts = env.store.puts

    assert await env.persister.step() is Outcome.ALREADY_PRESENT
    assert env.sleeps == [2.0]  # Its first check (replica_check_s), not the whole delay.
    assert env.store.puts == puts  # The replica only checked.
    assert env.index.query(0).file is None


async def test_drain_does_not_wait_out_replica_delays() -> None:
    env = Env(replica_delay_s=120.0)
    env.persister.submit_nowait(completed(0, b"abc", primary=False))
    await env.persister.run(drain=True)
    assert env.sleeps == []
    assert env.persister.stats.outcomes[Outcome.PERSISTED] == 1


async def test_replicas_check_at_doubling_intervals_then_upload_at_the_delay() -> None:
    env = Env(replica_delay_s=10.0, replica_check_s=2.0)
    orphaned = completed(0, b"orphaned", primary=False, index=env.index)
    env.persister.submit_nowait(orphaned, env.index)

    # The primary never uploads: checks at +2 and +6 s find nothing; at +10 s it uploads.
    assert await env.persister.step() is Outcome.DEFERRED
    assert await env.persister.step() is Outcome.DEFERRED
    assert env.persister.pending == 1
    puts = env.store.puts
    assert await env.persister.step() is Outcome.PERSISTED
    assert env.sleeps == [2.0, 4.0, 4.0]
    assert env.store.puts == puts + 1
    assert env.persister.pending == 0
    assert env.index.query(0).file is None  # Reads now go through the store.


async def test_a_new_primary_uploads_what_it_held_for_the_former_one_at_once() -> None:
    # Found by the soak: a primary died before uploading (a store outage, then a kill); the
    # replicas held the fragment for the whole replica delay (two minutes), and brokers
    # without a copy could not serve its offsets meanwhile.
    env = Env(replica_delay_s=120.0, replica_check_s=2.0)
    held = completed(0, b"held for the primary", primary=False, index=env.index)
    env.persister.submit_nowait(held, env.index)
    assert await env.persister.step() is Outcome.DEFERRED  # Its first check: not there.
    assert env.persister.expedite("other/journal") == 0  # Another journal's: nothing.
    assert env.persister.expedite(JOURNAL) == 1  # This broker became the primary.
    puts = env.store.puts
    assert await env.persister.step() is Outcome.PERSISTED
    assert env.sleeps == [2.0]  # No wait after the expedite.
    assert env.store.puts == puts + 1
    # A replica fragment completed after this broker became primary is not expedited.
    env.now += 1.0
    later = completed(20, b"a later replica fragment", primary=False)
    env.persister.submit_nowait(later)
    assert await env.persister.step() is Outcome.DEFERRED
    assert env.persister.expedite(JOURNAL) == 1  # ...until the next pulse as primary.


async def test_a_replica_fragment_between_checks_does_not_hold_up_the_primarys() -> None:
    env = Env(replica_delay_s=120.0, replica_check_s=2.0)
    env.persister.submit_nowait(completed(0, b"replica", primary=False))
    env.persister.submit_nowait(completed(7, b"primary"))

    assert await env.persister.step() is Outcome.PERSISTED  # The primary's, at once.
    assert env.sleeps == []
    assert await env.persister.step() is Outcome.DEFERRED  # Then the replica's check.
    assert env.sleeps == [2.0]


async def test_an_arrival_wakes_a_worker_waiting_for_a_replica_check() -> None:
    slept: list[float] = []

    async def never(delay: float) -> None:
        slept.append(delay)
        await asyncio.Event().wait()

    env = Env(replica_delay_s=120.0, replica_check_s=2.0, sleep=never)
    env.persister.submit_nowait(completed(0, b"replica", primary=False))
    step = asyncio.ensure_future(env.persister.step())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not step.done() and slept == [2.0]  # Waiting for the replica's first check.

    env.persister.submit_nowait(completed(7, b"primary"))
    assert await asyncio.wait_for(step, 5) is Outcome.PERSISTED
    assert env.persister.pending == 1  # The replica's, still waiting for its check.


async def test_drain_persists_replica_fragments_between_checks() -> None:
    env = Env(replica_delay_s=120.0, replica_check_s=2.0)
    env.persister.submit_nowait(completed(0, b"abc", primary=False))
    assert await env.persister.step() is Outcome.DEFERRED
    await env.persister.run(drain=True)
    assert env.sleeps == [2.0]
    assert env.persister.stats.outcomes[Outcome.PERSISTED] == 1
    assert env.persister.pending == 0


async def test_waiting_replica_fragments_are_bounded() -> None:
    env = Env(replica_delay_s=120.0, replica_check_s=2.0, queue_len_max=1)
    env.persister.submit_nowait(completed(0, b"replica", primary=False))
    assert await env.persister.step() is Outcome.DEFERRED  # Waiting: the bound is reached.
    env.persister.submit_nowait(completed(7, b"second", primary=False))
    env.persister.submit_nowait(completed(13, b"primary"))
    # A primary's fragment is taken whatever waits; the second replica's stays queued while
    # the first fills the bound, and the first comes next, once due.
    assert await env.persister.step() is Outcome.PERSISTED
    assert env.sleeps == [2.0]
    assert await env.persister.step() is Outcome.DEFERRED
    assert env.sleeps == [2.0, 4.0]
    assert env.persister.pending == 2


async def test_a_worker_cancelled_while_waiting_loses_no_fragment() -> None:
    async def never(delay: float) -> None:
        await asyncio.Event().wait()

    for turns in range(3):  # The fragment arrives 0, 1 or 2 loop turns before the cancel.
        env = Env(replica_delay_s=120.0, replica_check_s=2.0, sleep=never)
        env.persister.submit_nowait(completed(0, b"replica", primary=False))
        step = asyncio.ensure_future(env.persister.step())
        await asyncio.sleep(0)  # The worker parks the replica's and waits.
        env.persister.submit_nowait(completed(7, b"primary"))
        for _ in range(turns):
            await asyncio.sleep(0)
        step.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await step
        # The primary's was persisted by the step, or is still queued: never dropped.
        persisted = env.persister.stats.outcomes[Outcome.PERSISTED]
        assert env.persister.pending + persisted == 2
        await env.persister.run(drain=True)
        assert env.persister.pending == 0
        assert env.persister.stats.outcomes[Outcome.PERSISTED] == 2


async def test_a_primary_fragment_is_uploaded_even_if_the_clock_steps_back() -> None:
    env = Env(replica_delay_s=120.0, replica_check_s=2.0)
    env.persister.submit_nowait(completed(0, b"primary"))
    env.now -= 3600.0  # The wall clock steps back (NTP, a resumed VM).
    assert await env.persister.step() is Outcome.PERSISTED
    assert env.persister.stats.outcomes[Outcome.DEFERRED] == 0


@pytest.mark.parametrize("attempts_max", [0])
def test_bad_bounds_are_refused(attempts_max: int) -> None:
    make: Callable[[], object] = lambda: Env(attempts_max=attempts_max)  # noqa: E731
    with pytest.raises(ValueError, match="attempts_max"):
        make()


async def test_a_fragment_whose_attempts_all_failed_gets_another_round_later() -> None:
    # Found by review: a store down for longer than a round of attempts (~1 min; a replica's,
    # after its delay, ~3 min) left the fragment with no upload ever again: its content stayed
    # on brokers only, and went with them once the journal moved.
    env = Env(attempts_max=2, backoff_initial_s=1.0, backoff_max_s=1.0)
    env.store.put_failures = 4  # Two whole rounds fail.
    done = completed(0, b"abc", index=env.index)
    env.persister.submit_nowait(done, env.index)
    assert await env.persister.step() is Outcome.GAVE_UP
    assert not done.content_file.closed  # Kept, and still served from the local file.
    async with asyncio.timeout(5.0):  # (Sleeps are simulated: a job dropped waits for ever.)
        assert await env.persister.step() is Outcome.GAVE_UP
        assert await env.persister.step() is Outcome.PERSISTED
    assert env.sleeps == [1.0, 30.0, 1.0, 60.0]  # Rounds 30 s then 60 s apart.
    assert await env.stored(done.fragment) == b"abc"
    assert env.index.query(1).file is None  # Read from the store from now on.


async def test_a_drain_gives_a_given_up_fragment_one_more_round_only() -> None:
    env = Env(attempts_max=1)
    env.store.put_failures = 100
    done = completed(0, b"abc", index=env.index)
    env.persister.submit_nowait(done, env.index)
    assert await env.persister.step() is Outcome.GAVE_UP  # Parked for a later round.
    env.persister.close()
    await env.persister.run(drain=True)  # Tried once more, not parked again: it returns.
    assert env.persister.stats.outcomes[Outcome.GAVE_UP] == 2
    assert env.persister.pending == 0
