"""Persister: uploads completed spool fragments to the journal's BLOB store.

A spool that rolls hands its completed fragment (content file, and the compressed file the
primary built as it committed) to the persister, which uploads it to the *first* store of the
journal's current spec, under its content-addressed name. Names are content addresses, so an
upload is idempotent: a file that already exists under the name (uploaded by another replica,
or by an earlier attempt) counts as done, and the upload is skipped.

Once the fragment is in the store, the index learns it as a persisted fragment (backing store
and modification time set), reads of its offsets go through the store from then on, and the
local files are closed. Until then, the index keeps serving the content from the local file.

Timing. The primary persists at once. Replicas hold the same content and persist it too, but
only after `replica_delay_s`: this is what keeps the content durable if the primary dies before
uploading (Gazette's persister does the same with its rotating queues). Meanwhile a replica
checks whether the fragment is already in the store, `replica_check_s` after it completed and
then at doubling intervals: usually the primary's upload is done within seconds, and the
replica's copy (up to a fragment's target length of spool, per journal) is released then
rather than held for the whole delay. A replica fragment waiting for its next check does not
hold up the fragments behind it: the worker persists whatever is due first. A broker that
becomes a journal's primary `expedite`s its replica fragments of the journal: the primary they
waited for is no longer it, and may have died with its copy. A replica's fragment holding
commits its primary did not see (`CompletedSpool.ahead_of_primary`: a new primary proposed less,
then rolled every spool past it) is persisted at once too: no primary will upload that content,
and brokers without a copy, the primary included, cannot serve its offsets until it is stored.

Giving up. A fragment whose `attempts_max` uploads all failed (a store down for minutes) is not
dropped from the persister's care: another round of attempts comes `gave_up_retry_initial_s`
later, doubling to `gave_up_retry_max_s`, until the store takes it, the journal is deleted, or
the broker stops (at most `queue_len_max` such fragments wait; beyond that, and when the
broker drains, the content stays local, as its spool's files, for a restart to recover).

Bounds. Completed fragments wait in a queue of at most `queue_len_max` (primaries' and
replicas' in queues of their own, so that a primary's never waits behind replicas'); a full
queue makes `submit` wait (back-pressure on whoever rolls spools) and `submit_nowait` raise.
Replica fragments between checks are held apart, at most `queue_len_max` of them; while that
many wait, the worker takes no more from the replicas' queue. Each upload is tried at most
`attempts_max` times (upload.py, which also owns the files of the fragments given to it).
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Awaitable, Callable
from typing import Final

from broker.fragment.index import FragmentIndex
from broker.fragment.spool import CompletedSpool
from broker.fragment.spool_file import SpoolFile
from broker.fragment.stores.registry import StoreRegistry
from broker.fragment.upload import (
    FragmentUploader,
    Outcome,
    PersistJob,
    SpecOf,
    Stats,
    attempts_max_default,
    backoff_initial_s_default,
    backoff_max_s_default,
    upload_timeout_s_default,
)
from broker.logging import get_logger

log = get_logger(__name__)

# Completed fragments waiting to be persisted. Each holds up to a fragment's target length of
# local disk, so the bound also bounds the disk a stalled store can make a broker hold.
queue_len_max_default: Final = 64
# How long a replica waits before persisting what the primary is expected to persist first.
replica_delay_s_default: Final = 120.0
# When a replica first checks whether the primary's upload is done (then at doubling intervals
# until replica_delay_s): a primary persists a rolled fragment at once, in well under this.
replica_check_s_default: Final = 2.0
# A fragment whose round of `attempts_max` uploads all failed (a store down for minutes) gets
# another round after this long, doubling up to the max, for as long as the broker runs: its
# content is on brokers only until then, and gone with them once the journal moves away.
gave_up_retry_initial_s_default: Final = 30.0
gave_up_retry_max_s_default: Final = 300.0


class PersistQueueFullError(Exception):
    """`submit_nowait` found the persister's queue full."""


class PersisterClosedError(Exception):
    """The persister was closed; it accepts no more fragments."""


