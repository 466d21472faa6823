"""The transaction loop's fast path: runs of ready messages consumed without stepping.

`TxnDriver` consumes the messages ready behind a first one as a run (`TxnLoop.on_message_run`).
These tests hold it to what stepping per message decides: a transaction stops reading at its
maximum duration even when messages are always ready, never closes inside an upstream ACK's
sequence, counts what it consumed, and a failure inside a run is attributed to the source or
the application as it is outside one. The clock is the test's: each consumed message advances
it by TICK_S, so a transaction's size follows from its durations alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.client.append_service import AsyncAppend
from broker.protocol import consumer_pb2 as cpb
from gazette_consumer.application import MessageSource, Shard
from gazette_consumer.checkpoint import Checkpoint
from gazette_consumer.message.message import Envelope
from gazette_consumer.message.publisher import Publisher
from gazette_consumer.sequencer.types import SequencerCheckpoint
from gazette_consumer.shard_runner import ShardRunner
from gazette_consumer.stores.base import OpFuture, Store
from gazette_consumer.txn_driver import CONSUME_RUN_MAX
from tests.gazette_consumer.shard_testkit import (
    CountingApp,
    Event,
    Notifier,
    broker_env,
    read_counts,
    shard_spec,
    sqlite_engine,
)

VIRTUAL = "virtual/runs"
TICK_S = 0.125  # Exact in binary: sizes below do not depend on rounding.
MAX_TXN_S = 1.0  # So a transaction reads MAX_TXN_S / TICK_S = 8 messages at most...
PER_TXN = 8
SEQUENCE = 5  # ...or, in sequences of 5, up to the end of the sequence it is in: 10.


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ReadySource:
    """Every message is ready at once (a fast reader far ahead). With `sequence` > 1, messages
    come in sequences of that many, as the messages of one upstream ACK do: `in_sequence` holds
    until a sequence's last. `fail_at`: try_next raises instead of returning that message."""

    def __init__(self, count: int, sequence: int = 1, fail_at: int | None = None) -> None:
        self.count, self._sequence, self._fail_at = count, sequence, fail_at
        self._offset = 0
        self._never = asyncio.Event()

    async def next(self) -> Envelope[Any]:
        envelope = self.try_next()
        while envelope is None:
            await self._never.wait()
        return envelope

    def try_next(self) -> Envelope[Any] | None:
        begin = self._offset
        if begin >= self.count:
            return None
        if begin == self._fail_at:
            raise OSError(f"source broke at {begin}")
        self._offset += 1
        return Envelope.of(VIRTUAL, begin, begin + 1, Event(key="k", text=f"m-{begin}"))

    def checkpoint(self, horizon: int = 0) -> SequencerCheckpoint:
        assert not self.in_sequence, "checkpoint taken inside a sequence"
        return SequencerCheckpoint(read_through={VIRTUAL: self._offset})

    def has_pending(self, since: Mapping[str, int]) -> bool:
        return False

    @property
    def in_sequence(self) -> bool:
        return self._offset % self._sequence != 0 and self._offset < self.count

    async def close(self) -> None:
        return None


@dataclass
class RunApp(CountingApp):
    """Counts, records each transaction's messages, and advances the clock per message."""

    source: ReadySource = field(default_factory=lambda: ReadySource(0))
    clock: ManualClock = field(default_factory=ManualClock)
    txns: list[list[str]] = field(default_factory=list)
    poison_at: int | None = None
    status: cpb.ReplicaStatus | None = None  # Once the run ended.
    counts: dict[str, int] = field(default_factory=dict)  # Committed, once the run ended.

    def new_message_source(
        self, shard: Shard, store: Store, checkpoint: Checkpoint
    ) -> MessageSource | None:
        return self.source

    async def begin_txn(self, shard: Shard, store: Store) -> None:
        await super().begin_txn(shard, store)
        self.txns.append([])

    async def consume_message(
        self, shard: Shard, store: Store, envelope: Envelope[Any], publisher: Publisher[AsyncAppend]
    ) -> None:
        self.clock.now += TICK_S
        if envelope.begin == self.poison_at:
            envelope.message.text = "poison"
        await super().consume_message(shard, store, envelope, publisher)
        self.txns[-1].append(envelope.message.text)


