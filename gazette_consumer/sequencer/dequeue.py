"""Dequeuing a committed sequence, serving it from a replay, and checkpoints (sans-IO).

An emission (`Emission`) is started by a queued envelope that commits; `dequeue` (or `step`)
returns its envelopes one by one from the ring or from the replay the caller supplies
(`replay`), `dequeue_all` and `dequeue_replayed` a run at a time. `checkpoint` snapshots the
read-through offsets and producer states; `has_pending` tells a consumer whether an ACK is
worth waiting for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from itertools import islice

from gazette_consumer.sequencer.ring import invariant
from gazette_consumer.sequencer.state import (
    E,
    Emission,
    ReplayMismatchError,
    SequencerState,
    SequencerStateError,
)
from gazette_consumer.sequencer.types import (
    JournalProducer,
    ProducerState,
    ReplayRequired,
    SequencerCheckpoint,
    prune_bounds,
)


class SequencerDequeuing(SequencerState[E]):
    """Dequeuing, replays and checkpoints (see the module docstring)."""

    # -- dequeuing -----------------------------------------------------------------------------

    @property
    def emitting(self) -> bool:
        """True while committed envelopes may be waiting to be dequeued (an emission is in
        progress): `dequeue()` must come before anything queued later."""
        return self._emit is not None

    @property
    def replay_required(self) -> ReplayRequired | None:
        """The range the caller must `replay()` before `step()`, or None."""
        return None if self._emit is None else self._emit.replay_required

    def replay(self, envelopes: Iterable[E]) -> None:
        """Supply the envelopes of the `replay_required` range, in journal order.

        They are read lazily by `step()`, so a reader over the journal may be passed directly.
        The whole range must be supplied: envelopes outside it raise `ReplayMismatchError`, but
        a range cut short cannot be told from one that holds fewer messages.
        """
        emit = self._emit
        if emit is None or emit.replay_required is None:
            raise SequencerStateError("replay: no replay is required")
        emit.replay_range, emit.replay_required = emit.replay_required, None
        emit.replay = iter(envelopes)

    @property
    def dequeued(self) -> E | None:
        """The committed envelope the last `step()` returned True for, else None."""
        return self._dequeued

    def step(self) -> bool:
        """Advance to the next committed envelope (`dequeued`); False once none remain.

        The envelope becomes consumed as far as `checkpoint()` is concerned.
        """
        return self.dequeue() is not None

    def dequeue(self) -> E | None:
        """`step()`, returning the envelope stepped to (`dequeued`), or None for False."""
        emit = self._emit
        if emit is None or emit.done:
            self._emit = None
            self._dequeued = None
            return None
        if emit.replay_required is not None:
            r = emit.replay_required
            raise SequencerStateError(
                f"step: replay() {r.journal} [{r.begin}, {r.end}) first, as replay_required asks"
            )
        partial = emit.partial
        if emit.replay is not None:
            env, final = self._next_committed(emit)
        else:
            ring = self._ring
            index = partial.ring_start
            following = ring.links[index] if index != -1 else -1
            env_or_none = ring.entries[index] if following != -1 else None
            if env_or_none is not None and (
                partial.min_clock < env_or_none.clock <= partial.max_clock
            ):
                # The commonest step, a message inside the span: SpanRing.next_committed's
                # first turn, inlined (it runs for every transactional message read).
                partial.ring_start = following
                ring.entries[index] = ring.owners[index] = None
                ring.links[index] = -1
                ring.occupied -= 1
                partial.min_clock = env_or_none.clock
                partial.begin = env_or_none.end
                self._dequeued = env_or_none
                return env_or_none
            env, final = ring.next_committed(partial)
        if final:
            if emit.tracked:
                partial.reset(env.clock)
            # Only now step past the committing envelope; see _apply.
            self._read_through[env.journal] = env.end
            emit.done = True
        else:
            # Tighten the state to what's left, so a checkpoint taken now resumes after `env`.
            partial.min_clock = env.clock
            partial.begin = env.end
        self._dequeued = env
        return env

    def dequeue_all(self) -> list[E]:
        """Every envelope `dequeue()` would return, in order, until the emission in progress
        ends (its committing envelope last: the ACK, or a message that commits alone), leaving
        the Sequencer as those calls and the one returning None after them would (`dequeued`
        None); what a reader saves per transactional message.
        Empty, changing nothing, when there is no emission, or it is served by a replay (use
        `dequeue()` then)."""
        emit = self._emit
        if emit is None or emit.done or emit.replay is not None or emit.replay_required:
            return []
        partial, ring = emit.partial, self._ring
        entries, owners, links = ring.entries, ring.owners, ring.links
        min_clock, max_clock = partial.min_clock, partial.max_clock
        out: list[E] = []
        index, freed = partial.ring_start, 0
        # SpanRing.next_committed, all turns in one loop: delivered are the committing
        # envelope, linked last, and the clocks the commit covers, each past the one before.
        for _ in range(len(entries)):  # A span links each slot at most once.
            # SpanRing.next_committed's invariants, as inline tests (checked per message).
            if index == -1:
                invariant(False, "ring ran out before the committing envelope")
            env = entries[index]
            if env is None:
                invariant(False, "a linked ring entry is empty")
            assert env is not None  # For the type checker; checked just above.
            following = links[index]
            entries[index] = owners[index] = None
            links[index] = -1
            freed += 1
            if following == -1:
                out.append(env)
                break
            if min_clock < env.clock <= max_clock:
                out.append(env)
                min_clock = env.clock
            index = following
        else:
            raise AssertionError("sequencer invariant violated: a span's ring links form a cycle")
        ring.occupied -= freed
        partial.ring_start = -1
        if emit.tracked:
            partial.reset(env.clock)
        self._read_through[env.journal] = env.end
        # And the call after them, which returns None: the emission is over.
        self._emit = self._dequeued = None
        return out

    def dequeue_replayed(self, limit: int) -> list[E]:
        """The envelopes `dequeue()` would return, in order, while the emission in progress
        is served by its replay, taking `limit` envelopes at most from the replay iterator,
        in one call: never the committing one (it is the ring's), so the emission goes on
        (`dequeue()` returns what follows). Leaves the Sequencer as those `dequeue()` calls
        would (`dequeued` the last returned); with an iterator that ends within `limit`, as
        the first `dequeue()` to find it ended would, up to the ring's part. Empty, changing
        nothing, if no replay serves the emission (or `replay()` is due first). What a reader
        saves per replayed message: a transaction longer than the ring is replayed whole."""
        emit = self._emit
        if emit is None or emit.done or emit.replay is None or limit < 1:
            return []
        partial, producer, replay = emit.partial, emit.producer, emit.replay
        min_clock, max_clock = partial.min_clock, partial.max_clock
        # A replay that can hand over a run at once (read_iter's `Replay.take`) does, rather
        # than one `__next__` (a Python call) per envelope.
        take = getattr(replay, "take", None)
        envs: list[E] = take(limit) if take is not None else list(islice(replay, limit))
        r = emit.replay_range
        assert r is not None  # Set together with emit.replay.
        journal, lowest, highest = r.journal, r.begin, r.end
        out: list[E] = []
        if envs and getattr(replay, "sequenced", False):
            # A replay that yields only its producer's envelopes, clocks and offsets rising
            # (read_iter's `Replay`): the run is what the checks below keep if its ends pass
            # them, so they are checked at its ends, not per envelope.
            first, last = envs[0], envs[-1]
            if (
                min_clock < first.clock
                and last.clock <= max_clock
                and lowest <= first.begin
                and last.end <= highest
                and first.journal == journal
                and last.journal == journal
                and (first.producer is producer or first.producer == producer)
            ):
                out = envs
        for env in envs if not out else ():
            if env.begin < lowest or env.end > highest or env.journal != journal:
                self._check_replayed(emit, env)  # Raises ReplayMismatchError, naming why.
            # As _next_committed: other producers' messages, duplicates and clocks the commit
            # rolls back are skipped, and zero clocks (min_clock is never negative).
            if min_clock < env.clock <= max_clock and (
                env.producer is producer or env.producer == producer
            ):
                out.append(env)
                min_clock = env.clock
        if len(envs) < limit:
            emit.replay = None  # Ended: the ring's part follows.
        if out:
            last = out[-1]
            partial.min_clock, partial.begin = last.clock, last.end
            self._dequeued = last
        return out

    def read_through(self, journal: str) -> int:
        """The offset of `journal` through which envelopes were queued and stepped past (what
        `checkpoint()` reports for it; 0 if none was)."""
        return self._read_through.get(journal, 0)

    def _next_committed(self, emit: Emission[E]) -> tuple[E, bool]:
        """The next envelope to deliver, and whether it is the committing (last) one."""
        partial = emit.partial
        while emit.replay is not None:
            env = next(emit.replay, None)
            if env is None:
                emit.replay = None  # Continue with the part the ring still holds.
                break
            self._check_replayed(emit, env)
            # A replayed range holds other producers' messages, duplicates and messages outside
            # the committed clock range; zero-clock ones were delivered when first read.
            if env.producer != emit.producer or env.clock == 0:
                continue
            if partial.min_clock < env.clock <= partial.max_clock:
                return env, False

        return self._ring.next_committed(partial)

    @staticmethod
    def _check_replayed(emit: Emission[E], env: E) -> None:
        r = emit.replay_range
        assert r is not None  # Set together with emit.replay.
        if env.journal != r.journal:
            raise ReplayMismatchError(
                f"replayed envelope.journal: expected {r.journal} (got {env.journal})"
            )
        if env.begin < r.begin or env.end > r.end:
            raise ReplayMismatchError(
                f"replayed envelope [{env.begin}, {env.end}): outside the required range "
                f"[{r.begin}, {r.end}) of {r.journal}"
            )

    # -- checkpoints ---------------------------------------------------------------------------

    def checkpoint(
        self,
        horizon: int = 0,
        *,
        keep: tuple[str, bytes] | None = None,
        keep_all: AbstractSet[tuple[str, bytes]] = frozenset(),
    ) -> SequencerCheckpoint:
        """Snapshot read-through offsets and producer states, to construct a Sequencer from.

        Idle producers are pruned first, their state would otherwise grow without bound: as
        Gazette's Sequencer.Checkpoint(pruneHorizon) does, a producer with no pending span is
        pruned if its last ACK is more than `horizon` (a span of clock units:
        `clock.clock_span`; 0 prunes nothing) older than the newest producer state of its
        journal (`prune_bounds`). Measured against the journal's own clocks, not the wall
        clock: a reader catching up on old history forgets no producer that is still writing.
        Should a pruned producer's duplicates be read later, they are delivered again, so the
        horizon must comfortably exceed how long a producer may go quiet while its journal is
        written by others. `keep` names a (journal, producer) never pruned: a reader holding
        messages `commit_alone_run` delivered ahead of its caller accounts for that producer
        itself (`keep_all`: those of `commit_alone_mixed`).
        """
        bounds = prune_bounds(((j, p.min_clock) for (j, _), p in self._partials.items()), horizon)
        self.prune(bounds, keep_all | ({keep} if keep is not None else set()))
        return SequencerCheckpoint(
            read_through=self._read_through,
            producers={
                JournalProducer(journal, producer): ProducerState(p.min_clock, p.begin)
                for (journal, producer), p in self._partials.items()
            },
        )

    def prune(self, bounds: Mapping[str, int], keep: AbstractSet[tuple[str, bytes]]) -> None:
        """Forget producers with no pending span whose last ACK is below their journal's bound
        (`types.prune_bounds`), but for those of `keep`."""
        if not bounds:
            return
        stale = [
            key
            for key, p in self._partials.items()
            if p.begin == -1 and p.min_clock < bounds.get(key[0], 0) and key not in keep
        ]
        for key in stale:
            del self._partials[key]

    def pending_begin(self, journal: str, at_least: int = 0) -> int | None:
        """The offset at which the earliest pending span of `journal` that began at or after
        `at_least` began (a replay of it reads from there), or None if there is none."""
        at_least = max(at_least, 0)  # A partial without a pending span has begin -1.
        begins = [
            p.begin for (j, _), p in self._partials.items() if p.begin >= at_least and j == journal
        ]
        return min(begins, default=None)

    def has_pending(self, since: Mapping[str, int]) -> bool:
        """True if a pending span began at or after the given per-journal offsets.

        Consumers pass the offsets of their previous checkpoint: a span begun since hints that
        its ACK is coming soon, and is worth waiting for before committing a transaction.
        """
        return any(
            p.begin != -1 and p.begin >= since.get(journal, 0)
            for (journal, _), p in self._partials.items()
        )
