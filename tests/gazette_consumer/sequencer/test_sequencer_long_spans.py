"""Transactions longer than the Sequencer's ring, through the reader's entry points
(`queue_span`, `commit_span_run`, `dequeue_all`, `dequeue` over a replay) against the general
one: the same deliveries and the same ring, however many times a span wraps the ring; and the
work `queue_span` does per message stays bounded once the ring is full (it once looked at the
rest of the decoded piece again for every message linked into an owned slot)."""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass

import structlog
from hypothesis import event, given, settings
from hypothesis import strategies as st

from gazette_consumer.sequencer import (
    FLAG_ACK_TXN,
    FLAG_CONTINUE_TXN,
    FLAG_OUTSIDE_TXN,
    JournalProducer,
    ProducerState,
    SeqEnvelope,
    Sequencer,
    SequencerCheckpoint,
)
from tests.gazette_consumer.sequencer.test_sequencer_fast_path import (
    PRODUCERS,
    Gen,
    assert_same,
    fast,
    general,
    replayed,
    ring_state,
)

J = "test/journal"
EXAMPLES = int(os.environ.get("GAZETTE_TEST_EXAMPLES", "200"))


@dataclass(frozen=True)
class LongTxn:
    producer: int
    messages: int  # CONTINUE_TXN messages, then (unless left pending) the ACK.
    ack_back: int  # The ACK's clock this far below the last message's: rolls back the rest.
    other_every: int  # Another producer's message after every this many (0: none).
    other_flags: int  # ...CONTINUE_TXN (a span pending across this one) or OUTSIDE_TXN.
    dup_at: int  # A re-sent message at this index (none if past the end).
    acked: bool


LONG_TXNS = st.builds(
    LongTxn,
    st.integers(0, len(PRODUCERS) - 1),
    st.integers(1, 300),
    st.sampled_from([0, 0, 0, 1, 50]),
    st.sampled_from([0, 0, 0, 7, 100]),
    st.sampled_from([FLAG_CONTINUE_TXN, FLAG_OUTSIDE_TXN]),
    st.integers(0, 400),
    st.sampled_from([True] * 5 + [False]),
)


def long_journal(txns: list[LongTxn]) -> dict[str, list[SeqEnvelope]]:
    gen, clocks, envs = Gen(J), [10, 10, 10], []
    for t in txns:
        p, q = t.producer, (t.producer + 1) % len(PRODUCERS)
        for i in range(t.messages):
            if t.other_every and i % t.other_every == t.other_every - 1:
                clocks[q] += 1
                envs.append(gen(PRODUCERS[q], clocks[q], t.other_flags, gap=0))
            if i == t.dup_at and i:
                envs.append(gen(PRODUCERS[p], clocks[p], FLAG_CONTINUE_TXN, gap=0))
            clocks[p] += 1
            envs.append(gen(PRODUCERS[p], clocks[p], FLAG_CONTINUE_TXN, gap=0))
        if t.acked:
            clock = max(1, clocks[p] + 1 - t.ack_back)
            envs.append(gen(PRODUCERS[p], clock, FLAG_ACK_TXN, gap=0))
            clocks[p] = max(clocks[p], clock)
    return {J: envs}


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    txns=st.lists(LONG_TXNS, min_size=1, max_size=6),
    ring_size=st.one_of(st.integers(1, 8), st.integers(1, 128)),
    batch=st.one_of(st.integers(1, 40), st.integers(40, 1000)),
)
def test_transactions_longer_than_the_ring_match_the_general_path(
    txns: list[LongTxn], ring_size: int, batch: int
) -> None:
    """Spans wrapping the ring many times, decoded in pieces of any size, with another
    producer's span pending across them (its start evicted too) or its own messages in
    between, re-sent messages and ACKs rolling part back: the reader's entry points deliver
    exactly what the general path does, each commit's messages in order, and leave the
    Sequencer as it does after every piece."""
    with structlog.testing.capture_logs():
        journals = long_journal(txns)
        envs = journals[J]
        if any(t.messages > ring_size for t in txns):
            event("a span longer than the ring")
        reference: Sequencer[SeqEnvelope] = Sequencer(ring_size)
        tested: Sequencer[SeqEnvelope] = Sequencer(ring_size)
        for i in range(0, len(envs), batch):
            piece = envs[i : i + batch]
            assert fast(tested, journals, piece) == general(reference, journals, piece)
            assert ring_state(tested) == ring_state(reference)
            assert_same(reference, tested)


