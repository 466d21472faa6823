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
waited for is no longer it, and may have died with its copy.

Bounds. Completed fragments wait in a queue of at most `queue_len_max` (primaries' and
replicas' in queues of their own, so that a primary's never waits behind replicas'); a full
queue makes `submit` wait (back-pressure on whoever rolls spools) and `submit_nowait` raise.
Replica fragments between checks are held apart, at most `queue_len_max` of them; while that
many wait, the worker takes no more from the replicas' queue. Each upload is
tried at most `attempts_max` times, with exponential back-off between attempts, each attempt
limited to `upload_timeout_s`. A fragment that still fails is *not* lost: it stays a local
fragment of the index (served from its file, and covered by a later store listing if another
broker uploads it), and the failure is logged and counted.

File ownership. The persister owns the files of each fragment it is given. It closes the
compressed file when it is done with the fragment. It closes the content file when the fragment
was persisted and its index told (the index no longer reads it), or when that index is closed.
Otherwise (no store configured, journal removed, attempts exhausted, or no index known) the
content file is left to whoever may still read it: the index, which closes the files it holds
when it is closed, or else the garbage collector (a TempSpoolFile closes itself when dropped).
Closing a file an index still serves would make its reads fail, which is worse than a late close.
A durable spool file (a broker with a data directory, spool_named.py) also has a name on disk:
it is removed once the fragment is persisted (or will never be: no store, journal deleted), and
kept otherwise, so that a broker restarted after a failed or interrupted upload recovers the
fragment and persists it then.

Path postfixes. The spec's `path_postfix_template` is evaluated for each fragment (see
`broker/protocol/path_postfix.py`) and places its file under "directories" between the journal
name and the content name, e.g. by the UTC date and hour of the fragment's first append. A
template that renders no valid postfix fails the attempt like a store error would (the spec may
be fixed meanwhile).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import heapq
import io
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

from broker import metrics
from broker.fragment import codecs
from broker.fragment.index import FragmentIndex, IndexClosedError
from broker.fragment.spool import CompletedSpool, compress_file
from broker.fragment.spool_file import SpoolFile, unlink_durable
from broker.fragment.stores.base import FragmentStore, StoreError, run_to_completion
from broker.fragment.stores.registry import StoreRegistry
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.protocol.path_postfix import postfix_of
from broker.protocol.validate import ValidationError

log = get_logger(__name__)

# Completed fragments waiting to be persisted. Each holds up to a fragment's target length of
# local disk, so the bound also bounds the disk a stalled store can make a broker hold.
queue_len_max_default: Final = 64
# Attempts per fragment (the first included) before the persister gives up on it.
attempts_max_default: Final = 8
# Back-off between attempts: doubling from the initial delay, capped.
backoff_initial_s_default: Final = 0.5
backoff_max_s_default: Final = 60.0
# A single upload (existence check and put) may take this long before it counts as failed.
# Gazette uses the same limit, having seen store clients wedge on multi-part uploads.
upload_timeout_s_default: Final = 300.0
# How long a replica waits before persisting what the primary is expected to persist first.
replica_delay_s_default: Final = 120.0
# When a replica first checks whether the primary's upload is done (then at doubling intervals
# until replica_delay_s): a primary persists a rolled fragment at once, in well under this.
replica_check_s_default: Final = 2.0


class PersistQueueFullError(Exception):
    """`submit_nowait` found the persister's queue full."""


class PersisterClosedError(Exception):
    """The persister was closed; it accepts no more fragments."""


class Outcome(enum.Enum):
    """What became of one completed fragment."""

    PERSISTED = "persisted"  # Uploaded now.
    ALREADY_PRESENT = "already_present"  # The store already held it.
    NO_STORE = "no_store"  # The journal has no store: it lives only on brokers.
    JOURNAL_REMOVED = "journal_removed"  # The journal's spec is gone: dropped.
    EMPTY = "empty"  # Nothing to persist.
    GAVE_UP = "gave_up"  # Every attempt failed.
    QUEUE_FULL = "queue_full"  # Not queued (on_complete with a full queue or when closed).
    DEFERRED = "deferred"  # A replica's check found nothing yet: checked again later.


