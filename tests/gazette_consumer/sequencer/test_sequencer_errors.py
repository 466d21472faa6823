"""Bad input and out-of-order calls raise typed errors and change nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gazette_consumer.sequencer import (
    FLAG_ACK_TXN,
    FLAG_CONTINUE_TXN,
    RING_SIZE_MAX,
    InvalidCheckpointError,
    InvalidEnvelopeError,
    JournalProducer,
    OffsetRegressionError,
    ProducerState,
    QueueOutcome,
    ReplayMismatchError,
    SeqEnvelope,
    Sequencer,
    SequencerCheckpoint,
    SequencerError,
    SequencerStateError,
)

CONT, ACK = FLAG_CONTINUE_TXN, FLAG_ACK_TXN
J = "test/journal"
A = bytes.fromhex("01aaaaaaaaaa")
B = bytes.fromhex("01bbbbbbbbbb")


def env(producer: bytes, clock: int, flags: int, begin: int, journal: str = J) -> SeqEnvelope:
    return SeqEnvelope(journal, begin, begin + 10, producer, clock, flags)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("journal", ""),
        ("journal", b"test/journal"),
        ("begin", -1),
        ("begin", True),
        ("end", 5),  # Not after begin.
        ("end", 1 << 63),
        ("producer", b"short"),
        ("producer", "01aaaaaaaaaa"),
        ("clock", -1),
        ("clock", 1 << 64),
        ("flags", 0x400),
    ],
)
def test_invalid_envelope(field: str, value: Any) -> None:
    fields: dict[str, Any] = dict(journal=J, begin=5, end=15, producer=A, clock=1, flags=CONT)
    fields[field] = value
    with pytest.raises(InvalidEnvelopeError, match=f"envelope.{field}"):
        SeqEnvelope(**fields)


@pytest.mark.parametrize("ring_size", [0, -1, RING_SIZE_MAX + 1, 1.5, True])
def test_invalid_ring_size(ring_size: Any) -> None:
    with pytest.raises(ValueError, match="ring_size"):
        Sequencer(ring_size)


def test_ring_size_bounds_are_inclusive() -> None:
    Sequencer(1)
    Sequencer(RING_SIZE_MAX)


@pytest.mark.parametrize(
    "build",
    [
        lambda: ProducerState(last_ack=-1),
        lambda: ProducerState(last_ack=1, begin=-2),
        lambda: JournalProducer("", A),
        lambda: JournalProducer(J, b"xx"),
        lambda: SequencerCheckpoint(read_through={J: -1}),
        lambda: SequencerCheckpoint(read_through={"": 0}),
        lambda: SequencerCheckpoint(producers={(J, A): ProducerState(1)}),  # type: ignore[dict-item]
        lambda: SequencerCheckpoint(producers={JournalProducer(J, A): 1}),  # type: ignore[dict-item]
    ],
)
def test_invalid_checkpoint(build: Any) -> None:
    with pytest.raises(InvalidCheckpointError):
        build()


@pytest.mark.parametrize("horizon", [-1, 1 << 64, "1"])
def test_invalid_horizon(horizon: Any) -> None:
    seq = Sequencer(2)
    seq.queue_uncommitted(env(A, 5, CONT, 0))
    with pytest.raises(ValueError, match="horizon"):
        seq.checkpoint(horizon)
    assert seq.checkpoint().producers == {JournalProducer(J, A): ProducerState(4, 0)}


def test_offset_regression_changes_nothing() -> None:
    seq = Sequencer(2)
    seq.queue_uncommitted(env(A, 1, CONT, 100))
    before = seq.checkpoint()

    with pytest.raises(OffsetRegressionError, match="read through 110"):
        seq.queue_uncommitted(env(B, 1, CONT, 105))
    assert seq.checkpoint() == before
    # Had the refused envelope taken the ring's second slot, the ACK would evict a1 and need a
    # replay.
    assert seq.queue_uncommitted(env(A, 2, ACK, 110)) is QueueOutcome.ACK_COMMIT_RING


def test_queue_while_dequeuing_changes_nothing() -> None:
    seq = Sequencer(2)
    a1, a2_ack, b1 = env(A, 1, CONT, 0), env(A, 2, ACK, 10), env(B, 1, CONT, 20)
    seq.queue_uncommitted(a1)
    seq.queue_uncommitted(a2_ack)

    with pytest.raises(SequencerStateError, match="remain to dequeue"):
        seq.queue_uncommitted(b1)
    assert seq.step() and seq.dequeued == a1
    assert seq.step() and seq.dequeued == a2_ack
    with pytest.raises(SequencerStateError):
        seq.queue_uncommitted(b1)  # Until step() has returned False.
    assert not seq.step()
    assert seq.queue_uncommitted(b1) is QueueOutcome.CONTINUE_BEGIN_SPAN


def test_step_before_replay_and_replay_when_not_required() -> None:
    seq = Sequencer(1)
    a1, b1, a2_ack = env(A, 1, CONT, 0), env(B, 1, CONT, 10), env(A, 2, ACK, 20)
    with pytest.raises(SequencerStateError, match="no replay"):
        seq.replay([])
    for e in (a1, b1, a2_ack):
        seq.queue_uncommitted(e)

    with pytest.raises(SequencerStateError, match=r"replay\(\) test/journal \[0, 20\)"):
        seq.step()
    seq.replay([a1, b1])
    with pytest.raises(SequencerStateError, match="no replay"):
        seq.replay([a1, b1])
    assert seq.step() and seq.dequeued == a1
    assert seq.step() and seq.dequeued == a2_ack
    assert not seq.step()


@pytest.mark.parametrize(
    ("replayed", "match"),
    [
        (env(A, 1, CONT, 0, journal="other/journal"), "expected test/journal"),
        (SeqEnvelope(J, 0, 25, A, 1, CONT), r"outside the required range \[0, 20\)"),
    ],
)
def test_replay_mismatch(replayed: SeqEnvelope, match: str) -> None:
    seq = Sequencer(1)
    for e in (env(A, 1, CONT, 0), env(B, 1, CONT, 10), env(A, 2, ACK, 20)):
        seq.queue_uncommitted(e)
    seq.replay([replayed])
    with pytest.raises(ReplayMismatchError, match=match):
        seq.step()


def test_replay_before_range_begin() -> None:
    seq = Sequencer(1)
    for e in (env(B, 1, CONT, 0), env(A, 1, CONT, 10), env(A, 2, ACK, 20)):
        seq.queue_uncommitted(e)
    seq.replay([env(B, 1, CONT, 0)])
    with pytest.raises(ReplayMismatchError, match=r"\[0, 10\): outside"):
        seq.step()


def test_errors_share_a_base() -> None:
    for error in (
        InvalidEnvelopeError,
        InvalidCheckpointError,
        OffsetRegressionError,
        ReplayMismatchError,
        SequencerStateError,
    ):
        assert issubclass(error, SequencerError)


def test_replay_reader_errors_pass_through() -> None:
    class ReaderFailed(Exception):
        pass

    a1 = env(A, 1, CONT, 10)

    def failing_reader() -> Iterator[SeqEnvelope]:
        yield a1
        raise ReaderFailed("journal read failed")

    seq = Sequencer(1)
    for e in (env(B, 1, CONT, 0), a1, env(A, 2, CONT, 20), env(A, 3, ACK, 30)):
        seq.queue_uncommitted(e)
    seq.replay(failing_reader())
    assert seq.step() and seq.dequeued == a1
    with pytest.raises(ReaderFailed):
        seq.step()
