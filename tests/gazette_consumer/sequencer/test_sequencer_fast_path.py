"""The Sequencer's fast entry points (`commit_alone`, `queue_span`, `dequeue`, `dequeue_all`,
`dequeue_replayed`) against the general one (`queue_uncommitted` then `step()` until False):
identical deliveries, checkpoints and pending spans, for any stream; and each fast entry
point's own contract."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import structlog
from hypothesis import event, given, settings
from hypothesis import strategies as st

from gazette_consumer.sequencer import (
    FLAG_ACK_TXN,
    FLAG_CONTINUE_TXN,
    FLAG_OUTSIDE_TXN,
    InvalidEnvelopeError,
    JournalProducer,
    OffsetRegressionError,
    ProducerState,
    QueueOutcome,
    SeqEnvelope,
    Sequencer,
    SequencerCheckpoint,
    SequencerStateError,
)

OUT, CONT, ACK = FLAG_OUTSIDE_TXN, FLAG_CONTINUE_TXN, FLAG_ACK_TXN
UNKNOWN_FLAGS = 0x5  # Reserved bits: sequenced as OUTSIDE_TXN, with a logged error.
J = "test/journal"
A = bytes.fromhex("01aaaaaaaaaa")
B = bytes.fromhex("01bbbbbbbbbb")
PRODUCERS = [A, B, bytes.fromhex("01cccccccccc")]
EXAMPLES = int(os.environ.get("GAZETTE_TEST_EXAMPLES", "200"))


class Gen:
    """Envelopes at increasing offsets of one journal, with dead space between some."""

    def __init__(self, journal: str = J) -> None:
        self.journal = journal
        self.offset = 0

    def __call__(self, producer: bytes, clock: int, flags: int, gap: int = 2) -> SeqEnvelope:
        env = SeqEnvelope(
            self.journal, self.offset, self.offset + 10, producer, clock, flags, self.offset
        )
        self.offset += 10 + gap
        return env


# -- equivalence on random streams --------------------------------------------------------------


@dataclass(frozen=True)
class Msg:
    producer: int
    clock_step: int  # Added to the producer's last clock: <= 0 makes duplicates and old ACKs.
    flags: int
    gap: int


MSGS = st.builds(
    Msg,
    st.integers(0, len(PRODUCERS) - 1),
    st.one_of(st.integers(1, 3), st.integers(-4, 3), st.just(0)),
    st.sampled_from([OUT] * 4 + [CONT] * 4 + [ACK] * 2 + [UNKNOWN_FLAGS]),
    st.sampled_from([0, 0, 3]),
)


def journals_of(streams: list[list[Msg]], zero_every: int) -> dict[str, list[SeqEnvelope]]:
    """Envelopes of each journal; every `zero_every`-th one has clock 0 (no UUID)."""
    out: dict[str, list[SeqEnvelope]] = {}
    for j, stream in enumerate(streams):
        gen, clocks = Gen(f"test/j{j}"), [10, 10, 10]
        envs = out[gen.journal] = []
        for i, m in enumerate(stream):
            clocks[m.producer] = max(1, clocks[m.producer] + m.clock_step)
            clock = 0 if zero_every and i % zero_every == zero_every - 1 else clocks[m.producer]
            envs.append(gen(PRODUCERS[m.producer], clock, m.flags, m.gap))
    return out


def replayed(journals: dict[str, list[SeqEnvelope]], seq: Sequencer[SeqEnvelope]) -> None:
    r = seq.replay_required
    if r is not None:
        seq.replay(e for e in journals[r.journal] if r.begin <= e.begin and e.end <= r.end)


def general(
    seq: Sequencer[SeqEnvelope], journals: dict[str, list[SeqEnvelope]], batch: list[SeqEnvelope]
) -> list[SeqEnvelope]:
    out = []
    for env in batch:
        seq.queue_uncommitted(env)
        replayed(journals, seq)
        while seq.step():
            assert seq.dequeued is not None
            out.append(seq.dequeued)
    return out


def fast(
    seq: Sequencer[SeqEnvelope], journals: dict[str, list[SeqEnvelope]], batch: list[SeqEnvelope]
) -> list[SeqEnvelope]:
    """As the read-committed iterator drives the Sequencer."""
    out = []
    pending = deque(batch)
    while pending:
        if seq.commit_alone(pending[0]):
            event("commit_alone")
            out.append(pending.popleft())
            continue
        # A whole transaction at once (given a list or the deque itself, in turn; with a
        # bound on the messages looked at, now and then).
        limit = (None, 1, 2, 5)[len(out) % 4]
        if n := seq.commit_span_run(list(pending) if len(out) % 2 else pending, limit):
            assert limit is None or n <= limit + 1
            event("commit_span_run")
            out.extend(pending.popleft() for _ in range(n))  # Its ACK last, as dequeued.
            continue
        if seq.queue_span(pending) is None:
            assert seq.replay_required is None and seq.dequeue() is None  # Nothing committed.
            continue
        event("queue_span committed" + (", with a replay" if seq.replay_required else ""))
        if seq.replay_required is not None:
            assert seq.dequeue_all() == []  # Served by a replay: dequeue() one by one.
        replayed(journals, seq)
        # A replay's messages in runs (as a reader takes them), of 1, 3 or all at once.
        limit = (1, 3, 1 << 20)[len(out) % 3]
        while envs := seq.dequeue_replayed(limit):
            event("dequeue_replayed")
            assert len(envs) <= limit
            out.extend(envs)
        # Most commits at once, as a reader takes a transaction the ring holds; some after
        # a first step one by one.
        if len(out) % 3 == 1 and (env := seq.dequeue()) is not None:
            out.append(env)
        if len(out) % 3 != 0 and (committed := seq.dequeue_all()):
            event("dequeue_all")
            out.extend(committed)
            assert seq.dequeue() is None and seq.dequeue_all() == []
            continue
        while (env := seq.dequeue()) is not None:
            out.append(env)
    return out


def assert_same(one: Sequencer[SeqEnvelope], two: Sequencer[SeqEnvelope]) -> None:
    assert one.checkpoint() == two.checkpoint()
    since = {j: o // 2 for j, o in one.checkpoint().read_through.items()}
    assert one.has_pending(since) == two.has_pending(since)
    assert one.has_pending({}) == two.has_pending({})


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    streams=st.lists(st.lists(MSGS, max_size=60), min_size=1, max_size=3),
    ring_size=st.one_of(st.integers(1, 4), st.integers(1, 64), st.integers(1, 1024)),
    schedule=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 12), st.integers(0, 9))),
    zero_every=st.sampled_from([0, 0, 7]),
)
def test_fast_entry_points_match_the_general_path(
    streams: list[list[Msg]],
    ring_size: int,
    schedule: list[tuple[int, int, int]],
    zero_every: int,
) -> None:
    with structlog.testing.capture_logs():  # Unusual flags and clocks are logged errors.
        check_equivalence(journals_of(streams, zero_every), ring_size, schedule)


def check_equivalence(
    journals: dict[str, list[SeqEnvelope]], ring_size: int, schedule: list[tuple[int, int, int]]
) -> None:
    names = sorted(journals)
    reference: Sequencer[SeqEnvelope] = Sequencer(ring_size)
    tested: Sequencer[SeqEnvelope] = Sequencer(ring_size)
    pos = dict.fromkeys(names, 0)
    # Read batches of the journals in the scheduled order, then whatever is left.
    steps = [*schedule, *((j, 1 << 20, 0) for j in range(len(names)))]
    for j, count, action in steps:
        journal = names[j % len(names)]
        batch = journals[journal][pos[journal] : pos[journal] + count]
        pos[journal] += len(batch)
        assert general(reference, journals, batch) == fast(tested, journals, batch)
        assert_same(reference, tested)
        assert ring_state(tested) == ring_state(reference)
        if action == 0:
            # Restart both from one checkpoint, which prunes the idle producers.
            horizon = _prunes_some(journals)
            cp = reference.checkpoint(horizon)
            assert tested.checkpoint(horizon) == cp
            reference, tested = Sequencer(ring_size, cp), Sequencer(ring_size, cp)
            for name in names:
                offset = cp.read_through.get(name, 0)
                envs = journals[name]
                pos[name] = next((i for i, e in enumerate(envs) if e.begin >= offset), len(envs))


# -- dequeue_all ---------------------------------------------------------------------------------


def test_dequeue_all_delivers_what_the_ack_commits_and_leaves_the_rest() -> None:
    gen = Gen()
    # A's span: 5, a duplicate 5 (not linked), 7, B's 3 between; A's ACK at 6 commits 5 only
    # (7 rolls back), and B's span stays pending in the ring.
    a5, a5dup, b3, a7, ack6 = (
        gen(A, 5, CONT),
        gen(A, 5, CONT),
        gen(B, 3, CONT),
        gen(A, 7, CONT),
        gen(A, 6, ACK),
    )
    seq: Sequencer[SeqEnvelope] = Sequencer(8)
    assert seq.dequeue_all() == []  # Nothing emitting.
    for env in (a5, a5dup, b3, a7):
        seq.queue_uncommitted(env)
    assert seq.queue_uncommitted(ack6) is QueueOutcome.ACK_COMMIT_RING
    through = seq.read_through(J)
    assert through == a7.end  # The ACK is stepped past only once delivered.
    assert seq.dequeue_all() == [a5, ack6]
    assert seq.dequeue() is None and seq.dequeue_all() == []
    assert seq.read_through(J) == ack6.end
    assert seq.checkpoint().producers == {
        JournalProducer(J, A): ProducerState(6),
        JournalProducer(J, B): ProducerState(3 - 1, b3.begin),
    }
    assert seq._ring.occupied == 1  # B's entry.


def test_queue_span_links_a_run_at_once_as_one_by_one() -> None:
    """queue_span links a producer's run of CONTINUE_TXN messages into free slots at once: it
    stops at a clock that does not rise (a re-sent message: dropped, as one by one), another
    producer's message, the ring's end and an owned slot, and leaves the ring as linking each
    message in turn does."""
    gen = Gen()
    a = [gen(A, c, CONT) for c in (5, 6, 7, 7, 8, 9)]  # 7 twice: a re-sent message.
    b = [gen(B, 3, CONT)]
    a += [gen(A, c, CONT) for c in (10, 11, 12, 13)]
    ack = gen(A, 20, ACK)
    mixed = a[:6] + b + a[6:] + [ack]
    gen = Gen()
    plain = [gen(A, c, CONT) for c in (5, 6, 7, 8, 9, 10, 11, 12, 13)] + [gen(A, 20, ACK)]
    cases = [(envs, size) for envs in (mixed, plain) for size in (4, 7, 16)]
    for envs, ring_size in cases:  # The ring's end, evictions, and room for it all.
        ack = envs[-1]
        reference: Sequencer[SeqEnvelope] = Sequencer(ring_size)
        tested: Sequencer[SeqEnvelope] = Sequencer(ring_size)
        for env in envs[:-1]:
            reference.queue_trusted(env)
        pending = deque(envs[:-1])
        while pending:
            assert tested.queue_span(pending) is None
        assert ring_state(tested) == ring_state(reference), ring_size
        assert len(tested._ring.entries) == ring_size
        assert tested.checkpoint() == reference.checkpoint()
        for seq in (reference, tested):
            seq.queue_trusted(ack)
        replayed({J: envs}, reference)
        replayed({J: envs}, tested)
        delivered = []
        for seq in (reference, tested):
            out = []
            while (env := seq.dequeue()) is not None:
                out.append(env)
            delivered.append(out)
        assert delivered[0] == delivered[1]
        assert [e.clock for e in delivered[0]] == [5, 6, 7, 8, 9, 10, 11, 12, 13, 20]


@pytest.mark.parametrize(
    "clocks",
    [
        [(A, 5), (A, 6), (A, 7), (A, "ack", 8)],  # As long as the ring: the ACK needs a replay.
        [(A, 5), (A, "ack", 5), (A, 6), (A, 7), (A, "ack", 5)],  # A re-sent ACK rolls back.
        [(A, 5), (A, "ack", 5), (A, 6), (A, "ack", 4)],  # An older ACK: rolls back, logged.
        [(A, 5), (B, 1), (A, 6), (A, "ack", 9)],  # Another producer's message in between.
        [(A, 5), (A, 6), (A, "ack", 6), (A, 7), (A, "ack", 9)],  # Two transactions.
    ],
)
def test_queue_span_commits_an_ack_inline_as_queue_trusted(
    clocks: list[tuple[object, ...]],
) -> None:
    """queue_span commits a span from the ring when its ACK follows its messages (without
    queue_trusted), exactly where queue_trusted would (ACK_COMMIT_RING): never for a span
    the ring lost the start of, a rollback or an older ACK."""
    gen = Gen()
    envs = [
        gen(c[0], c[-1], ACK if c[1] == "ack" else CONT)  # type: ignore[arg-type]
        for c in clocks
    ]
    with structlog.testing.capture_logs():
        reference: Sequencer[SeqEnvelope] = Sequencer(3)
        tested: Sequencer[SeqEnvelope] = Sequencer(3)
        expected: list[SeqEnvelope] = []
        for env in envs:
            reference.queue_trusted(env)
            replayed({J: envs}, reference)
            while (got := reference.dequeue()) is not None:
                expected.append(got)
        delivered: list[SeqEnvelope] = []
        pending = deque(envs)
        while pending:
            if tested.queue_span(pending) is not None:
                replayed({J: envs}, tested)
                while (got := tested.dequeue()) is not None:
                    delivered.append(got)
        assert delivered == expected
        assert ring_state(tested) == ring_state(reference)
        assert tested.checkpoint() == reference.checkpoint()


# -- commit_alone --------------------------------------------------------------------------------


def test_commit_alone_delivers_outside_messages_as_the_general_path_does() -> None:
    gen = Gen()
    a1, b1, a2, z = gen(A, 5, OUT), gen(B, 9, OUT), gen(A, 6, OUT), gen(bytes(6), 0, OUT)
    fast_seq: Sequencer[SeqEnvelope] = Sequencer(2)
    assert [fast_seq.commit_alone(e) for e in (a1, b1, a2, z)] == [True] * 4
    assert fast_seq.dequeued is None and not fast_seq.step()
    assert fast_seq.checkpoint() == SequencerCheckpoint(
        read_through={J: z.end},
        producers={
            JournalProducer(J, A): ProducerState(6),
            JournalProducer(J, B): ProducerState(9),
        },
    )


def test_commit_alone_declines_and_changes_nothing() -> None:
    gen = Gen()
    a1, a2, a_dup = gen(A, 5, OUT), gen(A, 6, CONT), gen(A, 5, OUT)
    seq: Sequencer[SeqEnvelope] = Sequencer(4)
    assert seq.commit_alone(a1)
    before = seq.checkpoint()
    assert not seq.commit_alone(a_dup)  # A duplicate: queue_uncommitted ignores it.
    for flags in (CONT, ACK, UNKNOWN_FLAGS):
        assert not seq.commit_alone(gen(A, 7, flags))
    assert seq.checkpoint() == before

    assert seq.queue_uncommitted(a2) is QueueOutcome.CONTINUE_BEGIN_SPAN
    assert not seq.commit_alone(gen(A, 8, OUT))  # Would discard the pending span.
    assert not seq.commit_alone(SeqEnvelope(J, 0, 10, B, 3, OUT))  # Offset regression.
    with pytest.raises(OffsetRegressionError):
        seq.queue_uncommitted(SeqEnvelope(J, 0, 10, B, 3, OUT))

    seq.queue_uncommitted(gen(A, 9, ACK))
    assert not seq.commit_alone(gen(B, 1, OUT))  # Messages remain to dequeue.
    assert seq.dequeue() == a2


# -- queue_span and dequeue ----------------------------------------------------------------------


def test_queue_span_queues_a_transaction_and_stops_at_its_ack() -> None:
    gen = Gen()
    span = [gen(A, c, CONT) for c in (2, 3, 4)]
    ack, after = gen(A, 5, ACK), gen(A, 6, OUT)
    seq: Sequencer[SeqEnvelope] = Sequencer(8)
    pending = deque([*span, ack, after])
    assert seq.queue_span(pending) is ack
    assert list(pending) == [after]
    assert seq.checkpoint().producers[JournalProducer(J, A)] == ProducerState(1, span[0].begin)
    assert [seq.dequeue() for _ in range(5)] == [*span, ack, None]
    assert seq.checkpoint().producers[JournalProducer(J, A)] == ProducerState(5)


def test_queue_span_stops_before_an_outside_message_but_takes_a_first_one() -> None:
    gen = Gen()
    a1, a2, a3 = gen(A, 2, CONT), gen(A, 3, OUT), gen(A, 4, OUT)
    seq: Sequencer[SeqEnvelope] = Sequencer(8)
    pending = deque([a1, a2, a3])
    assert seq.queue_span(pending) is None
    assert list(pending) == [a2, a3]  # Left for commit_alone (which declines: a span pends).
    assert not seq.commit_alone(a2)
    assert seq.queue_span(pending) is a2  # Taken anyway: it discards the span, and commits.
    assert [seq.dequeue(), seq.dequeue()] == [a2, None]
    assert seq.queue_span(deque()) is None


def test_queue_span_refuses_out_of_order_use_as_queue_uncommitted_does() -> None:
    gen = Gen()
    seq: Sequencer[SeqEnvelope] = Sequencer(8)
    pending = deque([gen(A, 2, OUT), gen(A, 3, CONT)])
    assert seq.queue_span(pending) is not None
    with pytest.raises(SequencerStateError, match="remain to dequeue"):
        seq.queue_span(pending)
    assert seq.dequeue() is not None and seq.dequeue() is None
    assert seq.queue_span(pending) is None  # The CONTINUE_TXN message.
    before = seq.checkpoint()
    for flags in (CONT, ACK):
        # Begins before what was read through (a reader bug): refused, nothing changed.
        with pytest.raises(OffsetRegressionError):
            seq.queue_span(deque([SeqEnvelope(J, 0, 10, A, 9, flags)]))
    assert seq.checkpoint() == before


def test_queue_uncommitted_validates_envelopes_of_other_types() -> None:
    @dataclass(frozen=True)
    class Other:
        journal: str
        begin: int
        end: int
        producer: bytes
        clock: int
        flags: int

    seq: Sequencer[Other] = Sequencer(4)
    bad = [
        Other("", 0, 10, A, 1, OUT),
        Other(J, 10, 10, A, 1, OUT),
        Other(J, 0, 10, b"short", 1, OUT),
        Other(J, 0, 10, A, -1, OUT),
        Other(J, 0, 10, A, 1, 0x400),
    ]
    for env in bad:
        with pytest.raises(InvalidEnvelopeError):
            seq.queue_uncommitted(env)
    assert seq.checkpoint() == SequencerCheckpoint()
    good = Other(J, 0, 10, A, 1, OUT)
    assert seq.queue_uncommitted(good) is QueueOutcome.OUTSIDE_COMMIT
    assert [seq.dequeue(), seq.dequeue()] == [good, None]


# -- commit_alone_run ----------------------------------------------------------------------------


def ring_state(seq: Sequencer[SeqEnvelope]) -> tuple[object, ...]:
    """What of the ring and the producer states a later call can observe."""
    ring = seq._ring
    partials = {
        k: (p.min_clock, p.max_clock, p.begin, p.ring_start, p.ring_stop, p.long_spans, p.unlinked)
        for k, p in seq._partials.items()
    }
    owners = [
        None
        if o is None
        else next(k for k, p in seq._partials.items() if p is o)
        if any(p is o for p in seq._partials.values())
        else "gone"
        for o in ring.owners
    ]
    # The count of owned slots, which lets commit_alone_run skip its eviction scan, is exact.
    assert ring.occupied == sum(o is not None for o in ring.owners)
    return ring.head, ring.links, [e is None for e in ring.entries], owners, partials


RUN_MSGS = st.builds(
    Msg,
    st.sampled_from([0, 0, 0, 1]),
    st.sampled_from([1, 1, 1, 1, 2, 3, 0, -1]),
    st.sampled_from([OUT] * 8 + [CONT, ACK]),
    st.sampled_from([0, 0, 3]),
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    prefix=st.lists(MSGS, max_size=30),
    candidates=st.lists(RUN_MSGS, min_size=1, max_size=40),
    ring_size=st.one_of(st.integers(1, 4), st.integers(1, 64)),
    zero_every=st.sampled_from([0, 0, 7]),
    regress=st.booleans(),
    hint=st.sampled_from(["none", "none", "exact", "shorter"]),
    cut=st.integers(0, 40),
)
def test_commit_alone_run_is_commit_alone_per_message(
    prefix: list[Msg],
    candidates: list[Msg],
    ring_size: int,
    zero_every: int,
    regress: bool,
    hint: str,
    cut: int,
) -> None:
    """From any state, `commit_alone_run` commits exactly the leading envelopes `commit_alone`
    would take one by one (up to one without a UUID or of another producer), and leaves the
    Sequencer, ring included, exactly as those calls do; given the run's length as a decoder
    measures it (`length`: the envelopes' own run, or less), it commits no further."""
    with structlog.testing.capture_logs():
        journals = journals_of([prefix + candidates], zero_every)
        envs = journals["test/j0"]
        if regress and len(envs) > len(prefix) + 1:  # A run whose offsets go back.
            i, e = len(prefix) + 1, envs[len(prefix) + 1]
            back = envs[i - 1]
            envs[i] = SeqEnvelope(e.journal, back.begin, back.end, e.producer, e.clock, e.flags)
        head, tail = envs[: len(prefix)], envs[len(prefix) :]
        reference: Sequencer[SeqEnvelope] = Sequencer(ring_size)
        tested: Sequencer[SeqEnvelope] = Sequencer(ring_size)
        assert general(reference, journals, head) == general(tested, journals, head)
        length = None
        if hint != "none":
            length = own_run(tail) if hint == "exact" else min(cut, own_run(tail))
        expected = 0
        for env in tail:
            if env.clock == 0 or env.producer != tail[0].producer or expected == length:
                break  # A run is of one producer's messages with a UUID (and as long as said).
            if not reference.commit_alone(env):
                break
            expected += 1
        got = tested.commit_alone_run(list(tail), length)
        event(f"run of {min(got, 3)}{'+' if got > 3 else ''}")
        assert got == expected
        assert ring_state(tested) == ring_state(reference)
        assert_same(reference, tested)
        # And they go on alike.
        through, rest = tested.checkpoint().read_through.get("test/j0", 0), []
        for env in tail[got:]:
            if env.begin >= through:  # Not the regressed one (the general path raises).
                rest.append(env)
                through = env.end
        assert general(reference, journals, rest) == general(tested, journals, rest)
        assert_same(reference, tested)


MIXED_MSGS = st.builds(
    Msg,
    st.sampled_from([0, 1, 2]),
    st.sampled_from([1] * 12 + [2, 3, 0, -1]),
    st.sampled_from([OUT] * 20 + [CONT, ACK]),
    st.sampled_from([0, 0, 3]),
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    prefix=st.lists(MSGS, max_size=30),
    candidates=st.lists(MIXED_MSGS, min_size=1, max_size=40),
    ring_size=st.one_of(st.integers(1, 4), st.integers(1, 64)),
    zero_every=st.sampled_from([0, 0, 7]),
    regress=st.booleans(),
)
def test_commit_alone_mixed_is_commit_alone_per_message(
    prefix: list[Msg], candidates: list[Msg], ring_size: int, zero_every: int, regress: bool
) -> None:
    """From any state, `commit_alone_mixed` commits exactly the leading envelopes `commit_alone`
    would take one by one, producers alternating (up to one without a UUID), leaves the
    Sequencer, ring included, exactly as those calls do, and names each producer's state from
    before the run."""
    with structlog.testing.capture_logs():
        journals = journals_of([prefix + candidates], zero_every)
        envs = journals["test/j0"]
        if regress and len(envs) > len(prefix) + 1:  # A run whose offsets go back.
            i, e = len(prefix) + 1, envs[len(prefix) + 1]
            back = envs[i - 1]
            envs[i] = SeqEnvelope(e.journal, back.begin, back.end, e.producer, e.clock, e.flags)
        head, tail = envs[: len(prefix)], envs[len(prefix) :]
        reference: Sequencer[SeqEnvelope] = Sequencer(ring_size)
        tested: Sequencer[SeqEnvelope] = Sequencer(ring_size)
        assert general(reference, journals, head) == general(tested, journals, head)
        states = {
            (k.journal, k.producer): p.last_ack for k, p in tested.checkpoint().producers.items()
        }
        expected, expected_before = 0, {}
        for env in tail:
            if env.clock == 0:
                break  # commit_alone's alone.
            key = (env.journal, env.producer)
            prior = states.get(key) if reference._partials.get(key) is not None else None
            if not reference.commit_alone(env):
                break
            expected_before.setdefault(key, prior)
            expected += 1
        before: dict[tuple[str, bytes], int | None] = {}
        got = tested.commit_alone_mixed(deque(tail), before)
        event(f"mixed run of {min(got, 3)}{'+' if got > 3 else ''}")
        event(f"producers {len(before)}")
        assert got == expected
        assert before == expected_before
        assert ring_state(tested) == ring_state(reference)
        assert_same(reference, tested)
        # And they go on alike.
        through, rest = tested.checkpoint().read_through.get("test/j0", 0), []
        for env in tail[got:]:
            if env.begin >= through:  # Not the regressed one (the general path raises).
                rest.append(env)
                through = env.end
        assert general(reference, journals, rest) == general(tested, journals, rest)
        assert_same(reference, tested)


def test_commit_alone_mixed_declines_and_changes_nothing() -> None:
    gen = Gen()
    seq: Sequencer[SeqEnvelope] = Sequencer(8)
    before: dict[tuple[str, bytes], int | None] = {}
    assert seq.commit_alone_mixed([], before) == 0
    a5 = gen(A, 5, OUT)
    assert seq.commit_alone_mixed([a5, gen(B, 3, OUT), gen(A, 5, OUT), gen(B, 4, OUT)], before) == 2
    assert before == {(J, A): None, (J, B): None}
    before = {}
    assert seq.commit_alone_mixed([gen(A, 6, OUT), gen(bytes(6), 0, OUT)], before) == 1
    assert before == {(J, A): 5}
    assert seq.commit_alone_mixed([gen(B, 2, OUT)], {}) == 0  # A duplicate.
    assert seq.commit_alone_mixed([SeqEnvelope(J, 0, 10, B, 9, OUT)], {}) == 0  # Went back.
    assert seq.commit_alone_mixed([gen(A, 9, CONT)], {}) == 0
    assert seq.queue_uncommitted(gen(A, 10, CONT)) is not None
    assert seq.commit_alone_mixed([gen(A, 11, OUT)], {}) == 0  # Would discard the span.


def own_run(envs: list[SeqEnvelope]) -> int:
    """The run the envelopes form among themselves, as a decoder measures it: OUTSIDE_TXN
    messages with a UUID, of the first one's producer, clocks rising, offsets not going back."""
    n = 0
    for env in envs:
        if env.clock == 0 or env.flags != OUT or env.producer != envs[0].producer:
            break
        if n and (env.clock <= envs[n - 1].clock or env.begin < envs[n - 1].end):
            break
        n += 1
    return n


def runs(
    seq: Sequencer[SeqEnvelope], journals: dict[str, list[SeqEnvelope]], batch: list[SeqEnvelope]
) -> list[SeqEnvelope]:
    """`fast`, trying `commit_alone_run` wherever an envelope comes up to commit alone."""
    out: list[SeqEnvelope] = []
    pending = deque(batch)
    while pending:
        # A list with the decoder's measure of its run, one without, or the deque itself (as
        # a reader gives it a run further into a piece), in turn.
        way = len(out) % 3
        listed = list(pending) if way else pending
        if n := seq.commit_alone_run(listed, own_run(list(listed)) if way == 1 else None):
            out.extend(pending.popleft() for _ in range(n))
            continue
        out.extend(fast(seq, journals, [pending.popleft()]))
    return out


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    streams=st.lists(st.lists(RUN_MSGS, max_size=60), min_size=1, max_size=2),
    ring_size=st.one_of(st.integers(1, 4), st.integers(1, 64)),
    zero_every=st.sampled_from([0, 0, 7]),
)
def test_runs_match_the_general_path(
    streams: list[list[Msg]], ring_size: int, zero_every: int
) -> None:
    """Mixing runs with the other fast entry points delivers what the general path does, with
    identical checkpoints (pruning included) at every batch."""
    with structlog.testing.capture_logs():
        journals = journals_of(streams, zero_every)
        reference: Sequencer[SeqEnvelope] = Sequencer(ring_size)
        tested: Sequencer[SeqEnvelope] = Sequencer(ring_size)
        for name in sorted(journals):
            envs = journals[name]
            for i in range(0, len(envs), 9):
                batch = envs[i : i + 9]
                assert general(reference, journals, batch) == runs(tested, journals, batch)
                assert_same(reference, tested)
                assert reference.checkpoint(12) == tested.checkpoint(12)


