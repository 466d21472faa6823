"""What the Sequencer's example tests share: one journal, named producers, an envelope generator,
and queueing/draining helpers (test_sequencer_cases, _checkpoint, _outcomes)."""

from __future__ import annotations

from gazette_consumer.sequencer import (
    FLAG_ACK_TXN,
    FLAG_CONTINUE_TXN,
    FLAG_OUTSIDE_TXN,
    JournalProducer,
    QueueOutcome,
    ReplayRequired,
    SeqEnvelope,
    Sequencer,
)

OUT, CONT, ACK = FLAG_OUTSIDE_TXN, FLAG_CONTINUE_TXN, FLAG_ACK_TXN
J = "test/journal"
A = bytes.fromhex("01aaaaaaaaaa")
B = bytes.fromhex("01bbbbbbbbbb")
C = bytes.fromhex("01cccccccccc")
ZERO = bytes(6)
Q = QueueOutcome


def jp(producer: bytes) -> JournalProducer:
    return JournalProducer(J, producer)


class Gen:
    """Envelopes at increasing offsets, leaving 2 bytes of dead space between them: the
    Sequencer must not assume a journal's messages are contiguous. Each envelope's message is
    its index, or with ``named`` "<producer hex>@<clock>"."""

    def __init__(self, *, named: bool = False) -> None:
        self.offset = 0
        self.named = named
        self.all: list[SeqEnvelope] = []

    def __call__(self, producer: bytes, clock: int, flags: int) -> SeqEnvelope:
        message = f"{producer.hex()}@{clock}" if self.named else len(self.all)
        env = SeqEnvelope(J, self.offset, self.offset + 100, producer, clock, flags, message)
        self.offset += 102
        self.all.append(env)
        return env

    def replay(self, seq: Sequencer) -> ReplayRequired:
        """Service the Sequencer's replay request from everything generated so far."""
        r = seq.replay_required
        assert r is not None
        seq.replay(e for e in self.all if r.begin <= e.begin and e.end <= r.end)
        return r


def queue(seq: Sequencer, *envs: SeqEnvelope) -> list[QueueOutcome]:
    return [seq.queue_uncommitted(env) for env in envs]


def drain(seq: Sequencer) -> list[SeqEnvelope]:
    """Every envelope the Sequencer dequeues now, in order."""
    out = []
    while seq.step():
        assert seq.dequeued is not None
        out.append(seq.dequeued)
    assert seq.dequeued is None
    return out
