"""A journal replica: the per-journal state a broker keeps while it is assigned the journal.

One Replica exists per journal assigned to this broker (the resolver creates and stops them as
assignments come and go). It owns:

- the **Spool**, the replica's transactional memory of the journal (see fragment/spool.py);
- the **Pipeline** slot, holding the primary's replication pipeline (or None when none is built);
- the **FragmentIndex** of local and persisted fragments that reads are served from.

Ownership is a value handed over. The spool and the pipeline each sit in a one-slot hand-off
(`Slot`, an ``asyncio.Queue(maxsize=1)``): whoever took the value owns it, exclusively, until it
puts it back. This is what makes appends serializable. A Replicate RPC from the primary holds the
spool for the whole life of its stream; an append holds the pipeline (which holds the primary's
own spool) while it streams content. A synchronised pipeline is therefore a distributed lock over
the journal: every replica's spool is owned by the one primary's streams.

Taking a value is always raced against the *invalidation* of the resolution that led there (the
journal's assignments changed, or the replica is stopping): a request must not sit on a slot for
a replica whose route it no longer agrees with.

Daemons, all in the replica's one TaskGroup (a failing daemon fails the replica, and through the
resolver the broker: loud, never silent):

- *refresh*: lists the journal's fragment stores every ``refresh_interval`` and replaces the
  index's remote fragments; the first listing gates appends (see append_fsm).
- *pulse*: on the primary, a zero-byte append every ``pulse_interval_s`` and whenever the route
  changes, and soon again (bounded back-off) after one that failed. It (re)synchronises the
  pipeline, advertises the route in the assignments once every replica agrees, and rolls
  fragments whose flush interval has passed, so that consistency is re-established and content
  persisted without client traffic.

Stopping rolls the spool forward, completing its current fragment so that the persister stores
it, then releases everything.

Durable spools (a broker with a data directory, fragment/spool_dir.py). A replica takes what the
broker recovered of its journal, if anything, and resumes its spool from it, *pending*: the
first to take the spool to synchronise calls `settle_recovery` (fragment/spool_settle.py),
which adopts the recovered content or sets it aside. The spool is opened by `serve`, once no
other replica of the journal in this process holds its files (the resolver may start a new
replica while the previous one still stops); its slot is empty until then. A replica that
stops before settling gives
the recovered state back untouched; one that stops after leaves its final (empty) spool state
for the journal's next replica on this broker, exactly as a restart would find it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from broker.append_rate import TokenBucket
from broker.fragment.index import FragmentIndex, IndexRefresher
from broker.fragment.spool import CompletedSpool, LocalFragment, Spool
from broker.fragment.spool_dir import RecoveredJournal, SpoolDir
from broker.fragment.spool_file import SpoolFile
from broker.fragment.spool_named import JournalFiles
from broker.fragment.spool_settle import RecoverySettler
from broker.fragment.spool_types import RecoveredSpool
from broker.fragment.stores.registry import StoreRegistry
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.slot import Slot as Slot
from broker.slot import SlotInvalidatedError as SlotInvalidatedError
from broker.slot import SlotStateError as SlotStateError

if TYPE_CHECKING:
    from broker.pipeline import Pipeline

log = get_logger(__name__)


# How long a stopping replica waits for an append to return its pipeline, and for a Replicate
# stream to return its spool. Both watch for invalidation and give them back promptly; a peer
# whose primary vanished without closing its stream is what this bound is for.
shutdown_wait_s_default = 10.0
# How long settling a recovered spool (fragment/spool_settle.py) waits for the replica's first
# store listing; the append or Replicate stream that wanted the spool then fails, and retries.
recovery_wait_s_default = 30.0
# A pulse is a zero-byte append; it may wait this long before it is abandoned (and retried at
# the next interval). Gazette uses its pulse interval for both.
pulse_interval_s_default = 60.0
# A pulse that failed (a peer restarting, a route the peers do not agree on yet) is retried
# after a back-off doubling from the initial value up to the maximum (never past the interval),
# rather than at the next interval as in Gazette: until it succeeds, the journal's route is not
# advertised, and the allocator cannot finish moving it (nor a drained broker exit).
pulse_retry_backoff_initial_s = 0.2
pulse_retry_backoff_max_s = 5.0


class PulseResult(NamedTuple):
    """What one pulse did: whether it needs no retry (it committed, or this broker is not the
    journal's primary), and the event signalling that the resolution it used was invalidated
    (the route changed: pulse again at once), if it got that far."""

    ok: bool
    invalidated: asyncio.Event | None
    # It committed: this broker is the journal's primary, its pipeline in sync.
    committed: bool = False


def pulse_retry_delay_s(failures: int, interval_s: float) -> float:
    """The wait before the next pulse after ``failures`` consecutive failed ones."""
    if failures <= 0:
        return interval_s
    backoff = pulse_retry_backoff_initial_s * 2.0 ** (failures - 1)
    return min(backoff, pulse_retry_backoff_max_s, interval_s)


async def wait_first(events: Sequence[asyncio.Event], timeout_s: float | None) -> bool:
    """Wait until any of ``events`` is set (True) or ``timeout_s`` passes (False)."""
    if any(e.is_set() for e in events):
        return True
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        done, _ = await asyncio.wait(
            waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        return bool(done)
    finally:
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


# --- What a replica needs from its collaborators ------------------------------------------------


class CompletedSpoolSink(Protocol):
    """Takes completed spools, files included, to persist them (fragment/persister.py)."""

    def on_complete(self, completed: CompletedSpool) -> None: ...


@dataclass(frozen=True)
class ReplicaEnv:
    """Everything a replica needs from its broker, injected so tests can control it."""

    # The journal's current spec (None once the journal is deleted).
    lookup_spec: Callable[[str], pb.JournalSpec | None]
    new_spool_file: Callable[[], SpoolFile]
    stores: StoreRegistry | None
    persister: CompletedSpoolSink | None
    # One pulse of the journal: a zero-byte append (see PulseResult).
    pulse: Callable[[str], Awaitable[PulseResult]] | None
    clock: Callable[[], float]
    pulse_interval_s: float = pulse_interval_s_default
    shutdown_wait_s: float = shutdown_wait_s_default
    # Durable spools (None: spools are scratch files or memory, lost with the process).
    spool_dir: SpoolDir | None = None
    recovery_wait_s: float = recovery_wait_s_default


class _SpoolObserver:
    """Routes spool events: commits to the index (readers see them), completions to the
    persister. Without a persister a completed fragment stays readable from its local file
    (the index holds it) until the replica goes; only the compressed copy is released."""

    def __init__(self, index: FragmentIndex, persister: CompletedSpoolSink | None) -> None:
        self._index = index
        self._persister = persister

    def on_commit(self, fragment: LocalFragment) -> None:
        self._index.spool_commit(fragment)

    def on_complete(self, completed: CompletedSpool) -> None:
        if self._persister is not None:
            self._persister.on_complete(completed)
        elif completed.compressed_file is not None:
            completed.compressed_file.close()


class Replica:
    """See the module docstring."""

    def __init__(self, journal: str, env: ReplicaEnv) -> None:
        self.journal = journal
        self.env = env
        self.index = FragmentIndex(journal, clock=env.clock)
        self.recovery: RecoverySettler | None = None
        self._files: JournalFiles | None = None
        # A durable spool is opened by serve(), once no other replica of this journal in this
        # process holds its files (the resolver starts a new replica while the previous one
        # may still be stopping); until then its slot is empty and takers wait.
        self._spool_opened = env.spool_dir is None
        self._claimed = False
        # Finishes a spool given back after the shutdown wait (see `_shut_down`).
        self._late_spool: asyncio.Future[None] | None = None
        self.spool_slot: Slot[Spool] = (
            Slot(f"{journal}: spool", self._new_spool(None))
            if env.spool_dir is None
            else Slot.empty(f"{journal}: spool")
        )
        self.pipeline_slot: Slot[Pipeline | None] = Slot(f"{journal}: pipeline", None)
        # The route of the last pipeline that synchronised: a new pipeline of another route
        # starts a new fragment (see append_fsm).
        self.synced_route: pb.Route | None = None
        # The journal's maximum append rate, enforced while this broker is its primary: one
        # bucket for all appends of the journal (see append_rate.py).
        self.append_rate = TokenBucket()
        self._stopping = asyncio.Event()
        self._stopped = asyncio.Event()
        self._stop_callbacks: set[Callable[[], None]] = set()
        self._tg: asyncio.TaskGroup | None = None

    def __repr__(self) -> str:
        return f"Replica<{self.journal}>"

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self) -> None:
        """Begin shutting down (the resolver also invalidates the replica's resolutions)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        for callback in list(self._stop_callbacks):
            callback()

    def on_stop(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (synchronously) when the replica begins stopping; at once if it
        already has. Returns the function that unregisters it."""
        if self._stopping.is_set():
            callback()
        self._stop_callbacks.add(callback)
        return lambda: self._stop_callbacks.discard(callback)

    def _new_spool(self, recovered: RecoveredJournal | None) -> Spool:
        return Spool(
            self.journal,
            _SpoolObserver(self.index, self.env.persister),
            new_file=self.env.new_spool_file,
            files=self._files,
            recovered=recovered.spool if recovered is not None else None,
            clock=self.env.clock,
        )

    async def _open_durable_spool(self, spool_dir: SpoolDir) -> None:
        """Take this journal's spool files (waiting for a previous replica of it to let go),
        resume the spool from what was recovered or left there, and hand it to the slot."""
        if not await spool_dir.claim(self.journal, self._stopping):
            return
        self._claimed = True
        recovered = spool_dir.take(self.journal)
        if recovered is not None:
            self._files = recovered.files
            self.recovery = RecoverySettler(recovered, spool_dir, self.index, self.env.persister)
        else:
            self._files = spool_dir.journal_files(self.journal)
        self.spool_slot.put(self._new_spool(recovered))
        self._spool_opened = True

    async def settle_recovery(
        self, spool: Spool, proposal: pb.Fragment | None, invalidated: asyncio.Event
    ) -> bool:
        """Settle the spool's recovered state, if it has one pending, as the primary (proposal
        None) or as a replica whose primary proposes `proposal` first. The caller owns the
        spool. False: not settled (no store listing in time, or `invalidated`)."""
        if self.recovery is None or not spool.recovery_pending:
            return True
        return await self.recovery.settle(
            spool, proposal, invalidated=invalidated, wait_s=self.env.recovery_wait_s
        )

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> bool:
        """Run ``coro`` in the replica's TaskGroup (e.g. the drain of a torn-down pipeline).
        Returns False, closing ``coro`` unrun, if the replica is not running."""
        if self._tg is None:
            coro.close()
            return False
        self._tg.create_task(coro)
        return True

    async def serve(self) -> None:
        """Run the replica's daemons until ``stop()``, then shut down."""
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                daemons = [tg.create_task(self._refresh_daemon())]
                if self.env.spool_dir is not None:
                    daemons.append(tg.create_task(self._open_durable_spool(self.env.spool_dir)))
                if self.env.pulse is not None:
                    daemons.append(tg.create_task(self._pulse_daemon(self.env.pulse)))
                await self._stopping.wait()
                for task in daemons:
                    task.cancel()
                await self._shut_down()
        finally:
            self._tg = None
            if self._claimed and self.env.spool_dir is not None and self._late_spool is None:
                self.env.spool_dir.release(self.journal)
            self._stopped.set()

    async def _shut_down(self) -> None:
        wait_s = self.env.shutdown_wait_s
        try:
            async with asyncio.timeout(wait_s):
                pln = await self.pipeline_slot.take(asyncio.Event())
        except TimeoutError:
            log.warning("replica stopping: pipeline not returned in time", journal=self.journal)
        else:
            if pln is not None:
                pln.begin_shutdown()
                await pln.finish_shutdown(expect_err=False)
        if not self._spool_opened:
            self.index.close(close_files=False)  # Stopped before its spool files were free.
            return
        try:
            async with asyncio.timeout(wait_s):
                spool = await self.spool_slot.take(asyncio.Event())
        except TimeoutError:
            log.warning("replica stopping: spool not returned in time", journal=self.journal)
            # Closed all the same: blocking reads waiting on it end (IndexClosedError, which
            # they answer by resolving again) rather than wait for ever on a replica gone.
            self.index.close(close_files=False)
            if self._claimed and self.env.spool_dir is not None:
                # Its holder still writes the spool's files: they stay claimed (no next
                # replica of the journal on this broker opens them, and overwrites committed
                # content at offset 0) until it gives the spool back; then the spool is rolled
                # and its state left as a stop leaves it.
                self._late_spool = asyncio.ensure_future(self._finish_late_spool())
            return
        self._finish_spool(spool)

    async def _finish_late_spool(self) -> None:
        """`_shut_down`'s end for a spool its holder gives back after the shutdown wait, then
        the claim on the journal's files is released (also if this fails, or the broker
        stops meanwhile)."""
        spool_dir = self.env.spool_dir
        assert spool_dir is not None
        try:
            # The spool comes back by itself (a Replicate stream ends), or inside the pipeline
            # (a primary's append ends), which is then shut down as `_shut_down` would have.
            pipeline = asyncio.ensure_future(self.pipeline_slot.take(asyncio.Event()))
            spool_back = asyncio.ensure_future(self.spool_slot.take(asyncio.Event()))
            try:
                await asyncio.wait({pipeline, spool_back}, return_when=asyncio.FIRST_COMPLETED)
                if pipeline.done() and (pln := pipeline.result()) is not None:
                    pln.begin_shutdown()
                    await pln.finish_shutdown(expect_err=False)
                spool = await spool_back
            finally:
                pipeline.cancel()
                spool_back.cancel()
            log.info("replica stopped: its spool came back late", journal=self.journal)
            self._finish_spool(spool)
        except Exception as err:
            log.error(
                "replica stopped: finishing its late spool failed",
                journal=self.journal,
                error=str(err),
            )
        finally:
            spool_dir.release(self.journal)

    def _finish_spool(self, spool: Spool) -> None:
        if spool.recovery_pending and self.recovery is not None:
            # Never settled: its recovered state waits, untouched, for the next replica.
            self.recovery.give_back()
            self.index.close(close_files=False)
            return
        # Roll forward to an empty fragment at the end: this completes the current fragment,
        # handing it to the persister, so that what this broker holds is not lost with it.
        fragment = spool.fragment
        fragment.begin = fragment.end
        fragment.sum.Clear()
        # Completed as a primary would complete it: this broker is leaving and nothing else may
        # hold this content, so the persister uploads it now rather than after the delay it
        # gives replicas to let the primary upload first.
        spool.must_apply(
            pb.ReplicateRequest(proposal=fragment, registers=spool.registers), primary=True
        )
        spool.close()
        # Files of local fragments stay open: the persister may still be uploading them, and
        # closes them itself.
        self.index.close(close_files=False)
        self._leave_spool_state(spool)
        # Neither value is put back: the replica is gone, and anyone still waiting on a slot
        # was released by the invalidation of its resolution.

    def _leave_spool_state(self, spool: Spool) -> None:
        """With durable spools, the stopped spool's empty fragment and registers are what the
        journal's next replica on this broker resumes from (a restart finds the same on
        disk); a deleted journal's record is removed instead."""
        spool_dir = self.env.spool_dir
        files = self._files
        if spool_dir is None or files is None:
            return
        if self.env.lookup_spec(self.journal) is None:
            files.remove()
            return
        state = RecoveredSpool(spool.fragment, spool.registers, None, None, hashlib.sha1())
        spool_dir.put_back(RecoveredJournal(self.journal, files, state))

    # --- Daemons ---

    async def _refresh_daemon(self) -> None:
        if self.env.stores is None:
            # No stores to list: the index holds exactly what this broker spools.
            self.index.replace_remote([])
            return
        refresher = IndexRefresher(
            self.index, lambda: self.env.lookup_spec(self.journal), self.env.stores
        )
        await refresher.run()

    async def _pulse_daemon(self, pulse: Callable[[str], Awaitable[PulseResult]]) -> None:
        # Each turn awaits (a pulse resolves, at least), and the loop ends once stopping: a
        # stopping replica's resolutions are all invalidated, which must not spin it.
        failures = 0
        while not self._stopping.is_set():
            result = PulseResult(ok=False, invalidated=None)
            try:
                async with asyncio.timeout(self.env.pulse_interval_s):
                    result = await pulse(self.journal)
            except TimeoutError:
                log.warning("journal pulse timed out (will retry)", journal=self.journal)
            failures = 0 if result.ok else failures + 1
            events = [self._stopping]
            if result.invalidated is not None:
                events.append(result.invalidated)
            await wait_first(events, pulse_retry_delay_s(failures, self.env.pulse_interval_s))