def test_commit_alone_run_declines_and_changes_nothing() -> None:
    gen = Gen()
    seq: Sequencer[SeqEnvelope] = Sequencer(4)
    assert seq.commit_alone_run([]) == 0
    a5 = gen(A, 5, OUT)
    assert seq.commit_alone_run([a5, gen(A, 6, OUT), gen(A, 6, OUT), gen(A, 7, OUT)]) == 2
    before = seq.checkpoint()
    assert seq.commit_alone_run([gen(A, 6, OUT)]) == 0  # A duplicate.
    assert seq.commit_alone_run([gen(bytes(6), 0, OUT)]) == 0  # No UUID: commit_alone's.
    assert seq.commit_alone_run([SeqEnvelope(J, 0, 10, B, 3, OUT)]) == 0  # Offset regression.
    for flags in (CONT, ACK, UNKNOWN_FLAGS):
        assert seq.commit_alone_run([gen(A, 9, flags)]) == 0
    assert seq.checkpoint() == before
    seq.queue_uncommitted(gen(A, 10, CONT))
    assert seq.commit_alone_run([gen(A, 11, OUT)]) == 0  # Would discard the pending span.
    seq.queue_uncommitted(gen(A, 12, ACK))
    assert seq.commit_alone_run([gen(B, 1, OUT)]) == 0  # Messages remain to dequeue.


