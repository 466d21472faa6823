"""The key acceptance test: a model of producers writing journals, read through a Sequencer.

Producers publish transactions the way Gazette's publishers do: CONTINUE_TXN messages, then at
commit one ACK_TXN per journal written (possibly delayed behind other producers' appends),
OUTSIDE_TXN messages, appends retried after an ambiguous failure (the same bytes again), and
crashes. A crashed producer's recovery re-writes the ACKs of its last committed transaction,
which commits what was not yet acknowledged and rolls back anything written since; it then
carries on with the same ProducerID (maybe reusing clocks) or a fresh one.

The model knows which messages committed, independently of how a reader would tell. A consumer
then reads the journals in a random interleaving through a Sequencer with a random ring size,
serving replays from the journals, taking checkpoints (also mid-dequeue, also pruning producers)
and crashing back to its last checkpoint. It must end up having consumed exactly the committed
messages, each once (the first copy), in per-producer order, each ACK's messages as one run.

Set GAZETTE_TEST_SEED (or pass pytest's --hypothesis-seed) for a deterministic run, and
GAZETTE_TEST_EXAMPLES for more examples than the default.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import event, given, seed, settings
from hypothesis import strategies as st

from gazette_consumer.sequencer import (
    FLAG_ACK_TXN,
    FLAG_CONTINUE_TXN,
    FLAG_OUTSIDE_TXN,
    JournalProducer,
    QueueOutcome,
    SeqEnvelope,
    Sequencer,
    SequencerCheckpoint,
)

MESSAGE_BYTES = 10
GAP_BYTES = 3  # Dead space between some appends: offsets need not be contiguous.
FIRST_CLOCK = 16  # Clock 0 means "no UUID"; keep model clocks (and clock - 1) clear of it.
CLOCK_STEP = 2  # Writers draw even clocks, leaving odd ones for ACKs between two messages.
JOURNALS_MAX = 3
PRODUCERS_MAX = 5
MESSAGES_PER_APPEND_MAX = 4
OPS_MIN = 8
OPS_MAX = 80
READS_MIN = 10
READS_MAX = 150
RING_SIZE_MAX = 1024
EXAMPLES = int(os.environ.get("GAZETTE_TEST_EXAMPLES", "250"))  # Raise it for a soak run.

# -- the writers' model -----------------------------------------------------------------------


@dataclass
class Producer:
    pid: bytes
    open_txn: dict[str, list[SeqEnvelope]] = field(default_factory=dict)
    intents: dict[str, int] = field(default_factory=dict)  # ACKs of the last committed txn.
    unwritten: set[str] = field(default_factory=set)  # Of `intents`, the not yet appended.
    last_ack: dict[str, int] = field(default_factory=dict)  # Last ACK clock appended per journal.
    last_append: dict[str, list[SeqEnvelope]] = field(default_factory=dict)
    last_journal: str = ""  # Of the producer's last append.
    max_committed: int = 0
    reuse_next: int | None = None  # Next clock while reusing clocks after a rollback.


class World:
    """Applies writer operations to journals, recording what must be read committed."""

    def __init__(self, journals: int) -> None:
        self.journals: dict[str, list[SeqEnvelope]] = {f"j/{i}": [] for i in range(journals)}
        self.heads = dict.fromkeys(self.journals, 0)
        self.now = FIRST_CLOCK
        self.pids = 0
        # Committed messages per JournalProducer, as groups: one per ACK (or OUTSIDE_TXN message).
        self.expected: dict[JournalProducer, list[list[SeqEnvelope]]] = {}
        # Messages of committed transactions whose ACK is not yet appended, by (jp, ACK clock).
        self.awaiting_ack: dict[tuple[JournalProducer, int], list[SeqEnvelope]] = {}
        # Each committed envelope's group, and its index in it, by (journal, begin).
        self.where: dict[tuple[str, int], tuple[list[SeqEnvelope], int]] = {}

    def new_pid(self) -> bytes:
        self.pids += 1
        return bytes([0x01, 0, 0, 0, 0, self.pids])

    def clock(self, p: Producer) -> int:
        if p.reuse_next is not None:
            c, p.reuse_next = p.reuse_next, p.reuse_next + CLOCK_STEP
        else:
            c = self.now
        self.now = max(self.now, c) + CLOCK_STEP
        return c

    def append(self, p: Producer, journal: str, parts: list[tuple[int, int]], gap: bool) -> None:
        """Append one write of (clock, flags) messages by `p`."""
        envs = []
        for clock, flags in parts:
            head = self.heads[journal]
            envs.append(
                SeqEnvelope(
                    journal, head, head + MESSAGE_BYTES, p.pid, clock, flags, (p.pid, clock)
                )
            )
            self.heads[journal] = head + MESSAGE_BYTES
        self.journals[journal].extend(envs)
        self.heads[journal] += GAP_BYTES if gap else 0
        p.last_append[journal] = envs
        p.last_journal = journal

    def retry(self, p: Producer, journal: str | None, gap: bool) -> None:
        """The client saw its last append to `journal` fail, though it landed: it re-appends.

        Without a journal, the producer's very last append is retried.
        """
        journal = journal or p.last_journal
        last = p.last_append.get(journal, [])
        if last:
            self.append(p, journal, [(e.clock, e.flags) for e in last], gap)

    def write_ack(self, p: Producer, journal: str, clock: int, gap: bool) -> None:
        jp = JournalProducer(journal, p.pid)
        self.append(p, journal, [(clock, FLAG_ACK_TXN)], gap)
        p.last_ack[journal] = clock
        group = self.awaiting_ack.pop((jp, clock), None)
        if group is not None:  # Its first copy: the ACK commits the group.
            self.expected.setdefault(jp, []).append([*group, p.last_append[journal][0]])

    def flush(self, p: Producer, journal: str | None, gap: bool) -> None:
        """Append committed-but-unwritten ACKs: one journal's, or all."""
        for j in sorted(p.unwritten) if journal is None else [journal]:
            if j in p.unwritten:
                p.unwritten.discard(j)
                self.write_ack(p, j, p.intents[j], gap)

    def publish(self, p: Producer, journal: str, n: int, gap: bool) -> None:
        # A publisher's appends to one journal are ordered: an ACK it started goes out first.
        self.flush(p, journal, gap)
        self.append(p, journal, [(self.clock(p), FLAG_CONTINUE_TXN) for _ in range(n)], gap)
        p.open_txn.setdefault(journal, []).extend(p.last_append[journal])

    def outside(self, p: Producer, journal: str, gap: bool) -> None:
        if p.open_txn:
            return self.publish(p, journal, 1, gap)
        self.flush(p, journal, gap)
        clock = self.clock(p)
        self.append(p, journal, [(clock, FLAG_OUTSIDE_TXN)], gap)
        self.expected.setdefault(JournalProducer(journal, p.pid), []).append(p.last_append[journal])
        p.max_committed = max(p.max_committed, clock)

    def commit(self, p: Producer, journal: str, now: bool, cut: int, gap: bool) -> None:
        """Commit the open transaction; with `cut`, only its first messages in each journal.

        An ACK commits the producer's pending messages with smaller clocks, and rolls back those
        with larger ones: an ACK clocked between two messages splits the span.
        """
        # A transaction commits only once the previous one's ACKs are out.
        self.flush(p, None, gap)
        # An empty transaction ACKs the given journal: an ACK without a span.
        journals = sorted(p.open_txn) or [journal]
        p.intents = {}
        for j in journals:
            span = p.open_txn.get(j, [])
            if cut and len(span) > 1:
                span = span[: 1 + (cut - 1) % (len(span) - 1)]
                clock = span[-1].clock + 1  # Odd, and so never a message's.
                event("partial commit")
            else:
                clock = self.clock(p)
            p.intents[j] = clock
            self.awaiting_ack[(JournalProducer(j, p.pid), clock)] = span
            p.max_committed = max(p.max_committed, clock)
        p.unwritten = set(journals)
        p.open_txn = {}
        p.reuse_next = None
        if now:
            self.flush(p, None, gap)

    def crash(self, p: Producer, same_pid: bool, reuse: bool, gap: bool) -> Producer:
        """The producer dies; its recovery re-writes its last checkpoint's ACK intents.

        Returns the producer that carries on: `p`, or a fresh publisher with a new ProducerID.
        """
        for j in sorted(p.intents):
            # First copies commit; re-sent ones roll back whatever was begun since.
            p.unwritten.discard(j)
            self.write_ack(p, j, p.intents[j], gap)
        if not same_pid:
            # Spans the old ProducerID left without an ACK stay pending forever.
            event("new ProducerID")
            return Producer(self.new_pid())
        for j in sorted(set(p.open_txn) - set(p.intents)):
            # Roll back explicitly, to a clock the reader has already acknowledged.
            clocks = [e.clock for e in self.journals[j] if e.producer == p.pid]
            self.write_ack(p, j, p.last_ack.get(j, min(clocks) - 1), gap)
        p.open_txn = {}
        if reuse:
            # Clocks after the largest the reader has acknowledged are free again.
            acked = max([FIRST_CLOCK, p.max_committed, *p.last_ack.values()])
            p.reuse_next = acked + CLOCK_STEP - acked % CLOCK_STEP
            event("clock reuse")
        return p