_DONE: Final = frozenset({Outcome.PERSISTED, Outcome.ALREADY_PRESENT})
# Outcomes after which nothing will ever persist the fragment: a journal without stores keeps
# its content only as long as the broker holds it, and a deleted journal's is dropped.
_NEVER_PERSISTED: Final = frozenset({Outcome.NO_STORE, Outcome.JOURNAL_REMOVED, Outcome.EMPTY})

# Errors of one attempt that a later attempt may not meet: store and file-system failures,
# time-outs, and a spec naming a store that cannot be built (the spec may be fixed meanwhile).
_RETRIABLE: Final = (StoreError, OSError, TimeoutError, ValidationError)

SpecOf = Callable[[str], pb.JournalSpec | None]


@dataclass
class _Job:
    completed: CompletedSpool
    index: FragmentIndex | None
    not_before: float  # When it may be uploaded (a replica's, after replica_delay_s).
    compressed: tuple[SpoolFile, int] | None = field(default=None)
    # A replica's: when it is next checked for in the store, and the interval after that.
    check_at: float = 0.0
    check_interval_s: float = 0.0

    def due_at(self, draining: bool) -> float:
        return 0.0 if draining else min(self.check_at, self.not_before)


class _FileSection(io.RawIOBase):
    """The first `length` bytes of a SpoolFile as a readable stream, for store uploads."""

    def __init__(self, file: SpoolFile, length: int) -> None:
        super().__init__()
        self._file = file
        self._length = length
        self._pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        want = min(len(buffer), self._length - self._pos)
        if want <= 0:
            return 0
        data = self._file.pread(want, self._pos)
        if not data:
            raise OSError(f"spool file is short: expected {self._length} bytes, at {self._pos}")
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


