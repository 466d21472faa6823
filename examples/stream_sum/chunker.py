"""The chunker: publishes many interleaved streams of chunks, and verifies every final sum.

Workers share one AppendService. Each keeps a few streams open, each stream in one chunk
journal, and publishes their chunks in random interleaving, at `chunks_per_s` in all:

- *committed* workers publish each chunk committed (`publish_committed`): readers take it as
  soon as they read it;
- *transactional* workers publish chunks uncommitted, a few at a time, then end the
  transaction: mostly by acknowledging it (`write_ack_intents`); sometimes by rolling it back
  (re-sending the previous ACKs, which tells readers to drop what came since, as a recovering
  consumer does); sometimes by abandoning it (the worker carries on under a new producer ID,
  and the old one's messages are never acknowledged). Chunks of a transaction that did not
  commit are published again, with new data, in a later one.
- any chunk may be appended a second time, same bytes and UUID, as a retried append is.

A chunk counts once it committed: its append succeeded (committed workers), or the ACK of its
transaction did. Once a stream's final chunk counts, the chunker hands its own sum to the
`SumVerifier`, which checks the summer's. An append that fails (the AppendService gave up) is a
`Finding` (``append failed``) naming the journal and the streams it carried; those streams are
no longer verified (whether their chunks landed is unknown).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from broker.client.append_service import AppendService
from broker.client.async_append import AsyncAppend
from examples.stream_sum.messages import Chunk, StreamState, fold
from examples.stream_sum.verifier import Finding, SumVerifier
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES, JSONFraming, Partition, Publisher

__all__ = ["Chunker", "ChunkerConfig"]

_JSON = JSONFraming()


@dataclass(frozen=True)
class ChunkerConfig:
    """What the chunker publishes, and how."""

    journals: Sequence[str]  # Chunk journals; each stream lives in one.
    committed_workers: int = 2
    txn_workers: int = 2
    streams_per_worker: int = 3  # Streams a worker keeps open at once.
    chunks_min: int = 3  # Data chunks of a stream (then the final, empty one).
    chunks_max: int = 12
    chunk_bytes: int = 16
    chunks_per_s: float = 50.0  # All workers together.
    txn_chunks_max: int = 8  # Chunks of one transaction, at most.
    p_duplicate: float = 0.05  # Of each chunk: appended twice.
    p_rollback: float = 0.1  # Of each transaction's end.
    p_abandon: float = 0.05
    # A stream's ID starts with this, so that several chunkers can share journals.
    prefix: str = "s"

    def __post_init__(self) -> None:
        if not self.journals:
            raise ValueError("journals: must name at least one chunk journal")
        if not 1 <= self.chunks_min <= self.chunks_max:
            raise ValueError(f"chunks_min/max: need 1 <= {self.chunks_min} <= {self.chunks_max}")
        if self.committed_workers + self.txn_workers < 1:
            raise ValueError("need at least one worker")
        if not self.chunks_per_s > 0:
            raise ValueError(f"chunks_per_s: must be > 0 (got {self.chunks_per_s})")


@dataclass
class _Stream:
    id: str
    journal: str
    length: int  # Data chunks; the final chunk is length + 1.
    acked: StreamState = field(default_factory=StreamState)  # As of the last ACK built.
    pending: StreamState = field(default_factory=StreamState)  # Published so far.
    broken: bool = False


@dataclass
class Stats:
    chunks: int = 0
    duplicates: int = 0
    commits: int = 0
    rollbacks: int = 0
    abandons: int = 0
    streams_ended: int = 0  # Final chunks committed.


class Chunker:
    """See the module docstring. `run()` publishes until `stop()`; `findings` and the
    verifier's findings together are everything that went wrong."""

    def __init__(
        self,
        appends: AppendService,
        config: ChunkerConfig,
        verifier: SumVerifier,
        *,
        rng: random.Random,
    ) -> None:
        self.config = config
        self.verifier = verifier
        self.rng = rng
        self.stats = Stats()
        self.findings: list[Finding] = []
        self._appends = appends
        self._stop = asyncio.Event()
        self._next_stream = 0
        self._workers = [_Worker(self, i, False) for i in range(config.committed_workers)]
        self._workers += [
            _Worker(self, config.committed_workers + i, True) for i in range(config.txn_workers)
        ]
        self._mappings: dict[str, Callable[[Any], Partition]] = {}

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Publish at the configured rate until `stop()`; then end every transaction (an
        ACK) so that everything published so far commits, and flush the appends."""
        interval_s = 1.0 / self.config.chunks_per_s
        next_at = time.monotonic()
        while not self._stop.is_set():
            await self.rng.choice(self._workers).step()
            next_at += interval_s
            delay_s = next_at - time.monotonic()
            if delay_s > 0:
                # Pacing, not synchronisation: woken early by stop().
                try:
                    await asyncio.wait_for(self._stop.wait(), delay_s)
                except TimeoutError:
                    pass
            elif delay_s < -1.0:
                next_at = time.monotonic()  # Stalled (backpressure): no burst to catch up.
        for worker in self._workers:
            await worker.finish()
        await self._appends.flush()

    # --- For the workers ------------------------------------------------------------------------

    def new_stream(self) -> _Stream:
        self._next_stream += 1
        return _Stream(
            id=f"{self.config.prefix}{self._next_stream:08d}",
            journal=self.rng.choice(list(self.config.journals)),
            length=self.rng.randint(self.config.chunks_min, self.config.chunks_max),
        )

    def next_chunk(self, stream: _Stream) -> tuple[Chunk, StreamState]:
        seq = stream.pending.seq + 1
        data = self.rng.randbytes(self.config.chunk_bytes).hex() if seq <= stream.length else ""
        chunk = Chunk(stream=stream.id, seq=seq, data=data)
        return chunk, fold(stream.pending, chunk)

    def mapping(self, journal: str) -> Callable[[Any], Partition]:
        mapping = self._mappings.get(journal)
        if mapping is None:
            partition = Partition(journal, CONTENT_TYPE_JSON_LINES)
            mapping = self._mappings[journal] = lambda _message: partition
        return mapping

    def publisher(self) -> Publisher[AsyncAppend]:
        return Publisher(self._appends)

    async def maybe_duplicate(self, stream: _Stream, chunk: Chunk) -> None:
        """Append `chunk` again (same bytes, same UUID) with probability p_duplicate."""
        if self.rng.random() >= self.config.p_duplicate:
            return
        appended = await self._appends.start_append(stream.journal)
        appended.write(_JSON.marshal(chunk))
        appended.release()
        self.stats.duplicates += 1
        self.track(appended, [stream])

    def track(
        self,
        appended: AsyncAppend,
        streams: Sequence[_Stream],
        on_success: Callable[[], None] | None = None,
    ) -> None:
        """When `appended` resolves: a failure is a finding and breaks `streams`; a success
        runs `on_success`."""

        def done(_future: object) -> None:
            error = None if appended.future.cancelled() else appended.exception()
            if appended.future.cancelled() or error is not None:
                names = sorted({s.id for s in streams})
                self.findings.append(
                    Finding(
                        "append failed",
                        f"journal {appended.journal}: {error or 'cancelled'!s}"
                        f" (streams {', '.join(names)} are no longer verified)",
                    )
                )
                for s in streams:
                    s.broken = True
                    self.verifier.forget(s.id)
            elif on_success is not None:
                on_success()

        appended.future.add_done_callback(done)

    def ended(self, stream: _Stream, state: StreamState) -> None:
        """`stream`'s final chunk committed, ending it in `state`."""
        if stream.broken:
            return
        self.stats.streams_ended += 1
        self.verifier.expect(stream.id, stream.journal, state.seq, state.value)