# Writer operations, repeated to weigh how often they are drawn.
WRITES = ("publish",) * 4 + ("commit",) * 3 + ("retry",) * 2 + ("outside", "flush", "crash")


@dataclass(frozen=True)
class Op:
    kind: str
    producer: int
    journal: int
    n: int
    flag: bool
    alt: bool
    gap: bool


OPS = st.builds(
    Op,
    st.sampled_from(WRITES),
    st.integers(0, PRODUCERS_MAX - 1),
    st.integers(0, JOURNALS_MAX - 1),
    st.integers(1, MESSAGES_PER_APPEND_MAX),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)


def build_world(journals: int, producers: int, ops: list[Op]) -> World:
    world = World(journals)
    names = list(world.journals)
    ps = [Producer(world.new_pid()) for _ in range(producers)]
    for op in ops:
        k, j = op.producer % producers, names[op.journal % journals]
        p = ps[k]
        if op.kind == "publish":
            world.publish(p, j, op.n, op.gap)
        elif op.kind == "outside":
            world.outside(p, j, op.gap)
        elif op.kind == "commit":
            world.commit(p, j, now=op.flag, cut=op.n if op.alt else 0, gap=op.gap)
        elif op.kind == "flush":
            world.flush(p, j if op.flag else None, op.gap)
        elif op.kind == "crash":
            ps[k] = world.crash(p, same_pid=op.flag, reuse=op.n % 2 == 0, gap=op.gap)
        else:
            world.retry(p, j if op.alt else None, op.gap)
    for p in ps:
        world.flush(p, None, gap=False)
    assert not world.awaiting_ack
    for groups in world.expected.values():
        for group in groups:
            for i, env in enumerate(group):
                world.where[(env.journal, env.begin)] = (group, i)
    return world