class CountedEnvelope:
    """An envelope counting the reads of its flags: a measure of the work spent on it."""

    reads = 0

    def __init__(self, journal: str, begin: int, producer: bytes, clock: int, flags: int):
        self.journal, self.begin, self.end = journal, begin, begin + 10
        self.producer, self.clock, self._flags = producer, clock, flags

    @property
    def flags(self) -> int:
        CountedEnvelope.reads += 1
        return self._flags


def test_queue_span_links_a_span_wrapping_the_ring_in_bounded_work_per_message() -> None:
    """A piece of one long transaction, queued into a ring its span has filled: each message is
    looked at a bounded number of times, not once more per message linked before it in the
    piece (which made a transaction longer than the ring cost ~40x more per message)."""
    ring_size, messages, piece = 64, 4096, 512
    producer = PRODUCERS[0]
    envs = [
        CountedEnvelope(J, 10 * i, producer, 100 + i, FLAG_CONTINUE_TXN) for i in range(messages)
    ]
    ack = CountedEnvelope(J, 10 * messages, producer, 100 + messages, FLAG_ACK_TXN)
    seq: Sequencer[CountedEnvelope] = Sequencer(ring_size)
    CountedEnvelope.reads = 0
    for i in range(0, messages, piece):
        pending = deque(envs[i : i + piece])
        while pending:
            assert seq.queue_span(pending) is None
    assert CountedEnvelope.reads <= 4 * messages
    # The span lost its start as its message past the ring's length evicted its first: the
    # ring keeps none of it (nor any message alive), and its ACK replays it whole.
    assert seq._ring.occupied == 0
    assert all(e is None for e in seq._ring.entries)
    pending = deque([ack])
    assert seq.queue_span(pending) is ack
    required = seq.replay_required
    assert required is not None
    assert (required.begin, required.end) == (0, ack.begin)
    seq.replay(e for e in envs if required.begin <= e.begin and e.end <= required.end)
    delivered = []
    while (env := seq.dequeue()) is not None:
        delivered.append(env)
    assert delivered == [*envs, ack]


def test_replayed_and_ring_deliveries_of_a_long_span_are_each_message_once() -> None:
    """The plainest case of the chain of two shards: one producer's transactions of several
    rings' length, each ACK delivering its messages once, in order, from a replay then the
    ring; the ring is left empty."""
    gen, clock, envs, expected = Gen(J), 10, [], []
    for messages in (100, 1, 257, 64):
        txn = []
        for _ in range(messages):
            clock += 1
            txn.append(gen(PRODUCERS[0], clock, FLAG_CONTINUE_TXN, gap=0))
        clock += 1
        envs += [*txn, gen(PRODUCERS[0], clock, FLAG_ACK_TXN, gap=0)]
        expected += [*txn, envs[-1]]
    journals = {J: envs}
    seq: Sequencer[SeqEnvelope] = Sequencer(16)
    out, replays = [], 0
    for i in range(0, len(envs), 50):
        pending = deque(envs[i : i + 50])
        while pending:
            if seq.queue_span(pending) is None:
                continue
            replays += seq.replay_required is not None
            replayed(journals, seq)
            out += seq.dequeue_all()  # From the ring: all at once.
            while (env := seq.dequeue()) is not None:  # From a replay: one by one.
                out.append(env)
    assert out == expected
    # The transactions longer than the ring, and the short one after the first (predicted
    # long, it links nothing: Partial.long_spans), after which the prediction is dropped.
    assert replays == 4
    assert seq._ring.occupied == 0