# Re-exported: a fragment's outcomes, the stats and the upload's bounds are the persister's.
__all__ = [
    "Outcome",
    "PersistQueueFullError",
    "Persister",
    "PersisterClosedError",
    "SpecOf",
    "Stats",
    "attempts_max_default",
    "backoff_initial_s_default",
    "backoff_max_s_default",
    "queue_len_max_default",
    "replica_check_s_default",
    "replica_delay_s_default",
    "upload_timeout_s_default",
]


class Persister:
    """See the module docstring. `spec_of(journal)` returns the journal's current spec (None
    once it is deleted); `new_file` makes files for compressing fragments whose spool did not
    compress them (those of replicas). `index_of(journal)` finds the index to tell of a
    persisted fragment when none was given with it (e.g. the local replica's)."""

    def __init__(
        self,
        registry: StoreRegistry,
        spec_of: SpecOf,
        *,
        new_file: Callable[[], SpoolFile],
        index_of: Callable[[str], FragmentIndex | None] = lambda _journal: None,
        queue_len_max: int = queue_len_max_default,
        attempts_max: int = attempts_max_default,
        backoff_initial_s: float = backoff_initial_s_default,
        backoff_max_s: float = backoff_max_s_default,
        upload_timeout_s: float = upload_timeout_s_default,
        replica_delay_s: float = replica_delay_s_default,
        replica_check_s: float = replica_check_s_default,
        gave_up_retry_initial_s: float = gave_up_retry_initial_s_default,
        gave_up_retry_max_s: float = gave_up_retry_max_s_default,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if queue_len_max < 1 or attempts_max < 1:
            raise ValueError("queue_len_max and attempts_max: must be >= 1")
        if not 0 <= backoff_initial_s <= backoff_max_s or upload_timeout_s <= 0:
            raise ValueError(
                "need 0 <= backoff_initial_s <= backoff_max_s and upload_timeout_s > 0"
            )
        if replica_check_s <= 0 or replica_delay_s < 0:
            raise ValueError("need replica_check_s > 0 and replica_delay_s >= 0")
        if not 0 < gave_up_retry_initial_s <= gave_up_retry_max_s:
            raise ValueError("need 0 < gave_up_retry_initial_s <= gave_up_retry_max_s")
        self._gave_up_retry_initial_s = gave_up_retry_initial_s
        self._gave_up_retry_max_s = gave_up_retry_max_s
        self._index_of = index_of
        self.stats = Stats()
        self._upload = FragmentUploader(
            registry,
            spec_of,
            self.stats,
            new_file=new_file,
            index_of=index_of,
            attempts_max=attempts_max,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s,
            upload_timeout_s=upload_timeout_s,
            clock=clock,
            sleep=sleep,
        )
        # Primaries' fragments and replicas' apart, each bounded: a primary's is due at once
        # and never waits behind replicas' (see "Timing"). `_arrived` is set by every intake.
        self._queue_len_max = queue_len_max
        self._primaries: asyncio.Queue[PersistJob] = asyncio.Queue(maxsize=queue_len_max)
        self._replicas: asyncio.Queue[PersistJob] = asyncio.Queue(maxsize=queue_len_max)
        self._arrived = asyncio.Event()
        # Jobs whose worker was cancelled mid-way; the next run() persists them first.
        self._interrupted: list[PersistJob] = []
        self._replica_delay_s = replica_delay_s
        self._replica_check_s = replica_check_s
        # Replica jobs between checks: a heap by due time (then arrival), at most
        # queue_len_max long (see "Bounds").
        self._waiting: list[tuple[float, int, PersistJob]] = []
        self._arrivals = 0
        # Journals this broker became the primary of, and when (see `expedite`); entries older
        # than replica_delay_s concern no job any more and are dropped.
        self._expedited: dict[str, float] = {}
        self._clock = clock
        self._sleep = sleep
        self._closed = False
        self._draining = False

    # --- Intake -----------------------------------------------------------------------------

    def submit_nowait(self, completed: CompletedSpool, index: FragmentIndex | None = None) -> None:
        """Queue a completed fragment; raise PersistQueueFullError if the queue is full (the
        caller still owns the files then)."""
        self._check_open()
        try:
            job = self._job(completed, index)
            self._intake(job).put_nowait(job)
            self._arrived.set()
        except asyncio.QueueFull:
            raise PersistQueueFullError(
                f"persister queue is full ({self._queue_len_max} fragments)"
            ) from None

    def on_complete(self, completed: CompletedSpool) -> None:
        """The spool observer's hook: queue `completed` without waiting. It must not fail the
        spool, so a full queue leaves the fragment local (its index keeps serving it; another
        replica may persist it) and counts it as QUEUE_FULL."""
        # The index is the one of the replica completing the fragment now, not whichever
        # replica of the journal exists when the upload is done.
        index = self._index_of(completed.fragment.journal)
        try:
            self.submit_nowait(completed, index)
        except (PersistQueueFullError, PersisterClosedError) as err:
            log.error(
                "cannot queue completed fragment for persisting (it stays local)",
                journal=completed.fragment.journal,
                begin=completed.begin,
                end=completed.end,
                error=str(err),
            )
            self.stats.outcomes[Outcome.QUEUE_FULL] += 1
            self._upload.release(PersistJob(completed, index, 0.0), None)

    async def submit(self, completed: CompletedSpool, index: FragmentIndex | None = None) -> None:
        """Queue a completed fragment, waiting while the queue is full."""
        self._check_open()
        job = self._job(completed, index)
        await self._intake(job).put(job)
        self._arrived.set()

    def _intake(self, job: PersistJob) -> asyncio.Queue[PersistJob]:
        return self._primaries if job.completed.primary else self._replicas

    def _job(self, completed: CompletedSpool, index: FragmentIndex | None) -> PersistJob:
        now = self._clock()
        if completed.primary or completed.ahead_of_primary:
            return PersistJob(completed, index, now)
        return PersistJob(
            completed,
            index,
            now + self._replica_delay_s,
            check_at=now + self._replica_check_s,
            check_interval_s=self._replica_check_s,
        )

    def expedite(self, journal: str) -> int:
        """This broker is now `journal`'s primary (its pulse committed): replica fragments of
        the journal held for the former primary's upload are due at once, since the former
        primary may be gone with its copy (a crash, a restart that set its spool aside), and
        until they are uploaded, brokers without a copy cannot serve their offsets. Returns
        how many waiting fragments it made due (queued ones are made due as they are taken)."""
        now = self._clock()
        cutoff = now - self._replica_delay_s
        for name, at in list(self._expedited.items()):
            if at < cutoff:
                del self._expedited[name]
        self._expedited[journal] = now
        made_due = 0
        for i, (_, arrival, job) in enumerate(self._waiting):
            if self._expedite_job(job):
                self._waiting[i] = (job.due_at(self._draining), arrival, job)
                made_due += 1
        if made_due:
            heapq.heapify(self._waiting)
            self._arrived.set()
        return made_due

    def _expedite_job(self, job: PersistJob) -> bool:
        """Make a replica's job due now if its journal was expedited after it completed."""
        at = self._expedited.get(job.completed.fragment.journal)
        if at is None or job.completed.primary or job.not_before <= at:
            return False
        if job.not_before - self._replica_delay_s > at:
            return False  # Completed after this broker became primary: not the former's.
        job.not_before = job.check_at = at
        return True

    def close(self) -> None:
        """Accept no more fragments. `run` returns once those queued are done."""
        self._closed = True

    @property
    def pending(self) -> int:
        """Fragments not persisted yet: queued, replicas' between checks, or interrupted."""
        queued = self._primaries.qsize() + self._replicas.qsize()
        return queued + len(self._waiting) + len(self._interrupted)

    # --- The worker -------------------------------------------------------------------------

    async def run(self, *, drain: bool = False) -> None:
        """Persist queued fragments, each when due, until cancelled; or, with `drain`, until
        none is left (replica delays are then not waited out: the broker is exiting)."""
        self._draining = drain
        while self._interrupted:
            await self._process(self._interrupted.pop(0))
        while not (drain and self._drained()):
            await self.step()

    async def step(self) -> Outcome | None:
        """Wait for the next fragment that is due (queued, or a replica's whose check or
        upload time came) and process it. Returns its outcome: DEFERRED if a replica's check
        did not find it in the store yet (it is checked again later), None if interrupted."""
        return await self._process(await self._next_due())

    def _drained(self) -> bool:
        return self._primaries.empty() and self._replicas.empty() and not self._waiting

    async def _next_due(self) -> PersistJob:
        while True:
            self._arrived.clear()  # Any intake from here on wakes the wait below.
            if not self._primaries.empty():
                return self._primaries.get_nowait()  # Due at once, whatever else waits.
            # A replica's arrival waits its turn among those between checks (bounded: while
            # that many wait, later ones stay queued, and their intake applies back-pressure).
            while not self._replicas.empty() and len(self._waiting) < self._queue_len_max:
                job = self._replicas.get_nowait()
                self._expedite_job(job)
                if job.due_at(self._draining) <= self._clock():
                    return job
                self._park(job)
            wait: float | None = None
            if self._waiting:
                wait = self._waiting[0][2].due_at(self._draining) - self._clock()
                if wait <= 0:
                    return heapq.heappop(self._waiting)[2]
            await self._wait_for_arrival(wait)

    async def _wait_for_arrival(self, wait: float | None) -> None:
        """Until something is submitted, or for `wait` seconds (None: no bound). Nothing
        here holds a fragment, so a cancellation loses none."""
        if wait is None:
            await self._arrived.wait()
            return
        arrived = asyncio.ensure_future(self._arrived.wait())
        timer = asyncio.ensure_future(self._sleep(wait))
        try:
            await asyncio.wait((arrived, timer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            arrived.cancel()
            timer.cancel()

    def _park(self, job: PersistJob) -> None:
        self._arrivals += 1
        heapq.heappush(self._waiting, (job.due_at(self._draining), self._arrivals, job))

    async def _process(self, job: PersistJob) -> Outcome | None:
        outcome: Outcome | None = None
        kept = False
        try:
            if not job.completed.primary and not self._draining and self._clock() < job.not_before:
                # A replica's, before its upload time: check whether the primary's is done.
                outcome = await self._upload.check_present(job)
                if outcome is Outcome.DEFERRED:
                    job.check_interval_s *= 2
                    job.check_at = self._clock() + job.check_interval_s
                    self._park(job)
                    kept = True
                return outcome
            outcome = await self._upload.persist_job(job)
            if outcome is Outcome.GAVE_UP and self._retry_later(job):
                kept = True
        except asyncio.CancelledError:
            # Interrupted, typically because the broker is stopping and cancels this worker
            # before draining: keep the job (files included) for the next run() instead of
            # dropping content that may exist nowhere else. Bounded: one job per interruption.
            self._interrupted.append(job)
            kept = True
            raise
        finally:
            if not kept:
                self._upload.release(job, outcome)
        return outcome

    def _retry_later(self, job: PersistJob) -> bool:
        """Park a job whose round of attempts gave up for another round later (see
        `gave_up_retry_initial_s_default`); False (the content stays local, as before) when
        draining, or when `queue_len_max` such jobs wait already (each holds a fragment's
        files: bounded)."""
        if self._draining:
            return False
        waiting = sum(1 for _, _, waiter in self._waiting if waiter.rounds_given_up)
        if waiting >= self._queue_len_max:
            return False
        job.rounds_given_up += 1
        delay = min(
            self._gave_up_retry_max_s,
            self._gave_up_retry_initial_s * 2 ** (job.rounds_given_up - 1),
        )
        job.not_before = job.check_at = self._clock() + delay
        fragment = job.completed.fragment
        log.warning(
            "fragment upload gave up; another round later (its content is on brokers only)",
            journal=fragment.journal,
            begin=fragment.begin,
            end=fragment.end,
            rounds=job.rounds_given_up,
            retry_in_s=delay,
        )
        self._park(job)
        return True

    async def persist(
        self, completed: CompletedSpool, index: FragmentIndex | None = None
    ) -> Outcome:
        """Persist one completed fragment now (no queue, no replica delay), with retries. The
        persister owns its files from this call on."""
        job = PersistJob(completed, index, 0.0)
        outcome: Outcome | None = None
        try:
            outcome = await self._upload.persist_job(job)
        finally:
            self._upload.release(job, outcome)
        return outcome

    def backoff_s(self, attempt: int) -> float:
        """Delay after failed attempt `attempt` (1-based)."""
        return self._upload.backoff_s(attempt)

    def _check_open(self) -> None:
        if self._closed:
            raise PersisterClosedError("persister is closed")
