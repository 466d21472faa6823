"""Committed quorum entries into the journal's spool: what makes them readable.

Each member applies its own commit offset (never beyond: the core's `read_limit`) to its local
replica's Spool as an ordinary commit (the content, then the proposal `Spool.next()`), so the
fragment index, `Read`, the persister and the consumer framework see committed content only,
exactly as they see an all-replicas commit. Each commit carries the journal's registers as of
the content it applies (the log's, entry.py), so the spool's registers are the committed ones. Uncommitted entries, and truncation, stay inside
the quorum log. The spool is taken from the replica's slot for each batch and put back, so the
replica's own shutdown (which completes the current fragment for the persister) still works.

Fragments roll by the spool's roll policy for the journal's spec after each batch (by length,
or flush interval): members may roll at different entry boundaries, so their fragments differ
in extent but never in content, which the fragment index already handles (overlapping
fragments of one journal).

Restarts. A restarted broker's spool resumes from its data directory pending recovery; the
applier settles it as the journal's primary would (the store check of spool_settle.py: adopted,
or set aside and started over), since everything a member ever applied was committed and its
log file kept the commit index that covered it. Then it applies from the spool's end.

A spool behind the log's base (a follower given a Snapshot, or a member whose log compacted
entries it had not applied: the store holds them) rolls forward to the base, as Gazette's
catch-up roll does: the content before it is read from the store.

The store's progress (`report_stored`): every `stored_poll_interval_s` the contiguous end of the
persisted fragments in the replica's index, from the log's base on (`persisted_end`), is told
to the core (`QuorumNode.on_stored`), which compacts the log once it holds more than its
compaction fraction: without it a leader's log fills (`log_bytes_max`) and appends are refused.

The replica comes and goes apart from the node (journals.py: a broker the term register names
runs the node whether or not the journal is assigned to it, and from its start). `applied`
counts for one replica (`replica`): when the broker's replica is another one (created after the
node, or replacing one stopped meanwhile, whose spool starts from its own state), the count
starts again from that replica's spool, and the read barrier waits for the replica a Read is
served by. Committed content waits for a replica without a poll: the broker's resolver calls
`QuorumJournals.replica_started`, which wakes the applier (`replica_changed`), and the applier
makes a first pass as it starts (for a replica started before it). A replica that
stops while the applier waits for its spool (a durable spool not opened yet) releases the wait.

A leader without a replica here (a member the register names whose journal is not assigned
here, or not yet: journals.py) has no index to learn the store's progress from: it lists the
journal's stores itself, once per refresh interval of its spec, or its log never compacts and
appends are refused for good once it is full. Nor does it upload anything, and members complete
fragments as replicas (uploaded only after the persister's replica delay, 120 s) unless they
lead: while the leader is outside the assigned route, the route's primary completes them as the
leader would (`uploads_for_leader`), so that the store keeps up.

A spool ahead of the quorum commit (content this member cannot vouch for: a broker whose
quorum log was in memory, without a data directory) is not touched: `SpoolAheadError` is kept
on the applier and reported, and nothing more is applied until a later commit reaches it.

Any other failure (the store or the disk, a spool refusing a commit, a misbehaving
dependency, a bug) ends neither loop: only cancellation does, since a dead applier would hide
committed content from this broker's readers without an error, and a dead `report_stored`
would fill the leader's log. The failure is kept (`error` for applying, `stored_error` for
reporting), counted (`gazette_quorum_apply_errors_total{journal,member}`), logged at error
level with its traceback once per distinct error (not once per try), and the work is tried
again after an exponential backoff (`apply_retry_backoff_initial_s` doubling up to
`apply_retry_backoff_s_max`): a transient failure heals by itself (the error is cleared, and
said, once a try succeeds), a lasting one stays visible. Content a failed try appended to the
spool without committing it is rolled back by the next try, which applies it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from broker.fragment.index import (
    IndexedFragment,
    list_stores,
    refresh_interval_s,
    store_list_timeout_s_default,
)
from broker.fragment.spool import Spool
from broker.fragment.stores.registry import StoreRegistry
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.quorum_shell.node import QuorumNode
from broker.quorum_shell.registers import label_set_of
from broker.replica import Replica, SlotInvalidatedError

log = get_logger(__name__)

# Bytes applied to the spool in one commit (a batch of committed entries).
apply_batch_bytes_max = 4 << 20
# How often the fragment index's persisted end is told to the core (the index itself learns
# of uploads by its own refresh interval and this broker's persister).
stored_poll_interval_s = 1.0
# The wait before trying again after a failure: doubling from the first, up to the max.
apply_retry_backoff_initial_s = 0.05
apply_retry_backoff_s_max = 5.0


def apply_retry_delay_s(failures: int) -> float:
    """The wait before the next try after `failures` (>= 1) consecutive failed ones."""
    return min(apply_retry_backoff_initial_s * 2.0 ** (failures - 1), apply_retry_backoff_s_max)


def persisted_end(fragments: Iterable[IndexedFragment], floor: int) -> int:
    """How far the store holds the journal without a gap from `floor` (the log's base, below
    which it holds everything): the end of the persisted fragments chained from there."""
    end = floor
    for fragment in sorted((f for f in fragments if f.file is None), key=lambda f: f.begin):
        if fragment.begin > end:
            break
        end = max(end, fragment.end)
    return end


class SpoolAheadError(Exception):
    """The local spool holds content beyond this member's quorum commit offset."""