# -- the reader ---------------------------------------------------------------------------------


def jp_of(env: SeqEnvelope) -> JournalProducer:
    return JournalProducer(env.journal, env.producer)


# Reader actions, weighted likewise.
READS_KINDS = (
    ("read",) * 6
    + ("checkpoint_mid", "checkpoint_mid_crash") * 2
    + (
        "checkpoint",
        "crash",
        "crash_mid",
        "clean_restart",
    )
)


@dataclass(frozen=True)
class Read:
    kind: str
    journal: int
    steps: int


READS = st.builds(
    Read, st.sampled_from(READS_KINDS), st.integers(0, JOURNALS_MAX - 1), st.integers(1, 3)
)


class Consumer:
    """Reads the journals through a Sequencer, checkpointing and crashing as told.

    `output` is what the consumer's store holds: a crash rolls it back to the last checkpoint.
    Each entry is tagged with its drain: the messages dequeued after one queued envelope.
    """

    def __init__(self, world: World, ring_size: int, prune: bool) -> None:
        self.world = world
        self.ring_size = ring_size
        self.prune = prune
        self.seq = Sequencer(ring_size)
        self.pos = dict.fromkeys(world.journals, 0)
        self.output: list[tuple[int, SeqEnvelope]] = []
        self.drains = 0
        self.saved: tuple[SequencerCheckpoint, int] = (SequencerCheckpoint(), 0)
        self.cut: set[int] = set()  # Drains cut short by a crash back to a mid-dequeue checkpoint.
        self.resuming: set[JournalProducer] = set()  # ...and whose remainder comes later.
        self.resumed: set[int] = set()  # Drains that delivered such a remainder.

    def read(
        self, journal: str, at_step: int | None = None, action: Callable[[], None] | None = None
    ) -> bool:
        """Queue the next envelope of `journal` and drain; run `action` after `at_step` steps."""
        envs, i = self.world.journals[journal], self.pos[journal]
        if i == len(envs):
            return False
        self.pos[journal] = i + 1
        outcome = self.seq.queue_uncommitted(envs[i])
        event(f"outcome {outcome.value}")
        r = self.seq.replay_required
        assert (r is not None) == (outcome is QueueOutcome.ACK_COMMIT_REPLAY)
        if r is not None:
            replayed = self.world.journals[r.journal]
            self.seq.replay(e for e in replayed if r.begin <= e.begin and e.end <= r.end)

        self.drains += 1
        seq, steps = self.seq, 0
        if seq.step():
            jp = jp_of(envs[i])
            if jp in self.resuming:
                self.resuming.discard(jp)
                self.resumed.add(self.drains)
            while True:
                assert seq.dequeued is not None
                self.output.append((self.drains, seq.dequeued))
                steps += 1
                if steps == at_step and action is not None:
                    action()
                    if self.seq is not seq:
                        return True  # Crashed.
                if not seq.step():
                    break
        assert outcome.commits == (steps > 0)
        ring = seq._ring
        # The count of owned slots (commit_alone_run skips its eviction scan at zero) is exact.
        assert ring.occupied == sum(o is not None for o in ring.owners)
        return True

    def checkpoint(self) -> None:
        horizon = self.horizon() if self.prune else 0
        tracked = len(self.seq.checkpoint(0).producers)
        cp = self.seq.checkpoint(horizon)
        if len(cp.producers) < tracked:
            event("pruned producers")
        self.saved = (cp, len(self.output))

    def horizon(self) -> int:
        """The smallest horizon (the span back from each journal's newest producer state) that
        prunes no producer with envelopes still to be read.

        Pruning such a producer would make its late duplicates look new; pruning any other is
        safe, and the Sequencer must still keep those with a pending span.
        """
        current = self.seq.checkpoint(0)
        newest: dict[str, int] = {}
        for jp, state in current.producers.items():
            newest[jp.journal] = max(newest.get(jp.journal, 0), state.last_ack)
        spans = [
            newest[journal] - current.producers[jp].last_ack
            for journal, envs in self.world.journals.items()
            for jp in {jp_of(e) for e in envs if e.begin >= current.read_through.get(journal, 0)}
            if jp in current.producers
        ]
        return max([1, *spans])

    def crash(self) -> None:
        cp, kept = self.saved
        del self.output[kept:]
        event("restart")
        # A group the kept output ends partway through is cut short; its remainder is due.
        last = {jp_of(env): (drain, env) for drain, env in self.output}
        self.resuming = set()
        for jp, (drain, env) in last.items():
            # Not found means a message that never committed: check() will report it.
            group, i = self.world.where.get((env.journal, env.begin), ([], 0))
            if i + 1 < len(group):
                event("restart partway through an ACK's messages")
                self.cut.add(drain)
                self.resuming.add(jp)
        self.seq = Sequencer(self.ring_size, cp)
        for journal, envs in self.world.journals.items():
            offset = cp.read_through.get(journal, 0)
            self.pos[journal] = next(
                (i for i, e in enumerate(envs) if e.begin >= offset), len(envs)
            )

    def run(self, schedule: list[Read]) -> None:
        names = list(self.world.journals)
        for r in schedule:
            journal = names[r.journal % len(names)]
            if r.kind == "read":
                self.read(journal)
            elif r.kind == "checkpoint":
                self.checkpoint()
            elif r.kind == "checkpoint_mid":
                self.read(journal, r.steps, self.checkpoint)
            elif r.kind == "crash":
                self.crash()
            elif r.kind == "checkpoint_mid_crash":
                self.read(journal, r.steps, self.checkpoint)
                self.crash()
            elif r.kind == "crash_mid":
                self.read(journal, r.steps, self.crash)
            else:
                self.checkpoint()
                self.crash()  # Right after a checkpoint: nothing is lost.
        while any([self.read(j) for j in names]):
            pass