class _Worker:
    """One producer of streams: committed or transactional (see the module docstring)."""

    def __init__(self, chunker: Chunker, index: int, transactional: bool) -> None:
        self.c = chunker
        self.index = index
        self.transactional = transactional
        self.publisher = chunker.publisher()
        self.streams: list[_Stream] = []
        # The open transaction (transactional workers only).
        self.txn: dict[str, _Stream] = {}
        self.txn_chunks = 0
        self.txn_size = 0
        self.open_journals: set[str] = set()
        self.last_acks: dict[str, bytes] = {}

    def _pick(self) -> _Stream:
        if len(self.streams) < self.c.config.streams_per_worker:
            self.streams.append(self.c.new_stream())
        return self.c.rng.choice(self.streams)

    async def step(self) -> None:
        if not self.transactional:
            await self._publish_committed()
        elif self.txn_chunks and self.txn_chunks >= self.txn_size:
            await self._end_txn()
        else:
            await self._publish_uncommitted()

    async def finish(self) -> None:
        if self.transactional and self.txn:
            await self._acknowledge()

    async def _publish_committed(self) -> None:
        stream = self._pick()
        chunk, state = self.c.next_chunk(stream)
        appended = await self.publisher.publish_committed(self.c.mapping(stream.journal), chunk)
        stream.pending = stream.acked = state
        self.c.stats.chunks += 1
        ends = (lambda: self.c.ended(stream, state)) if state.done else None
        self.c.track(appended, [stream], ends)
        if state.done:
            self.streams.remove(stream)
        await self.c.maybe_duplicate(stream, chunk)

    async def _publish_uncommitted(self) -> None:
        if not self.txn:
            self.txn_size = self.c.rng.randint(1, self.c.config.txn_chunks_max)
        # A stream whose final chunk is in the open transaction gets nothing more until then.
        open_streams = [s for s in self.streams if not s.pending.done]
        if len(self.streams) < self.c.config.streams_per_worker or not open_streams:
            stream = self.c.new_stream()
            self.streams.append(stream)
        else:
            stream = self.c.rng.choice(open_streams)
        chunk, state = self.c.next_chunk(stream)
        mapping = self.c.mapping(stream.journal)
        appended = await self.publisher.publish_uncommitted(mapping, chunk)
        stream.pending = state
        self.txn[stream.id] = stream
        self.open_journals.add(stream.journal)
        self.txn_chunks += 1
        self.c.stats.chunks += 1
        self.c.track(appended, [stream])
        await self.c.maybe_duplicate(stream, chunk)

    async def _end_txn(self) -> None:
        rng, config = self.c.rng, self.c.config
        draw = rng.random()
        if draw < config.p_rollback and self.open_journals <= self.last_acks.keys():
            await self._roll_back()
        elif draw < config.p_rollback + config.p_abandon:
            self._abandon()
        else:
            await self._acknowledge()

    def _reset_txn(self) -> None:
        self.txn = {}
        self.txn_chunks = 0
        self.open_journals = set()

    async def _acknowledge(self) -> None:
        intents = self.publisher.build_ack_intents()
        self.last_acks.update(intents)
        by_journal: dict[str, list[tuple[_Stream, StreamState]]] = {}
        for stream in self.txn.values():
            stream.acked = stream.pending
            by_journal.setdefault(stream.journal, []).append((stream, stream.pending))
            if stream.pending.done:
                self.streams.remove(stream)
        self._reset_txn()
        self.c.stats.commits += 1
        for ack in await self.publisher.write_ack_intents(intents):
            committed = by_journal.get(ack.journal, [])
            self.c.track(ack, [s for s, _ in committed], _ends(self.c, committed))

    async def _roll_back(self) -> None:
        """Re-send the previous ACK of each journal of the open transaction: readers drop
        the transaction's chunks, which are published again later."""
        self.publisher.build_ack_intents()  # Forget the open transaction's intents.
        resend = {j: self.last_acks[j] for j in sorted(self.open_journals)}
        streams = list(self.txn.values())
        for stream in streams:
            stream.pending = stream.acked
        self._reset_txn()
        self.c.stats.rollbacks += 1
        for ack in await self.publisher.write_ack_intents(resend):
            self.c.track(ack, [s for s in streams if s.journal == ack.journal])

    def _abandon(self) -> None:
        """Never acknowledge the open transaction: carry on under a new producer."""
        for stream in self.txn.values():
            stream.pending = stream.acked
        self._reset_txn()
        self.publisher = self.c.publisher()
        self.last_acks = {}
        self.c.stats.abandons += 1


def _ends(chunker: Chunker, committed: list[tuple[_Stream, StreamState]]) -> Callable[[], None]:
    def on_success() -> None:
        for stream, state in committed:
            if state.done:
                chunker.ended(stream, state)

    return on_success