class RecoveryNotSettledError(Exception):
    """The spool's recovered state could not be settled yet (no store listing in time): the
    applier tries again (each try waits up to the replica's recovery_wait_s)."""


class CommitApplier:
    def __init__(
        self,
        node: QuorumNode,
        replica_of: Callable[[str], Replica | None],
        spec_of: Callable[[str], pb.JournalSpec | None],
        clock: Callable[[], float],
        *,
        stores: StoreRegistry | None = None,
    ) -> None:
        self._node = node
        self._replica_of = replica_of
        self._spec_of = spec_of
        self._clock = clock
        self._stores = stores  # listed by a leader without a replica (the module docstring)
        self._listed_at: float | None = None  # when (loop time) they were listed last
        # The replica and term the persister was last told this member leads (uploads) in.
        self._expedited: tuple[Replica, int] | None = None
        # Whether this member completes fragments as the leader does (uploaded at once)
        # though it does not lead: the leader has no replica here to upload from (journals.py
        # sets it: the leader is outside the assigned route, and this broker is its primary).
        self.uploads_for_leader = False
        # How far the journal is applied to `replica`'s spool (see the module docstring).
        self.applied = 0
        self.replica: Replica | None = None
        # The last failure to apply committed content (None once a try succeeds) and the
        # last failure to report the store's progress: see the module docstring.
        self.error: Exception | None = None
        self.stored_error: Exception | None = None
        self.changed = asyncio.Event()  # set after each try, applied or failed (observers, tests)

    def replica_changed(self) -> None:
        """This broker started a replica of the journal: apply to it what is committed."""
        self._node.commit_changed.set()

    def applied_to(self, replica: Replica) -> int:
        """How far the journal is applied to `replica`'s spool (-1: not applied to it yet)."""
        return self.applied if replica is self.replica else -1

    async def report_stored(self) -> None:
        """Tell the core how far the store holds the journal (see the module docstring)."""
        told, failures = -1, 0
        while True:
            wait_s = stored_poll_interval_s
            if failures:
                wait_s = max(wait_s, apply_retry_delay_s(failures))
            await asyncio.sleep(wait_s)
            try:
                told = await self._report_stored(told)
            except Exception as err:  # kept, counted, logged: see the docstring
                failures += 1
                self._failed("store progress not reported", err, self.stored_error)
                self.stored_error = err
                continue
            if self.stored_error is not None:
                log.info("quorum: store progress reported again", journal=self._node.journal)
            failures, self.stored_error = 0, None

    async def _report_stored(self, told: int) -> int:
        node = self._node
        if node.failure is not None:
            return told
        replica = self._replica_of(node.journal)
        if replica is not None:
            self._expedite_as_leader(replica)
            # Not `snapshot()`: a local fragment wider than stored ones drops them there
            # (found by audit: a member re-applying its log from the base rolled one fragment
            # over content the store held, and the leader's log, never compacted, filled).
            fragments: Iterable[IndexedFragment] = replica.index.persisted_fragments()
        elif node.is_leader:
            fragments = await self._listed()
        else:
            return told  # A follower learns it from its leader.
        end = persisted_end(fragments, node.member.log.base.end)
        if end > told:
            node.on_stored(end)
            return end
        return told

    def _expedite_as_leader(self, replica: Replica) -> None:
        """Once per term this member leads (or uploads for the leader) with `replica`: what
        its spool completed before, as a follower's (held for the persister's replica delay,
        120 s), is uploaded now, as an all-replicas primary's pulse does
        (`Persister.expedite`). The store lacks it when the former leader died before its own
        upload (or set its copy aside at a restart): until it is stored, the log cannot
        compact past it, and a full log refuses every append. Found by audit (2026-11-30):
        members restarted under chaos re-applied their logs from the base as followers, then
        led; the log stayed full for as long as restarts kept resetting that delay."""
        node = self._node
        if not (node.is_leader or self.uploads_for_leader):
            self._expedited = None
            return
        key = (replica, node.member.term)
        if self._expedited == key:
            return
        self._expedited = key
        # The broker's Persister has it; a test's sink of completed spools may not.
        expedite = getattr(replica.env.persister, "expedite", None)
        if expedite is not None:
            made_due = expedite(node.journal)
            if made_due:
                log.info(
                    "quorum: leading; fragments completed as a follower's uploaded now",
                    journal=node.journal,
                    fragments=made_due,
                )

    async def _listed(self) -> list[IndexedFragment]:
        """The journal's fragments in its stores, listed at most once per refresh interval of
        its spec (as a replica's index is); none between listings."""
        spec = self._spec_of(self._node.journal)
        if self._stores is None or spec is None or not spec.fragment.stores:
            return []
        now = asyncio.get_running_loop().time()
        if self._listed_at is not None and now < self._listed_at + refresh_interval_s(spec):
            return []
        self._listed_at = now
        async with asyncio.timeout(store_list_timeout_s_default):
            listing = await list_stores(self._stores, spec.name, list(spec.fragment.stores))
        return [IndexedFragment(f) for f in listing.fragments]

    async def run(self) -> None:
        node, failures = self._node, 0
        # A first pass without waiting: the broker's replica may have started before this
        # applier existed (its replica_started found none to wake), and with nothing committed
        # no commit comes to bring the applier to it (the read barrier waits for that).
        node.commit_changed.set()
        while True:
            await node.commit_changed.wait()  # a commit, or a replica (replica_changed)
            node.commit_changed.clear()
            try:
                await self._apply_committed()
            except (SpoolAheadError, RecoveryNotSettledError) as err:
                # Waits for a later commit, or tries again at once (each try itself waits).
                self._failed("committed content not applied", err, self.error)
                self.error = err
            except Exception as err:  # kept, counted, logged: see the docstring
                failures += 1
                self._failed("committed content not applied", err, self.error)
                self.error = err
                self.changed.set()
                await asyncio.sleep(apply_retry_delay_s(failures))
                node.commit_changed.set()  # Try again (a later commit may have come too).
                continue
            else:
                if self.error is not None:
                    log.info("quorum: committed content applied again", journal=node.journal)
                failures, self.error = 0, None
            self.changed.set()

    async def _apply_committed(self) -> None:
        """Apply what is committed beyond `applied`, if this broker has the replica."""
        node = self._node
        replica = self._replica_of(node.journal)
        if replica is not self.replica:
            # Another replica (or none): its spool holds what it holds, learned by applying.
            self.replica, self.applied = replica, 0
        if replica is None or node.commit_offset <= self.applied:
            return  # A later replica_changed, or commit, brings the applier back.
        stopped = asyncio.Event()
        forget = replica.on_stop(stopped.set)
        try:
            await self._apply_to(replica, stopped)
        finally:
            forget()

    async def _apply_to(self, replica: Replica, stopped: asyncio.Event) -> None:
        node = self._node
        try:
            # Released if the replica stops first: its spool may never be handed over (a
            # durable one not opened yet), and the next replica wakes the applier again.
            spool = await replica.spool_slot.take(stopped)
        except SlotInvalidatedError:
            return
        try:
            if spool.recovery_pending and not await replica.settle_recovery(spool, None, stopped):
                if stopped.is_set():
                    return
                node.commit_changed.set()  # Try again.
                raise RecoveryNotSettledError(f"{node.journal}: no store listing in time")
            self._apply(spool)
        finally:
            replica.spool_slot.put(spool)

    def _failed(self, what: str, err: Exception, before: Exception | None) -> None:
        """Count a failure; log it (with its traceback) unless it repeats the one before."""
        self._node.metrics.apply_error()
        if before is not None and (type(before), str(before)) == (type(err), str(err)):
            return
        log.error(
            f"quorum: {what}; trying again",
            journal=self._node.journal,
            error=f"{type(err).__name__}: {err}",
            exc_info=err,
        )

    def _apply(self, spool: Spool) -> None:
        node = self._node
        uploads = node.is_leader or self.uploads_for_leader
        if spool.delta:
            # Content of a try that failed before its commit: dropped, or the next batch
            # would follow it and be committed at offsets past the content's own.
            spool.must_apply(
                pb.ReplicateRequest(proposal=spool.fragment, registers=spool.registers),
                primary=uploads,
            )
        base = node.member.log.base.end
        if spool.fragment.end < base:
            # The log no longer holds what the spool lacks; the store does: roll forward.
            spool.must_apply(
                pb.ReplicateRequest(
                    proposal=pb.Fragment(
                        journal=node.journal,
                        begin=base,
                        end=base,
                        compression_codec=spool.fragment.compression_codec,
                        backing_store=spool.fragment.backing_store,
                    ),
                    registers=label_set_of(node.member.log.base.registers),
                ),
                primary=uploads,
            )
        start, commit = spool.fragment.end, node.commit_offset
        if start > commit:
            raise SpoolAheadError(
                f"{node.journal}: spool ends at {start}, beyond the quorum commit {commit}"
            )
        while start < commit:
            end = min(commit, start + apply_batch_bytes_max)
            log = node.member.log
            spool.apply_content(log.read(start, end), spool.delta)
            registers = label_set_of(log.registers_at(log.index_covering(end)))
            spool.must_apply(
                pb.ReplicateRequest(proposal=spool.next(), registers=registers),
                primary=uploads,
            )
            start = end
        self.applied = start
        spec = self._spec_of(node.journal)
        if spec is not None:
            proposal = spool.roll_proposal(spec.fragment, self._clock())
            if proposal != spool.fragment:
                spool.must_apply(
                    pb.ReplicateRequest(proposal=proposal, registers=spool.registers),
                    primary=uploads,
                )