async def _run(tmp_path: Path, app_source: ReadySource, **app_options: Any) -> RunApp:
    """Run a shard over `app_source` until it completed through its end (or failed)."""
    async with broker_env() as env, sqlite_engine(tmp_path) as engine:
        app = RunApp(engine, source=app_source, **app_options)
        changed = Notifier()
        spec = shard_spec("shard-runs", [], max_txn_s=MAX_TXN_S)
        async with ShardRunner(app, env.client, root="/test/runs", clock=app.clock) as runner:
            handle = runner.start(spec, on_change=changed.notify)

            def finished() -> bool:
                if handle.status().code == cpb.ReplicaStatus.FAILED:
                    return True
                return handle.progress().read_through.get(VIRTUAL, 0) == app_source.count

            await changed.until(finished)
        app.status = handle.status()
        app.counts = await read_counts(engine, "shard-runs")
        return app


async def test_ready_messages_never_keep_a_transaction_past_its_maximum(tmp_path: Path) -> None:
    app = await _run(tmp_path, ReadySource(5 * PER_TXN))
    assert [len(txn) for txn in app.txns] == [PER_TXN] * 5
    assert [text for txn in app.txns for text in txn] == [f"m-{i}" for i in range(5 * PER_TXN)]
    assert app.counts == {"k": 5 * PER_TXN}
    assert app.begins == len(app.finishes) == 5


async def test_a_run_goes_on_to_the_end_of_a_sequence_past_the_maximum(tmp_path: Path) -> None:
    # The maximum passes after 8 messages, inside the second sequence of 5: the transaction
    # reads on to that sequence's end, and closes there.
    app = await _run(tmp_path, ReadySource(6 * SEQUENCE, sequence=SEQUENCE))
    assert [len(txn) for txn in app.txns] == [2 * SEQUENCE] * 3
    assert app.counts == {"k": 6 * SEQUENCE}


async def test_runs_are_bounded_but_a_transaction_is_not(tmp_path: Path) -> None:
    # A clock that does not move: the transaction closes only once nothing is ready, after
    # several runs of at most CONSUME_RUN_MAX + 1 messages; it counts all of them.
    count = 3 * CONSUME_RUN_MAX
    app = await _run(tmp_path, ReadySource(count))
    assert sum(len(txn) for txn in app.txns) == count
    assert app.counts == {"k": count}


async def test_a_source_failing_inside_a_run_fails_the_shard_as_a_read(tmp_path: Path) -> None:
    app = await _run(tmp_path, ReadySource(40, fail_at=5))
    status = app.status
    assert status is not None and status.code == cpb.ReplicaStatus.FAILED
    assert "reading messages: OSError: source broke at 5" in status.errors[0]
    assert app.counts == {}
    assert _failed(app.finishes)


async def test_an_application_failing_inside_a_run_names_its_message(tmp_path: Path) -> None:
    app = await _run(tmp_path, ReadySource(40), poison_at=3)
    status = app.status
    assert status is not None and status.code == cpb.ReplicaStatus.FAILED
    assert f"app.consume_message ({VIRTUAL} offset 3): PoisonError" in status.errors[0]
    assert app.counts == {}
    assert _failed(app.finishes)


def _failed(finishes: list[OpFuture]) -> bool:
    """The begun transaction was reported as failed, and none committed."""
    return len(finishes) == 1 and finishes[0].done() and finishes[0].exception() is not None