def test_a_span_after_one_longer_than_the_ring_is_not_linked_until_one_is_shorter() -> None:
    """A producer whose span outgrew the ring has its next spans replayed whole without
    linking any of their messages (linked, a ring's worth of them would live until evicted);
    one that turns out shorter than the ring ends the prediction: the next is linked again
    and committed from the ring. Deliveries are the same either way."""
    gen, clock = Gen(J), 10
    seq: Sequencer[SeqEnvelope] = Sequencer(16)
    envs: list[SeqEnvelope] = []

    def transaction(messages: int) -> tuple[list[SeqEnvelope], bool, int]:
        """Queue one transaction through the general path: its deliveries, whether its ACK
        needed a replay, and how many ring slots its pending span held before the ACK."""
        nonlocal clock
        txn = []
        for _ in range(messages):
            clock += 1
            txn.append(gen(PRODUCERS[0], clock, FLAG_CONTINUE_TXN, gap=0))
        clock += 1
        ack = gen(PRODUCERS[0], clock, FLAG_ACK_TXN, gap=0)
        envs.extend([*txn, ack])
        for env in txn:
            assert not seq.queue_uncommitted(env).commits
        held = seq._ring.occupied
        assert seq.queue_uncommitted(ack).commits
        replay = seq.replay_required is not None
        replayed({J: envs}, seq)
        out = []
        while (env := seq.dequeue()) is not None:
            out.append(env)
        assert out == [*txn, ack]
        return out, replay, held

    assert transaction(5)[1:] == (False, 5)  # Linked, from the ring.
    assert transaction(40)[1] is True  # Outgrew the ring of 16: replayed.
    assert transaction(20)[1:] == (True, 0)  # Predicted long, and it was: nothing linked.
    assert transaction(5)[1:] == (True, 0)  # Predicted long, it was not: the prediction ends.
    assert transaction(5)[1:] == (False, 5)  # Linked again, from the ring.
    assert seq._ring.occupied == 0


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    txns=st.lists(LONG_TXNS, min_size=1, max_size=4),
    ring_size=st.integers(1, 16),
    limits=st.lists(st.integers(1, 80), min_size=1, max_size=8),
)
def test_dequeue_replayed_leaves_the_sequencer_as_dequeue_one_by_one(
    txns: list[LongTxn], ring_size: int, limits: list[int]
) -> None:
    """Mid-emission too: after each run `dequeue_replayed` takes from a replay, the Sequencer
    checkpoints (and has pending) exactly as after as many `dequeue()` calls, and both deliver
    the same rest."""
    with structlog.testing.capture_logs():
        journals = long_journal(txns)
        reference: Sequencer[SeqEnvelope] = Sequencer(ring_size)
        tested: Sequencer[SeqEnvelope] = Sequencer(ring_size)
        turn = 0
        for env in journals[J]:
            for seq in (reference, tested):
                seq.queue_uncommitted(env)
                replayed(journals, seq)
            while True:
                limit = limits[turn % len(limits)]
                turn += 1
                run = tested.dequeue_replayed(limit)
                if not run:
                    break
                event("a replay taken in runs")
                assert [reference.dequeue() for _ in run] == run
                assert tested.dequeued is reference.dequeued is run[-1]
                assert tested.checkpoint() == reference.checkpoint()
                assert tested.has_pending({}) == reference.has_pending({})
            rest = []
            while (out := tested.dequeue()) is not None:
                rest.append(out)
            assert [reference.dequeue() for _ in range(len(rest) + 1)] == [*rest, None]
            assert ring_state(tested) == ring_state(reference)
            assert tested.checkpoint() == reference.checkpoint()


def test_dequeue_replayed_takes_nothing_without_a_replay() -> None:
    gen = Gen(J)
    seq: Sequencer[SeqEnvelope] = Sequencer(8)
    a1, a2_ack = gen(PRODUCERS[0], 1, FLAG_CONTINUE_TXN), gen(PRODUCERS[0], 2, FLAG_ACK_TXN)
    assert seq.dequeue_replayed(5) == []  # No emission.
    seq.queue_uncommitted(a1)
    seq.queue_uncommitted(a2_ack)
    assert seq.dequeue_replayed(5) == []  # Served by the ring.
    assert seq.dequeue_all() == [a1, a2_ack]
    seq = Sequencer(1)
    for env in (a1, a2_ack):
        seq.queue_uncommitted(env)
    assert seq.replay_required is not None
    assert seq.dequeue_replayed(5) == []  # replay() is due first: nothing changes.
    assert seq.replay_required is not None
    seq.replay([a1])
    assert seq.dequeue_replayed(0) == []
    assert seq.dequeue_replayed(5) == [a1]  # The replay ended: the ACK is the ring's.
    assert seq.dequeue() is a2_ack
    assert seq.dequeue() is None


