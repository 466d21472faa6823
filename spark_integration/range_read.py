"""Reading a bounded offset range [begin, end) of one journal, uncommitted or committed.

A Spark partition is such a range: it must read the same messages whenever it is (re-)run, so
it reads exactly to `end` and never blocks at the head.

Read-uncommitted, every message framed in the range is returned, ACKs, duplicates and
transactions that never commit included. Content that does not frame as JSON lines (a message
cut by a bad offset, a line over the size limit) fails the read with `GazetteJournalError`
naming its offsets: a Spark read never skips content silently.

Read-committed, the range goes through a `Sequencer` started from a `SequencerCheckpoint` of
the journal at `begin` (producers' last ACK clocks and the begin offsets of their pending
transactions; empty for a batch read). It returns each committed message once, in per-producer
order, and never an ACK, a duplicate or a rolled-back message. An ACK in the range may commit a
transaction that began before `begin` (or before what the Sequencer's ring still holds): the
Sequencer then asks for that span to be replayed, and it is re-read from the journal, bounded,
by `Replay`. `scan_committed` is the same walk that keeps no messages, to compute the checkpoint
at `end` (streaming plans with it); there a replay is not read: only the state after the ACK
matters, and the ACK alone determines it (the producer's state is reset to the ACK's clock).

`origin` is where the reader started reading the journal (a batch read's `begin`, a streaming
query's starting offset): a transaction that began before it is skipped whole when its ACK
commits it, never delivered in part (range_start.py says how the reader knows).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from broker.client.retry_reader import RetryReader
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message.message import Envelope
from gazette_consumer.sequencer.replay import Replay, replay_request
from gazette_consumer.sequencer.sequencer import Sequencer
from gazette_consumer.sequencer.types import (
    FLAG_ACK_TXN,
    JournalProducer,
    SequencerCheckpoint,
)
from spark_integration.journal_io import GazetteJournalError
from spark_integration.raw_json import new_decoder

# Envelopes are handed on a Read chunk's worth (at most 128 KiB of content) at a time.
Envelopes = list[Envelope[Any]]


async def read_uncommitted(
    client: JournalClient, journal: str, begin: int, end: int, *, strict: bool = True
) -> AsyncIterator[Envelopes]:
    """The envelopes of [begin, end) in journal order, a chunk's worth at a time. `strict`:
    content that does not frame fails the read (else it is skipped, and logged)."""
    if end <= begin:
        return
    decoder = new_decoder(journal, begin)
    request = pb.ReadRequest(journal=journal, offset=begin, end_offset=end, block=True)
    reader = RetryReader(client, request)
    try:
        while True:
            chunk = await reader.read_chunk()
            envelopes = (
                decoder.feed(chunk.content, chunk.offset) if chunk.content else decoder.flush()
            )
            if strict and decoder.skipped_bytes:
                raise GazetteJournalError(
                    f"journal {journal!r}: content in [{begin}, {end}) that is not whole JSON"
                    f" lines, before offset {decoder.through} (a message cut short, or longer"
                    " than the limit)"
                )
            if envelopes:
                yield envelopes
            if decoder.error is not None:
                raise decoder.error
            if not chunk.content:
                return
    finally:
        await reader.close()


class CommittedRange:
    """Read-committed walk of [begin, end) of one journal from `checkpoint` (see the module
    docstring). `read()` yields committed envelopes; `checkpoint()` is the state at `end` once
    the walk is done."""

    def __init__(
        self,
        client: JournalClient,
        journal: str,
        begin: int,
        end: int,
        *,
        ring_size: int,
        checkpoint: SequencerCheckpoint | None = None,
        replay: bool = True,
        origin: int = 0,
        strict: bool = True,
    ) -> None:
        if checkpoint is None:
            checkpoint = SequencerCheckpoint(read_through={journal: begin})
        self._client = client
        self._journal = journal
        self._begin = begin
        self._end = end
        self._origin = origin
        self._strict = strict
        self._seq: Sequencer[Envelope[Any]] = Sequencer(ring_size, checkpoint)
        self._replay_wanted = replay
        self.replays = 0

    def checkpoint(self, horizon_clock: int = 0) -> SequencerCheckpoint:
        cp = self._seq.checkpoint(horizon_clock)
        # The whole range was consumed (appends hold whole messages, so `end`, a write head,
        # is a message boundary): reading resumes at `end`.
        read_through = dict(cp.read_through)
        read_through[self._journal] = max(read_through.get(self._journal, 0), self._end)
        return SequencerCheckpoint(read_through=read_through, producers=cp.producers)

    async def read(self) -> AsyncIterator[Envelopes]:
        # The Sequencer's fast entry points, as ReadCommittedIter drives them: a run of one
        # producer's messages that commit alone at once, a transaction's messages linked into
        # the ring without per-message outcomes, and taken from it at once when its ACK
        # commits them (the property tests hold these to the general protocol).
        seq = self._seq
        async for envelopes in read_uncommitted(
            self._client, self._journal, self._begin, self._end, strict=self._strict
        ):
            out: Envelopes = []
            pending = deque(envelopes)
            while pending:
                if run := seq.commit_alone_run(pending):
                    out.extend(pending.popleft() for _ in range(run))
                    continue
                if seq.commit_alone(pending[0]):
                    out.append(pending.popleft())
                    continue
                if taken := seq.commit_span_run(pending):
                    out.extend(pending.popleft() for _ in range(taken - 1))
                    pending.popleft()  # The ACK.
                    continue
                committing = seq.queue_span(pending)
                if committing is None:
                    continue  # Queued, nothing committed yet.
                if seq.replay_required is None:
                    committed = seq.dequeue_all()
                    out.extend(env for env in committed if env.flags != FLAG_ACK_TXN)
                    continue
                if seq.replay_required.begin < self._origin:
                    # Begun before the reader's origin: skipped whole (the module docstring).
                    seq.replay(())
                    await self._dequeue(None, _drop)
                    continue
                await self._dequeue(self._start_replay(committing), out.append)
            if out:
                yield out

    async def _dequeue(self, replay: Replay | None, emit: Callable[[Envelope[Any]], None]) -> None:
        seq = self._seq
        try:
            while True:
                if replay is not None and not replay.holds(1):
                    await replay.fill(1)
                env = seq.dequeue()
                if env is None:
                    return
                if env.flags != FLAG_ACK_TXN:
                    emit(env)
        finally:
            if replay is not None:
                await replay.close()

    def _start_replay(self, ack: Envelope[Any]) -> Replay | None:
        seq = self._seq
        required = seq.replay_required
        assert required is not None  # Checked by the caller.
        if not self._replay_wanted:
            seq.replay(())  # Planning: see the module docstring.
            return None
        last_ack = seq.checkpoint().producers[JournalProducer(ack.journal, ack.producer)].last_ack
        reader = RetryReader(self._client, replay_request(required))
        replay = Replay(
            required,
            ack.producer,
            last_ack,
            ack.clock,
            reader,
            new_decoder(ack.journal, required.begin),
        )
        seq.replay(replay)
        self.replays += 1
        return replay


def _drop(_env: Envelope[Any]) -> None:
    pass


async def scan_committed(
    client: JournalClient,
    journal: str,
    begin: int,
    end: int,
    *,
    ring_size: int,
    checkpoint: SequencerCheckpoint,
    horizon_clock: int,
    strict: bool = True,
) -> SequencerCheckpoint:
    """The Sequencer's checkpoint of `journal` at `end`, walking from `checkpoint` at `begin`."""
    walk = CommittedRange(
        client,
        journal,
        begin,
        end,
        ring_size=ring_size,
        checkpoint=checkpoint,
        replay=False,
        strict=strict,
    )
    async for _ in walk.read():
        pass
    return walk.checkpoint(horizon_clock)