@dataclass
class Stats:
    """Counts of outcomes, for logs, metrics and tests. DEFERRED counts replicas' checks that
    found nothing yet (several per fragment), the others one per fragment."""

    outcomes: dict[Outcome, int] = field(default_factory=lambda: dict.fromkeys(Outcome, 0))
    failed_attempts: int = 0


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
        self._registry = registry
        self._spec_of = spec_of
        self._new_file = new_file
        self._index_of = index_of
        # Primaries' fragments and replicas' apart, each bounded: a primary's is due at once
        # and never waits behind replicas' (see "Timing"). `_arrived` is set by every intake.
        self._queue_len_max = queue_len_max
        self._primaries: asyncio.Queue[_Job] = asyncio.Queue(maxsize=queue_len_max)
        self._replicas: asyncio.Queue[_Job] = asyncio.Queue(maxsize=queue_len_max)
        self._arrived = asyncio.Event()
        # Jobs whose worker was cancelled mid-way; the next run() persists them first.
        self._interrupted: list[_Job] = []
        self._attempts_max = attempts_max
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._upload_timeout_s = upload_timeout_s
        self._replica_delay_s = replica_delay_s
        self._replica_check_s = replica_check_s
        # Replica jobs between checks: a heap by due time (then arrival), at most
        # queue_len_max long (see "Bounds").
        self._waiting: list[tuple[float, int, _Job]] = []
        self._arrivals = 0
        # Journals this broker became the primary of, and when (see `expedite`); entries older
        # than replica_delay_s concern no job any more and are dropped.
        self._expedited: dict[str, float] = {}
        self._clock = clock
        self._sleep = sleep
        self._closed = False
        self._draining = False
        self.stats = Stats()

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
            self._release(_Job(completed, index, 0.0), None)

    async def submit(self, completed: CompletedSpool, index: FragmentIndex | None = None) -> None:
        """Queue a completed fragment, waiting while the queue is full."""
        self._check_open()
        job = self._job(completed, index)
        await self._intake(job).put(job)
        self._arrived.set()

    def _intake(self, job: _Job) -> asyncio.Queue[_Job]:
        return self._primaries if job.completed.primary else self._replicas

    def _job(self, completed: CompletedSpool, index: FragmentIndex | None) -> _Job:
        now = self._clock()
        if completed.primary:
            return _Job(completed, index, now)
        return _Job(
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

    def _expedite_job(self, job: _Job) -> bool:
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

    async def _next_due(self) -> _Job:
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

    def _park(self, job: _Job) -> None:
        self._arrivals += 1
        heapq.heappush(self._waiting, (job.due_at(self._draining), self._arrivals, job))

    async def _process(self, job: _Job) -> Outcome | None:
        outcome: Outcome | None = None
        kept = False
        try:
            if not job.completed.primary and not self._draining and self._clock() < job.not_before:
                # A replica's, before its upload time: check whether the primary's is done.
                outcome = await self._check_present(job)
                if outcome is Outcome.DEFERRED:
                    job.check_interval_s *= 2
                    job.check_at = self._clock() + job.check_interval_s
                    self._park(job)
                    kept = True
                return outcome
            outcome = await self._persist_job(job)
        except asyncio.CancelledError:
            # Interrupted, typically because the broker is stopping and cancels this worker
            # before draining: keep the job (files included) for the next run() instead of
            # dropping content that may exist nowhere else. Bounded: one job per interruption.
            self._interrupted.append(job)
            kept = True
            raise
        finally:
            if not kept:
                self._release(job, outcome)
        return outcome

    async def persist(
        self, completed: CompletedSpool, index: FragmentIndex | None = None
    ) -> Outcome:
        """Persist one completed fragment now (no queue, no replica delay), with retries. The
        persister owns its files from this call on."""
        job = _Job(completed, index, 0.0)
        outcome: Outcome | None = None
        try:
            outcome = await self._persist_job(job)
        finally:
            self._release(job, outcome)
        return outcome

    async def _persist_job(self, job: _Job) -> Outcome:
        fragment = job.completed.fragment
        if job.index is None:
            job.index = self._index_of(fragment.journal)
        outcome = Outcome.GAVE_UP
        for attempt in range(1, self._attempts_max + 1):
            try:
                outcome = await self._attempt(job)
                break
            except _RETRIABLE as err:
                self.stats.failed_attempts += 1
                if attempt == self._attempts_max:
                    log.error(
                        "giving up persisting fragment (content stays on this broker)",
                        journal=fragment.journal,
                        begin=fragment.begin,
                        end=fragment.end,
                        attempts=attempt,
                        error=str(err),
                    )
                    break
                delay = self.backoff_s(attempt)
                log.warning(
                    "persisting fragment failed (will retry)",
                    journal=fragment.journal,
                    begin=fragment.begin,
                    end=fragment.end,
                    attempt=attempt,
                    delay_s=delay,
                    error=str(err),
                )
                await self._sleep(delay)
        self.stats.outcomes[outcome] += 1
        return outcome

    def backoff_s(self, attempt: int) -> float:
        """Delay after failed attempt `attempt` (1-based)."""
        return min(self._backoff_max_s, self._backoff_initial_s * 2.0 ** (attempt - 1))

    def _target(self, job: _Job) -> tuple[pb.Fragment, FragmentStore] | Outcome:
        """The fragment as it is named in its store, and the store; or why there is none."""
        completed = job.completed
        if completed.end == completed.begin:
            return Outcome.EMPTY
        spec = self._spec_of(completed.fragment.journal)
        if spec is None:
            log.warning(
                "dropping completed fragment: its journal was removed",
                journal=completed.fragment.journal,
            )
            return Outcome.JOURNAL_REMOVED
        if not spec.fragment.stores:
            return Outcome.NO_STORE
        fragment = pb.Fragment()
        fragment.CopyFrom(completed.fragment)
        fragment.backing_store = spec.fragment.stores[0]
        # Evaluated with backing_store set and no postfix yet, as Gazette evaluates it.
        fragment.path_postfix = ""
        fragment.path_postfix = postfix_of(fragment, completed.first_append_time, spec)
        return fragment, self._registry.get(fragment.backing_store)

    async def _check_present(self, job: _Job) -> Outcome:
        """A replica's check before its upload time: ALREADY_PRESENT (the index told, as after
        an upload), DEFERRED if not there yet or the check failed, or why there is nothing to
        persist. Its job is done, unless DEFERRED."""
        fragment = job.completed.fragment
        if job.index is None:
            job.index = self._index_of(fragment.journal)
        try:
            target = self._target(job)
            if isinstance(target, Outcome):
                outcome = target
            else:
                fragment, store = target
                async with asyncio.timeout(self._upload_timeout_s):
                    present = await store.exists(fragment)
                outcome = Outcome.ALREADY_PRESENT if present else Outcome.DEFERRED
        except _RETRIABLE as err:
            log.debug("replica's persisted check failed", journal=fragment.journal, error=str(err))
            outcome = Outcome.DEFERRED
        if outcome is Outcome.ALREADY_PRESENT:
            self._tell_index(job, fragment)
        self.stats.outcomes[outcome] += 1
        return outcome

    def _tell_index(self, job: _Job, fragment: pb.Fragment) -> None:
        # The store's own modification time is learned at the next listing; until then, the
        # upload's (or check's) time stands in (a persisted fragment must have one, or reads
        # would treat it as local-only).
        fragment.mod_time = int(self._clock())
        if job.index is not None:
            try:
                job.index.add_persisted(fragment)
            except IndexClosedError:
                pass  # The replica went away meanwhile; the upload itself stands.

    async def _attempt(self, job: _Job) -> Outcome:
        target = self._target(job)
        if isinstance(target, Outcome):
            return target
        fragment, store = target
        async with asyncio.timeout(self._upload_timeout_s):
            if await store.exists(fragment):
                outcome = Outcome.ALREADY_PRESENT
            else:
                file, length = await self._content(job)
                await store.put(fragment, io.BufferedReader(_FileSection(file, length)))
                metrics.record_persisted(fragment.end - fragment.begin)
                outcome = Outcome.PERSISTED
        self._tell_index(job, fragment)
        return outcome

    async def _content(self, job: _Job) -> tuple[SpoolFile, int]:
        """The file and length to upload: the compressed file, built now if the spool did not
        build it (kept for later attempts), or the content file for the NONE codec."""
        completed = job.completed
        codec = completed.fragment.compression_codec
        if codec == pb.NONE:
            return completed.content_file, completed.end - completed.begin
        if completed.compressed_file is not None:
            return completed.compressed_file, completed.compressed_length
        if job.compressed is None:
            # Waited for even if cancelled: the thread reads the content file, which the
            # release that follows closes (a memory spool's blocks then go to other spools).
            job.compressed = await run_to_completion(
                functools.partial(
                    compress_file,
                    codecs.CompressionCodec(codec),
                    completed.content_file,
                    completed.end - completed.begin,
                    self._new_file,
                ),
                discard=lambda compressed: compressed[0].close(),
            )
        return job.compressed

    def _release(self, job: _Job, outcome: Outcome | None) -> None:
        """Close the files the persister no longer needs (see "File ownership"). `outcome` is
        None if persisting was interrupted (cancelled)."""
        completed = job.completed
        if completed.compressed_file is not None:
            completed.compressed_file.close()
        if job.compressed is not None:
            job.compressed[0].close()
        index = job.index
        content = completed.content_file
        if outcome in _DONE or outcome in _NEVER_PERSISTED:
            # A durable spool file's name goes: its content is in the store, or never will be
            # (a restarted broker must not recover it). Other outcomes keep it for a retry
            # after a restart.
            unlink_durable(content)
        if index is not None and (outcome in _DONE or index.closed):
            content.close()

    def _check_open(self) -> None:
        if self._closed:
            raise PersisterClosedError("persister is closed")