def continuation(envs: list[SeqEnvelope], producer: bytes, after_clock: int) -> int:
    """How many envelopes at the front of `envs` continue `producer`'s span past
    `after_clock`, as a reader's decoder counts them from their UUIDs
    (`EnvelopeBuilder.continuation`): CONTINUE_TXN of `producer`, clocks rising."""
    n, clock = 0, after_clock
    for env in envs:
        if env.flags != FLAG_CONTINUE_TXN or env.producer != producer or env.clock <= clock:
            break
        clock, n = env.clock, n + 1
    return n


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    txns=st.lists(LONG_TXNS, min_size=1, max_size=6),
    ring_size=st.one_of(st.integers(1, 8), st.integers(1, 128)),
    batch=st.one_of(st.integers(1, 40), st.integers(40, 1000)),
)
def test_continuations_counted_from_uuids_match_the_general_path(
    txns: list[LongTxn], ring_size: int, batch: int
) -> None:
    """As a reader decodes a piece that follows one ending inside a span the ring does not
    link: the messages at its front that continue that span are only counted
    (`skip_continuation`, from what `unlinked_span_clock` says), the rest go through the
    reader's entry points. Deliveries, ring and producer states are the general path's after
    every piece (other producers, re-sent messages, rollbacks and spans pending across)."""
    with structlog.testing.capture_logs():
        journals = long_journal(txns)
        envs = journals[J]
        reference: Sequencer[SeqEnvelope] = Sequencer(ring_size)
        tested: Sequencer[SeqEnvelope] = Sequencer(ring_size)
        tail: SeqEnvelope | None = None  # The last envelope of the piece before.
        for i in range(0, len(envs), batch):
            piece = envs[i : i + batch]
            after = None
            if tail is not None and tail.flags == FLAG_CONTINUE_TXN:
                after = tested.unlinked_span_clock(J, tail.producer)
            if after is not None:
                assert tail is not None
                n = continuation(piece, tail.producer, after)
                if n:
                    event("a continuation counted")
                    first, last = piece[0], piece[n - 1]
                    assert tested.skip_continuation(
                        J, tail.producer, n, first.begin, last.clock, last.end
                    )
                rest = piece[n:]
            else:
                rest = piece
            expected = general(reference, journals, piece)
            assert fast(tested, journals, rest) == expected
            assert ring_state(tested) == ring_state(reference)
            assert_same(reference, tested)
            tail = piece[-1]


def test_skip_continuation_declines_and_changes_nothing() -> None:
    gen = Gen(J)
    seq: Sequencer[SeqEnvelope] = Sequencer(2)
    p, q = PRODUCERS[0], PRODUCERS[1]
    for clock in range(10, 14):  # Three more than the ring: the span lost its start.
        seq.queue_trusted(gen(p, clock, FLAG_CONTINUE_TXN))
    assert seq.unlinked_span_clock(J, p) == 13
    assert seq.unlinked_span_clock(J, q) is None  # No such producer.
    before = (ring_state(seq), seq.checkpoint())
    assert not seq.skip_continuation(J, q, 1, gen.offset, 20, gen.offset + 10)
    assert not seq.skip_continuation(J, p, 1, 0, 20, 10)  # Before the read-through offset.
    assert not seq.skip_continuation(J, p, 0, gen.offset, 20, gen.offset + 10)
    assert (ring_state(seq), seq.checkpoint()) == before
    seq.queue_trusted(gen(q, 5, FLAG_CONTINUE_TXN))  # Linked: the ring holds its start.
    assert seq.unlinked_span_clock(J, q) is None
    seq.queue_trusted(gen(p, 30, FLAG_ACK_TXN))  # Commits p's span, by a replay.
    assert seq.unlinked_span_clock(J, p) is None  # Emitting: nothing is queued meanwhile.


def test_skip_continuation_evicts_the_head_slot_as_queueing_the_first_would() -> None:
    """The ring is full of another producer's span: queueing a message evicts its start (it
    will be replayed), whether or not the message is linked; counting one does too."""
    restored = SequencerCheckpoint(
        read_through={J: 100}, producers={JournalProducer(J, PRODUCERS[0]): ProducerState(5, 0)}
    )
    seqs: list[Sequencer[SeqEnvelope]] = [Sequencer(2, restored), Sequencer(2, restored)]
    gen = Gen(J)
    gen.offset = 100
    envs = [gen(PRODUCERS[1], 50 + i, FLAG_CONTINUE_TXN) for i in range(2)]
    envs.append(gen(PRODUCERS[0], 10, FLAG_CONTINUE_TXN))  # Continues the restored span.
    for seq in seqs:
        seq.queue_trusted(envs[0])
        seq.queue_trusted(envs[1])
    reference, tested = seqs
    reference.queue_trusted(envs[2])
    assert tested.unlinked_span_clock(J, PRODUCERS[0]) == 5
    assert tested.skip_continuation(J, PRODUCERS[0], 1, envs[2].begin, 10, envs[2].end)
    assert ring_state(tested) == ring_state(reference)
    assert tested._partials[(J, PRODUCERS[1])].long_spans  # Its start was evicted.