class SequenceTakingSource(ReadySource):
    """A ReadySource that also hands out the messages a sequence certainly goes on after at
    once (`take_sequence`, as ReadCommittedIter does), counting those it handed out."""

    def __init__(self, count: int, sequence: int = 1, fail_at: int | None = None) -> None:
        super().__init__(count, sequence, fail_at)
        self.taken = 0

    def take_sequence(self, limit: int) -> list[Envelope[Any]]:
        if not self.in_sequence:
            return []
        sequence_end = min((self._offset // self._sequence + 1) * self._sequence, self.count)
        # The sequence's last is left to try_next, which ends the sequence.
        count = min(limit, sequence_end - 1 - self._offset)
        taken = []
        for _ in range(max(count, 0)):
            envelope = self.try_next()
            assert envelope is not None and self.in_sequence
            taken.append(envelope)
        self.taken += len(taken)
        return taken


async def test_a_sequence_taken_at_once_closes_transactions_where_one_by_one_would(
    tmp_path: Path,
) -> None:
    # Sequences of 5, and sequences longer than a run (the timer comes due inside them): the
    # transactions are those of the message-by-message path, but most messages came in batches.
    for sequence, count in ((SEQUENCE, 6 * SEQUENCE), (CONSUME_RUN_MAX + 7, 3 * CONSUME_RUN_MAX)):
        (tmp_path / f"a{sequence}").mkdir()
        (tmp_path / f"b{sequence}").mkdir()
        one_by_one = await _run(tmp_path / f"a{sequence}", ReadySource(count, sequence=sequence))
        source = SequenceTakingSource(count, sequence=sequence)
        taking = await _run(tmp_path / f"b{sequence}", source)
        assert taking.txns == one_by_one.txns
        assert [text for txn in taking.txns for text in txn] == [f"m-{i}" for i in range(count)]
        assert taking.counts == {"k": count}
        assert source.taken >= count // 2  # The batches were used.
    # A sequence longer than a run: the transaction reads on to its end, past its maximum.
    assert [len(txn) for txn in taking.txns] == [CONSUME_RUN_MAX + 7] * 2 + [
        count - 2 * (CONSUME_RUN_MAX + 7)
    ]


async def test_an_application_failing_inside_a_taken_sequence_names_its_message(
    tmp_path: Path,
) -> None:
    source = SequenceTakingSource(40, sequence=20)
    app = await _run(tmp_path, source, poison_at=7)
    status = app.status
    assert status is not None and status.code == cpb.ReplicaStatus.FAILED
    assert f"app.consume_message ({VIRTUAL} offset 7): PoisonError" in status.errors[0]
    assert source.taken > 0
    assert app.counts == {}
    assert _failed(app.finishes)


class RebindingSource(ReadySource):
    """A ReadySource whose `try_next` is rebound every REBIND_EVERY messages, as
    ReadCommittedIter rebinds its own to a C iterator over each run of messages that commit
    alone: a call through an older binding counts as stale (and still works)."""

    REBIND_EVERY = 3

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.binding = 0
        self.stale_calls = 0
        self.try_next = self._bound(0)  # type: ignore[method-assign]

    def _bound(self, binding: int) -> Callable[[], Envelope[Any] | None]:
        def try_next() -> Envelope[Any] | None:
            if binding != self.binding:
                self.stale_calls += 1
            envelope = ReadySource.try_next(self)
            if envelope is not None and envelope.begin % self.REBIND_EVERY == 0:
                self.binding += 1
                self.try_next = self._bound(self.binding)  # type: ignore[method-assign]
            return envelope

        return try_next


async def test_the_loop_calls_the_sources_try_next_as_bound_now(tmp_path: Path) -> None:
    # Runs of up to CONSUME_RUN_MAX + 1 messages, the binding changing every 3: a loop that
    # kept the binding it found at a run's start would call stale ones for most messages.
    count = 2 * CONSUME_RUN_MAX
    source = RebindingSource(count)
    app = await _run(tmp_path, source)
    assert [text for txn in app.txns for text in txn] == [f"m-{i}" for i in range(count)]
    assert app.counts == {"k": count}
    assert source.binding >= count // RebindingSource.REBIND_EVERY
    assert source.stale_calls == 0