def check(world: World, consumer: Consumer) -> None:
    # Exactly the committed messages, each once, in per-producer order.
    by_jp: dict[JournalProducer, list[SeqEnvelope]] = {}
    for _, env in consumer.output:
        by_jp.setdefault(jp_of(env), []).append(env)
    expected = {jp: [e for g in groups for e in g] for jp, groups in world.expected.items()}
    assert by_jp == expected

    # Each drain is one ACK's messages as one run: all of them, unless a crash cut it short
    # (and its remainder then came as a drain of its own).
    runs: dict[int, list[SeqEnvelope]] = {}
    for drain, env in consumer.output:
        runs.setdefault(drain, []).append(env)
    for drain, run in runs.items():
        group, start = world.where[(run[0].journal, run[0].begin)]
        assert run == group[start : start + len(run)]
        assert start == 0 or drain in consumer.resumed
        assert start + len(run) == len(group) or drain in consumer.cut


def _seeded(test: Callable[..., None]) -> Callable[..., None]:
    value = os.environ.get("GAZETTE_TEST_SEED")
    return seed(int(value))(test) if value else test


@_seeded
@settings(max_examples=EXAMPLES, deadline=None)
@given(
    journals=st.integers(1, JOURNALS_MAX),
    producers=st.integers(1, PRODUCERS_MAX),
    ops=st.lists(OPS, min_size=OPS_MIN, max_size=OPS_MAX),
    ring_size=st.one_of(st.integers(1, 4), st.integers(1, 64), st.integers(1, RING_SIZE_MAX)),
    schedule=st.lists(READS, min_size=READS_MIN, max_size=READS_MAX),
    prune=st.booleans(),
)
def test_read_committed_is_exactly_once(
    journals: int,
    producers: int,
    ops: list[Op],
    ring_size: int,
    schedule: list[Read],
    prune: bool,
) -> None:
    world = build_world(journals, producers, ops)
    consumer = Consumer(world, ring_size, prune)
    consumer.run(schedule)
    check(world, consumer)