def test_commit_alone_run_commits_no_more_than_the_length_given() -> None:
    gen = Gen()
    seq: Sequencer[SeqEnvelope] = Sequencer(8)
    envs = [gen(A, 5 + i, OUT) for i in range(6)]
    assert seq.commit_alone_run(envs, 0) == 0
    assert seq.checkpoint() == SequencerCheckpoint()
    assert seq.commit_alone_run(envs, 2) == 2
    assert seq.checkpoint().read_through[J] == envs[1].end
    assert seq.checkpoint().producers[JournalProducer(J, A)] == ProducerState(6, -1)
    assert seq.commit_alone_run(envs[2:], 99) == 4  # No further than the list.
    assert seq.checkpoint().producers[JournalProducer(J, A)] == ProducerState(10, -1)


# -- commit_span_run -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Txn:
    producer: int
    messages: int  # CONTINUE_TXN messages, then the ACK.
    ack_step: int  # The ACK's clock past the last message's: < 0 rolls some back.
    dup_at: int  # A re-sent message at this index (none if past the end).
    other_at: int  # Another producer's OUTSIDE_TXN message at this index (none if past).
    regress: bool  # The ACK's offset goes back.
    acked: bool  # Else the transaction stays pending (its entries stay in the ring).


TXNS = st.builds(
    Txn,
    st.integers(0, len(PRODUCERS) - 1),
    st.integers(0, 9),
    st.sampled_from([1, 1, 1, 0, -1, -20]),
    st.integers(0, 40),
    st.integers(0, 40),
    st.sampled_from([False] * 9 + [True]),
    st.sampled_from([True] * 4 + [False]),
)


