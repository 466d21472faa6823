"""The Sequencer's ring of recently queued envelopes, linked per producer span (sans-IO).

The ring has a fixed number of slots, written in turn at `head`. Each envelope of a pending span
(a producer's CONTINUE_TXN messages, then the ACK or OUTSIDE_TXN message that commits them) is
written at the head and linked after the span's previous entry, so that a commit walks exactly
its own span's entries, however many other producers' entries lie between them. Writing the head
evicts the oldest entry: a span that loses its first entry so can no longer be served from the
ring, and the Sequencer replays it from the journal instead, whole: its other entries are freed
at once and it links no more (a transaction longer than the ring then keeps none of it alive).

A slot is freed as soon as its entry is walked past (delivered, or skipped by the commit), not
only when the head comes round: a delivered message is then not kept alive by the ring, which
matters to the garbage collector on a reader's hot path.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from gazette_consumer.sequencer.types import Sequenced

E = TypeVar("E", bound=Sequenced)


def invariant(condition: bool, what: str) -> None:
    # Not `assert`: these guard exactly-once delivery and must survive `python -O`.
    if not condition:
        raise AssertionError(f"sequencer invariant violated: {what}")


class Partial:
    """Sequencing state of one JournalProducer, and the ring entries of its pending span.

    A partial without a pending span (`begin` -1) links no ring entry.
    """

    __slots__ = (
        "begin",
        "long_spans",
        "max_clock",
        "min_clock",
        "presumed",
        "ring_start",
        "ring_stop",
        "unlinked",
    )

    def __init__(self, min_clock: int, begin: int) -> None:
        self.min_clock = min_clock  # Exclusive: clocks up to here are delivered or acked.
        self.max_clock = min_clock  # Inclusive: largest clock of the pending span.
        self.begin = begin  # Offset to replay the pending span from, or -1.
        self.ring_start = -1  # First ring index of the span's linked entries, or -1.
        self.ring_stop = -1  # Last ring index of the span's linked entries, or -1.
        # True while `min_clock` is only presumed (the producer was first seen mid-span, not
        # at an ACK): an older ACK then rolls back what was seen, and regresses nothing.
        self.presumed = False
        # True once a span of this producer outgrew the ring (lost its start): its next spans
        # are predicted to, and are not linked at all (their ACK replays them whole), until one
        # turns out shorter than the ring. Linking a ring's worth of a span only to lose it
        # kept those messages alive into the garbage collector's old generation.
        self.long_spans = False
        # Messages of the pending span not linked (at least, once it lost its start: the ring's
        # length), to tell whether a predicted long span was one.
        self.unlinked = 0

    def reset(self, clock: int) -> None:
        """Forget any pending span; `clock` becomes the last acknowledged clock."""
        self.min_clock = self.max_clock = clock
        self.begin = self.ring_start = self.ring_stop = -1
        self.presumed = False
        self.unlinked = 0


class SpanRing(Generic[E]):
    """`size` slots of envelopes, each linked into the span of the Partial that owns it.

    The lists are public to the Sequencer, whose hottest paths read them inline.
    """

    __slots__ = ("entries", "head", "links", "occupied", "owners")

    def __init__(self, size: int) -> None:
        self.entries: list[E | None] = [None] * size
        # The Partial whose span linked slot i (set with it), so that evicting the entry needs
        # no lookup; None for a free slot.
        self.owners: list[Partial | None] = [None] * size
        # links[i] is the next slot of the same span after slot i, or -1 (always -1 when free).
        self.links: list[int] = [-1] * size
        self.head = 0  # Next slot to write.
        # How many slots have an owner: with none, a reader's run of messages that commit
        # alone passes its slots without looking at them (Sequencer.commit_alone_run). Whoever
        # sets or clears an owner keeps it.
        self.occupied = 0

    def __len__(self) -> int:
        return len(self.entries)

    def evict_at_head(self) -> None:
        """Free the head slot, unlinking its entry from the span that still links it."""
        head = self.head
        partial = self.owners[head]
        if partial is None:
            return
        # Entries are evicted oldest first, so a span still linking this entry starts with it.
        # (Its owner is the only partial that can link it: one pruned or replaced since links
        # nothing, as a partial without a pending span links nothing.)
        if partial.ring_start == head:
            # The span loses its start: its ACK will replay it whole from the journal, so its
            # other entries are freed now and no more are linked (the Sequencer checks
            # `ring_start`). Keeping them would only hold a ring's worth of messages alive a
            # ring's length each, which the garbage collector scans, to save replaying them.
            entries, owners, links = self.entries, self.owners, self.links
            index, last = links[head], head
            while index != -1:
                invariant(owners[index] is partial, "a span links only its own entries")
                entries[index] = owners[index] = None
                last, following = index, links[index]
                links[index] = -1
                index = following
                self.occupied -= 1
            invariant(last == partial.ring_stop, "a span's last linked entry must end its chain")
            partial.ring_start = partial.ring_stop = -1
            partial.long_spans = True
            partial.unlinked = len(self.entries)  # It had more messages than that.
        self.entries[head] = None
        self.owners[head] = None
        self.links[head] = -1
        self.occupied -= 1

    def pass_slots(self, n: int) -> None:
        """Move the head `n` slots on, as writing an entry at each and freeing it again would:
        the entries there are evicted (oldest first), the slots left free."""
        owners, size, head = self.owners, len(self.entries), self.head
        if not self.occupied:  # No slot has an entry to evict: skip looking (most runs).
            self.head = (head + n) % size
            return
        while n:
            stop = min(size, head + n)
            if any(owners[head:stop]):  # Partials are always true; free slots are None.
                for index in range(head, stop):
                    if owners[index] is not None:
                        self.head = index
                        self.evict_at_head()
            n -= stop - head
            head = 0 if stop == size else stop
        self.head = head

    def add_at_head(self, env: E, partial: Partial) -> None:
        """Write `env` at the head (evicting what was there), linked last in `partial`'s span."""
        head = self.head
        if self.owners[head] is not None:
            self.evict_at_head()
        self.entries[head] = env
        self.owners[head] = partial
        self.occupied += 1
        if partial.ring_stop == -1:
            partial.ring_start = head
        else:
            self.links[partial.ring_stop] = head
        partial.ring_stop = head
        head += 1
        self.head = 0 if head == len(self.entries) else head

    def first(self, partial: Partial) -> E:
        """The first entry `partial`'s span still links (it must link one)."""
        env = self.entries[partial.ring_start]
        invariant(env is not None, "a linked ring entry is empty")
        assert env is not None  # For the type checker; checked just above.
        return env

    def next_committed(self, partial: Partial) -> tuple[E, bool]:
        """Unlink and return the next entry of `partial`'s committed span that is delivered,
        and whether it is the committing (last) one. Skipped on the way, and freed: messages
        with clocks the commit rolls back, and duplicates of what was already delivered."""
        entries, owners, links = self.entries, self.owners, self.links
        # A span links each slot at most once, so a longer walk means corrupted links.
        for _ in range(len(entries)):
            index = partial.ring_start
            invariant(index != -1, "ring ran out before the committing envelope")
            env = entries[index]
            invariant(env is not None, "a linked ring entry is empty")
            assert env is not None  # For the type checker; checked just above.
            partial.ring_start = links[index]
            entries[index] = owners[index] = None
            links[index] = -1
            self.occupied -= 1
            if partial.ring_start == -1:
                # The committing envelope was linked last, and commits regardless of the clock
                # filter: it was checked against min_clock when queued.
                return env, True
            if partial.min_clock < env.clock <= partial.max_clock:
                return env, False
        raise AssertionError("sequencer invariant violated: a span's ring links form a cycle")