class SequencedReplay:
    """A replay as read_iter's `Replay` serves one (`sequenced`): only the committing
    producer's envelopes, clocks rising within (last acknowledged, ACK's clock]; `take`s runs.
    `extra`, if given, is yielded last though it breaks that promise."""

    sequenced = True

    def __init__(self, envs: list[SeqEnvelope], extra: SeqEnvelope | None = None) -> None:
        self._envs = deque([*envs, *([] if extra is None else [extra])])

    def __iter__(self) -> SequencedReplay:
        return self

    def __next__(self) -> SeqEnvelope:
        if not self._envs:
            raise StopIteration
        return self._envs.popleft()

    def take(self, count: int) -> list[SeqEnvelope]:
        return [self._envs.popleft() for _ in range(min(count, len(self._envs)))]


def sequenced_replay(
    journals: dict[str, list[SeqEnvelope]], seq: Sequencer[SeqEnvelope], ack: SeqEnvelope
) -> None:
    """`replayed`, filtered as `Replay._keep` filters (the replay `ack` commits)."""
    r = seq.replay_required
    if r is None:
        return
    last = seq.checkpoint().producers[JournalProducer(ack.journal, ack.producer)].last_ack
    kept = []
    for env in journals[r.journal]:
        if r.begin <= env.begin and env.end <= r.end and env.producer == ack.producer:
            if last < env.clock <= ack.clock:
                kept.append(env)
                last = env.clock
    seq.replay(SequencedReplay(kept))


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    txns=st.lists(LONG_TXNS, min_size=1, max_size=6),
    ring_size=st.integers(1, 16),
    limits=st.lists(st.integers(1, 80), min_size=1, max_size=8),
)
def test_sequenced_replays_checked_at_their_ends_deliver_as_the_general_path(
    txns: list[LongTxn], ring_size: int, limits: list[int]
) -> None:
    """A replay that is `sequenced` has its runs checked at their ends only
    (`dequeue_replayed`): deliveries, checkpoints and pending state are those of `dequeue()`
    one by one over the whole replayed range."""
    with structlog.testing.capture_logs():
        journals = long_journal(txns)
        reference: Sequencer[SeqEnvelope] = Sequencer(ring_size)
        tested: Sequencer[SeqEnvelope] = Sequencer(ring_size)
        turn = 0
        for env in journals[J]:
            reference.queue_uncommitted(env)
            replayed(journals, reference)
            tested.queue_uncommitted(env)
            sequenced_replay(journals, tested, env)
            while True:
                limit = limits[turn % len(limits)]
                turn += 1
                run = tested.dequeue_replayed(limit)
                if not run:
                    break
                event("a sequenced replay taken in runs")
                assert [reference.dequeue() for _ in run] == run
                assert tested.checkpoint() == reference.checkpoint()
            rest = []
            while (out := tested.dequeue()) is not None:
                rest.append(out)
            assert [reference.dequeue() for _ in range(len(rest) + 1)] == [*rest, None]
            assert tested.checkpoint() == reference.checkpoint()


def test_a_sequenced_run_whose_ends_fail_the_checks_is_checked_per_envelope() -> None:
    """A run whose last envelope lies past what the ACK commits (a replay breaking its
    promise): the run is filtered envelope by envelope, as any replay's, not taken whole."""
    gen = Gen(J)
    seq: Sequencer[SeqEnvelope] = Sequencer(1)
    span = [gen(PRODUCERS[0], clock, FLAG_CONTINUE_TXN) for clock in (1, 2, 3)]
    beyond = gen(PRODUCERS[0], 9, FLAG_CONTINUE_TXN)  # Rolled back by the ACK below.
    ack = gen(PRODUCERS[0], 4, FLAG_ACK_TXN)
    for env in (*span, ack):
        seq.queue_uncommitted(env)
    assert seq.replay_required is not None
    seq.replay(SequencedReplay(span, extra=beyond))
    assert seq.dequeue_replayed(10) == span
    assert seq.dequeue() is ack