def txn_journal(txns: list[Txn]) -> dict[str, list[SeqEnvelope]]:
    gen, clocks, envs = Gen(), [10, 10, 10], []
    for t in txns:
        p = PRODUCERS[t.producer]
        for i in range(t.messages + 1):
            if i == t.other_at:
                q = (t.producer + 1) % len(PRODUCERS)
                clocks[q] += 1
                envs.append(gen(PRODUCERS[q], clocks[q], OUT, gap=0))
            if i == t.dup_at and i:
                envs.append(gen(p, clocks[t.producer], CONT, gap=0))  # Re-sent: same clock.
            if i < t.messages:
                clocks[t.producer] += 1
                envs.append(gen(p, clocks[t.producer], CONT, gap=0))
            elif t.acked:
                clock = max(1, clocks[t.producer] + t.ack_step)
                clocks[t.producer] = max(clocks[t.producer], clock)
                ack = gen(p, clock, ACK, gap=0)
                if t.regress and envs:
                    back = envs[-1]
                    ack = SeqEnvelope(J, back.begin, back.end, p, clock, ACK, back.begin)
                envs.append(ack)
    return {J: envs}


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    txns=st.lists(TXNS, max_size=12),
    ring_size=st.one_of(st.integers(1, 4), st.integers(1, 16), st.just(1024)),
    batch=st.integers(1, 40),
)
def test_transactions_at_once_match_the_general_path(
    txns: list[Txn], ring_size: int, batch: int
) -> None:
    """`commit_span_run` (through `fast`) delivers what the general path does and leaves the
    Sequencer, ring included, as it does: whole transactions, ones with re-sent messages,
    another producer's message inside, an ACK rolling messages back, offsets going back,
    transactions longer than the ring, and others left pending in the ring meanwhile."""
    with structlog.testing.capture_logs():
        journals = txn_journal(txns)
        envs = journals[J]
        reference: Sequencer[SeqEnvelope] = Sequencer(ring_size)
        tested: Sequencer[SeqEnvelope] = Sequencer(ring_size)
        for i in range(0, len(envs), batch):
            part = envs[i : i + batch]
            try:
                expected = general(reference, journals, part)
            except OffsetRegressionError:
                with pytest.raises(OffsetRegressionError):
                    fast(tested, journals, part)
                return
            assert fast(tested, journals, part) == expected
            assert ring_state(tested) == ring_state(reference)
            assert_same(reference, tested)


def _prunes_some(journals: Mapping[str, Sequence[Any]]) -> int:
    """A producer horizon (a span back from each journal's newest clock) that prunes some."""
    clocks = [e.clock for envs in journals.values() for e in envs]
    return max(1, (max(clocks, default=0) - min(clocks, default=0)) // 2)
