"""Uploading one completed fragment to its journal's BLOB store, for the persister
(persister.py), which queues completed fragments and decides when each is due: the fragment's
name and store (the first of the journal's current spec, and its path postfix), a replica's
check whether the primary's upload is done, the upload itself with bounded retries, the
compressed copy built when the spool did not build one, the index told once the fragment is
in the store, and the fragment's files released.

Attempts. Each upload is tried at most `attempts_max` times, with exponential back-off between
attempts, each attempt limited to `upload_timeout_s`. A fragment that still fails is *not*
lost: it stays a local fragment of the index (served from its file, and covered by a later
store listing if another broker uploads it), and the failure is logged and counted.

File ownership. The persister owns the files of each fragment it is given, and releases them
here. It closes the compressed file when it is done with the fragment. It closes the content
file when the fragment was persisted and its index told (the index no longer reads it), or
when that index is closed.
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
import io
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

# The persister's log (its messages kept their logger when they moved here).
log = get_logger("broker.fragment.persister")

# Attempts per fragment (the first included) before the persister gives up on it.
attempts_max_default: Final = 8
# Back-off between attempts: doubling from the initial delay, capped.
backoff_initial_s_default: Final = 0.5
backoff_max_s_default: Final = 60.0
# A single upload (existence check and put) may take this long before it counts as failed.
# Gazette uses the same limit, having seen store clients wedge on multi-part uploads.
upload_timeout_s_default: Final = 300.0


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
class PersistJob:
    """One completed fragment in the persister's care: persister.py schedules it (when it is
    due), this module persists it."""

    completed: CompletedSpool
    index: FragmentIndex | None
    not_before: float  # When it may be uploaded (a replica's, after replica_delay_s).
    compressed: tuple[SpoolFile, int] | None = field(default=None)
    # A replica's: when it is next checked for in the store, and the interval after that.
    check_at: float = 0.0
    check_interval_s: float = 0.0
    # Rounds of attempts that gave up so far (persister.py tries again later).
    rounds_given_up: int = 0

    def due_at(self, draining: bool) -> float:
        return 0.0 if draining else min(self.check_at, self.not_before)


class FileSection(io.RawIOBase):
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


class FragmentUploader:
    """The persister's hands (see the module docstring): persists one job with retries
    (`persist_job`), checks whether a replica's is in the store already (`check_present`),
    and releases a job's files (`release`), counting outcomes in the persister's `stats`.
    `spec_of`, `new_file` and `index_of` are the persister's (Persister)."""

    def __init__(
        self,
        registry: StoreRegistry,
        spec_of: SpecOf,
        stats: Stats,
        *,
        new_file: Callable[[], SpoolFile],
        index_of: Callable[[str], FragmentIndex | None],
        attempts_max: int,
        backoff_initial_s: float,
        backoff_max_s: float,
        upload_timeout_s: float,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self._registry = registry
        self._spec_of = spec_of
        self.stats = stats
        self._new_file = new_file
        self._index_of = index_of
        self._attempts_max = attempts_max
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._upload_timeout_s = upload_timeout_s
        self._clock = clock
        self._sleep = sleep

    async def persist_job(self, job: PersistJob) -> Outcome:
        """Persist `job` now, in at most `attempts_max` attempts with back-off between them;
        count and return its outcome (GAVE_UP once every attempt failed). Its files are the
        caller's to `release`."""
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

    def _target(self, job: PersistJob) -> tuple[pb.Fragment, FragmentStore] | Outcome:
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

    async def check_present(self, job: PersistJob) -> Outcome:
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

    def _tell_index(self, job: PersistJob, fragment: pb.Fragment) -> None:
        # The store's own modification time is learned at the next listing; until then, the
        # upload's (or check's) time stands in (a persisted fragment must have one, or reads
        # would treat it as local-only).
        fragment.mod_time = int(self._clock())
        if job.index is not None:
            try:
                job.index.add_persisted(fragment)
            except IndexClosedError:
                pass  # The replica went away meanwhile; the upload itself stands.

    async def _attempt(self, job: PersistJob) -> Outcome:
        target = self._target(job)
        if isinstance(target, Outcome):
            return target
        fragment, store = target
        async with asyncio.timeout(self._upload_timeout_s):
            if await store.exists(fragment):
                outcome = Outcome.ALREADY_PRESENT
            else:
                file, length = await self._content(job)
                await store.put(fragment, io.BufferedReader(FileSection(file, length)))
                metrics.record_persisted(fragment.end - fragment.begin)
                outcome = Outcome.PERSISTED
        self._tell_index(job, fragment)
        return outcome

    async def _content(self, job: PersistJob) -> tuple[SpoolFile, int]:
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

    def release(self, job: PersistJob, outcome: Outcome | None) -> None:
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
