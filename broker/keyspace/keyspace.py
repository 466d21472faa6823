"""KeySpace: a decoded, sorted, local mirror of one prefix of the keyspace.

Brokers and consumers read their view of the cluster (journal and shard specs, members,
assignments) from a KeySpace rather than asking etcd: ``load()`` takes a snapshot, ``watch()``
keeps it current by applying watch responses. Readers see a consistent state between awaits,
because every update is applied synchronously, header and entries together, followed by the
observers, which derive their own state (e.g. a route table) within the same step.

Decoding. Each raw KeyValue is decoded by the caller's decoder. A value that fails to decode is
logged and left out (and an update to an existing key that fails to decode leaves the previous,
good entry in place), but the mirror keeps following the keyspace: a later, valid value for the
key is picked up. A human error writing one bad spec must not stop every broker's watch.

Revisions. The mirror's revision is that of the last event applied (or of the load, or of a
checked progress notification, below): every event of the prefix up to it is in the mirror. Not
a watch response's header revision: etcd sends a watch that is catching up ("unsynced", e.g.
resumed after a break) its history in batches of about 1,000 revisions, each response carrying
the store's current revision while later batches are still to come (as Gazette's KeySpace, whose
revision is the greatest ModRevision applied). A store's revision also moves with writes outside
the prefix (a consumer group's keys in the brokers' etcd), which the prefix's watch never shows.
A waiter for such a revision (a request carrying another process's header) would wait for the
prefix's next event, which may never come; so a waiter still behind after ``progress_after_s``
asks the backend for a progress notification (etcd's RequestProgress), which moves the mirror's
revision on.

A progress notification is checked before it is believed: etcd before 3.4.25 / 3.5.8 (etcd issue
#15220; Debian ships 3.4.23) may answer a requested progress with a revision ahead of events it
has still to send on the stream. Taking that revision would claim events the mirror lacks: a
waiter for it would read a stale view (a journal just created not found), and one for the next
revision would wait for an event a quiet cluster never makes. So the mirror reads the prefix at
the notified revision, only the keys modified at or since its own (etcd's ``min_mod_revision``;
those it reflects left out) and the count of all: if no key it had was deleted meanwhile (counts
agree), it applies the modified keys; if some were, it loads the prefix whole at that revision.
Either way it then reflects the revision, observers run if anything changed, and the events the
stream delivers late, at or below it, are skipped.

Failures. A broken watch (UnavailableError) is resumed from the last revision applied + 1, after
a bounded exponential back-off; a watch whose resume revision has been compacted re-loads the
whole prefix. Any other error ends ``watch()`` and fails ``wait_for_revision()`` waiters rather
than leaving them to time out.
"""

from __future__ import annotations

import asyncio
import bisect
import posixpath
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from broker.keyspace.backend import (
    Backend,
    CompactedError,
    Event,
    EventType,
    Header,
    KeySpaceError,
    KeyValue,
    UnavailableError,
    WatchResponse,
    prefix_end,
)
from broker.logging import get_logger

log = get_logger(__name__)

T = TypeVar("T")

# A waiter behind the mirror this long asks for a progress notification, then again at doubling
# intervals up to the maximum (see the module docstring).
progress_after_s = 0.1
progress_every_s_max = 2.0
# Consecutive failed attempts to (re)start the watch before watch() gives up and raises.
watch_attempts_max_default = 30
# Back-off between attempts: the first retry is immediate (a single broken stream is usually
# just a restarted server), then it doubles from the initial value up to the maximum.
watch_backoff_initial_s = 0.05
watch_backoff_max_s = 2.0


class WatchStoppedError(KeySpaceError):
    """The KeySpace's watch ended before the awaited revision was reached."""


class InvalidRootError(ValueError):
    """A KeySpace root must be a clean path (as Go's path.Clean leaves it)."""


class Entry(NamedTuple, Generic[T]):
    kv: KeyValue
    decoded: T


@dataclass(frozen=True, slots=True)
class ApplyIssue:
    """An event that could not be applied as it stood. ``error`` is the decoder's exception,
    if decoding was the problem."""

    key: bytes
    problem: str
    error: Exception | None = None


def _entry_key(entry: Entry[T]) -> bytes:
    return entry.kv.key


def decode_all(
    kvs: Iterable[KeyValue], decode: Callable[[KeyValue], T]
) -> tuple[list[Entry[T]], list[ApplyIssue]]:
    """Decode sorted KeyValues into entries, leaving out those that fail to decode."""
    entries: list[Entry[T]] = []
    issues: list[ApplyIssue] = []
    for kv in kvs:
        try:
            entries.append(Entry(kv, decode(kv)))
        except Exception as exc:
            issues.append(ApplyIssue(kv.key, "value failed to decode (left out)", exc))
    return entries, issues


def apply_events(
    entries: Sequence[Entry[T]], events: Iterable[Event], decode: Callable[[KeyValue], T]
) -> tuple[list[Entry[T]], list[ApplyIssue]]:
    """The entries after ``events`` (in revision order), and the issues met on the way.

    Pure: ``entries`` is not modified. The new list is built in one merge pass: events are
    ordered by key (stably, so one key's events keep their revision order), unchanged runs of
    entries are copied between them, and each event patches the tail of the new list.
    """
    ordered = sorted(events, key=lambda e: e.kv.key)
    out: list[Entry[T]] = []
    issues: list[ApplyIssue] = []
    i = 0
    for event in ordered:
        key = event.kv.key
        j = bisect.bisect_left(entries, key, lo=i, key=_entry_key)
        out.extend(entries[i:j])
        i = j
        if i < len(entries) and entries[i].kv.key == key:
            out.append(entries[i])
            i += 1
        issue = _patch_tail(out, event, decode)
        if issue is not None:
            issues.append(issue)
    out.extend(entries[i:])
    return out, issues


def _patch_tail(
    out: list[Entry[T]], event: Event, decode: Callable[[KeyValue], T]
) -> ApplyIssue | None:
    """Apply ``event`` to ``out``, whose tail is the event's key if the mirror has it. Events
    that do not fit are applied when that still leaves the newest good value, else skipped."""
    kv = event.kv
    tail = out[-1] if out and out[-1].kv.key == kv.key else None

    if tail is None:
        if event.type == EventType.DELETE:
            # Normal after a value that failed to decode was deleted.
            return ApplyIssue(kv.key, "deletion of a key not in the mirror (ignored)")
        try:
            out.append(Entry(kv, decode(kv)))
        except Exception as exc:
            return ApplyIssue(kv.key, "value failed to decode (left out)", exc)
        if kv.create_revision != kv.mod_revision or kv.version != 1:
            # Expected when an earlier value failed to decode and this one corrects it.
            return ApplyIssue(kv.key, "update of a key not in the mirror (applied as a creation)")
        return None

    if tail.kv.mod_revision >= kv.mod_revision:
        # A replay of an event the mirror already reflects; applying it would go back in time.
        return ApplyIssue(
            kv.key, f"stale event at revision {kv.mod_revision} (have {tail.kv.mod_revision})"
        )
    if event.type == EventType.DELETE:
        out.pop()
        return None
    try:
        decoded = decode(kv)
    except Exception as exc:
        return ApplyIssue(kv.key, "value failed to decode (previous value kept)", exc)
    out[-1] = Entry(kv, decoded)
    if tail.kv.create_revision != kv.create_revision:
        return ApplyIssue(kv.key, "create revision changed without a deletion (applied)")
    if tail.kv.version + 1 != kv.version:
        # Expected when an intermediate value failed to decode.
        return ApplyIssue(kv.key, f"version skipped from {tail.kv.version} (applied)")
    return None


async def _aclose(stream: AsyncIterator[WatchResponse]) -> None:
    # Backend.watch promises only an AsyncIterator; those that hold a server-side watch
    # (async generators, the embedded stream) release it on aclose().
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


def _as_bytes(key: str | bytes) -> bytes:
    return key.encode() if isinstance(key, str) else key


def _check_root(root: bytes) -> None:
    try:
        text = root.decode()
    except UnicodeDecodeError as exc:
        raise InvalidRootError(f"keyspace root {root!r}: must be UTF-8") from exc
    # Go's path.Clean collapses a leading "//" that posixpath.normpath keeps.
    if not text or posixpath.normpath(text) != text or text.startswith("//"):
        raise InvalidRootError(
            f"keyspace root {text!r}: must be a clean path (no trailing or doubled '/', "
            "no '.' or '..' elements)"
        )


class KeySpace(Generic[T]):
    """A mirror of every key under ``root`` (a prefix, as in Gazette: root "/a" also covers
    "/ab"), each decoded by ``decoder``. Use from one event loop."""

    def __init__(
        self,
        root: str | bytes,
        decoder: Callable[[KeyValue], T],
        *,
        watch_attempts_max: int = watch_attempts_max_default,
        backoff_initial_s: float = watch_backoff_initial_s,
        backoff_max_s: float = watch_backoff_max_s,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.root = _as_bytes(root)
        _check_root(self.root)
        if watch_attempts_max < 1 or backoff_initial_s < 0 or backoff_max_s < backoff_initial_s:
            raise ValueError(
                "keyspace watch retry: need watch_attempts_max >= 1 and "
                "0 <= backoff_initial_s <= backoff_max_s"
            )
        self.decoder = decoder
        # The revision the mirror reflects (0 until loaded).
        self.header = Header(revision=0)
        self.kvs: list[Entry[T]] = []
        # How many keys the prefix holds at ``header``'s revision, counted from the store (kvs
        # leaves out values that failed to decode): checks a progress notification.
        self._keys = 0
        # The revision of the last snapshot taken at a progress notification: the stream may
        # deliver events at or below it afterwards (etcd issue #15220), already reflected.
        self._snapshot_revision = 0
        # Called, in order, after each load and each applied watch response.
        self.observers: list[Callable[[], None]] = []
        self._watch_attempts_max = watch_attempts_max
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._sleep = sleep
        # Replaced on every update; waiters hold the one current when they started waiting.
        self._updated = asyncio.Event()
        self._watch_stopped: BaseException | None = None
        # The backend being watched (for progress requests); None while not watching.
        self._watching: Backend | None = None

    # -- Lookups ----------------------------------------------------------------------------

    def index(self, key: str | bytes) -> tuple[int, bool]:
        """Where ``key`` is in ``kvs`` (or would be inserted), and whether it is there."""
        k = _as_bytes(key)
        i = bisect.bisect_left(self.kvs, k, key=_entry_key)
        return i, i < len(self.kvs) and self.kvs[i].kv.key == k

    def get(self, key: str | bytes) -> Entry[T] | None:
        i, found = self.index(key)
        return self.kvs[i] if found else None

    def range(self, start: str | bytes, end: str | bytes) -> list[Entry[T]]:
        """Entries with keys in [start, end)."""
        lo, _ = self.index(start)
        hi = bisect.bisect_left(self.kvs, _as_bytes(end), lo=lo, key=_entry_key)
        return self.kvs[lo:hi]

    def search(self, prefix: str | bytes) -> list[Entry[T]]:
        """Entries whose keys start with ``prefix``."""
        p = _as_bytes(prefix)
        end = prefix_end(p)
        if end == b"\x00":  # The prefix covers everything from itself on.
            lo, _ = self.index(p)
            return self.kvs[lo:]
        return self.range(p, end)

    # -- Updates ----------------------------------------------------------------------------

    async def load(self, backend: Backend, revision: int = 0) -> None:
        """Replace the mirror with the prefix at ``revision`` (0 = current)."""
        resp = await backend.range(self.root, prefix_end(self.root), revision)
        entries, issues = decode_all(resp.kvs, self.decoder)
        self._log_issues("load", issues)
        header = resp.header
        # Like Gazette, record the revision the mirror reflects rather than the store's
        # current one (they differ when loading a past revision).
        if revision:
            header = Header(revision, header.cluster_id, header.member_id, header.raft_term)
        self.header, self.kvs, self._keys = header, entries, len(resp.kvs)
        self._notify()

    def apply(self, *responses: WatchResponse) -> None:
        """Apply watch responses (in order) as one update, then run the observers."""
        header = self.header
        events: list[Event] = []
        skipped = 0
        for resp in responses:
            if not resp.events:  # A progress notification handed in directly (tests).
                if resp.header.revision > header.revision:
                    header = resp.header
                continue
            # The last event's revision (events come in revision order), not the header's: see
            # the module docstring.
            last = resp.events[-1].kv.mod_revision
            if last > header.revision:
                h = resp.header
                header = Header(last, h.cluster_id, h.member_id, h.raft_term)
            for event in resp.events:
                # In the mirror already: the stream delivered it after a progress notification
                # that came ahead of it (only those: a revision's events may, in principle, come
                # in more than one response, each with the revision in its header).
                if event.kv.mod_revision <= self._snapshot_revision:
                    skipped += 1
                    continue
                events.append(event)
                if event.type == EventType.DELETE:
                    self._keys -= 1
                elif event.kv.create_revision == event.kv.mod_revision:
                    self._keys += 1
        if skipped:
            log.info(
                "keyspace: events already reflected skipped (delivered after a progress "
                "notification ahead of them)",
                root=self.root.decode(),
                skipped=skipped,
                snapshot=self._snapshot_revision,
            )
        self.kvs, issues = apply_events(self.kvs, events, self.decoder)
        self._log_issues("watch", issues)
        self.header = header
        self._notify()

    async def watch(self, backend: Backend) -> None:
        """Keep the mirror current until the backend closes (returns) or the watch fails for
        good (raises). Loads first if the mirror was never loaded. Cancel to stop."""
        self._watch_stopped = None
        try:
            await self._watch(backend)
        except BaseException as exc:
            self._watch_stopped = exc
            raise
        else:
            self._watch_stopped = WatchStoppedError(f"keyspace {self.root!r}: backend closed")
        finally:
            self._notify_waiters()

    async def _watch(self, backend: Backend) -> None:
        must_load = self.header.revision == 0
        attempt = 0
        while True:
            try:
                if must_load:
                    await self.load(backend)
                    must_load = False
                stream = backend.watch(self.root, prefix_end(self.root), self.header.revision + 1)
                self._watching = backend
                try:
                    async for resp in stream:
                        attempt = 0
                        if resp.events:
                            self.apply(resp)
                        elif resp.header.revision > self.header.revision:
                            await self._progress(backend, resp.header)
                finally:
                    self._watching = None
                    await _aclose(stream)
                return
            except (UnavailableError, CompactedError) as exc:
                attempt += 1
                if attempt >= self._watch_attempts_max:
                    raise
                must_load = must_load or isinstance(exc, CompactedError)
                delay_s = self.backoff_s(attempt)
                log.warning(
                    "keyspace: watch interrupted (will retry)",
                    root=self.root.decode(),
                    error=str(exc),
                    attempt=attempt,
                    delay_s=delay_s,
                    reload=must_load,
                )
                await self._sleep(delay_s)

    def backoff_s(self, attempt: int) -> float:
        """Delay before retry ``attempt`` (1-based) of a failed watch."""
        if attempt <= 1:
            return 0.0
        return min(self._backoff_max_s, self._backoff_initial_s * 2.0 ** (attempt - 2))

    async def _progress(self, backend: Backend, header: Header) -> None:
        """A progress notification at ``header.revision``, above the mirror's: checked, then
        reflected (see the module docstring)."""
        at, since = header.revision, self.header.revision
        # From `since` itself, not the revision after: were a revision's events ever split over
        # two responses (etcd does not split them), the mirror would hold only some of them.
        changed = await backend.range(self.root, prefix_end(self.root), at, min_mod_revision=since)
        # Keys of the mirror's revision still there at `at` (never deleted meanwhile) are
        # those created at or before it: count - created is what is left of self._keys (a key
        # created at `since` and not applied makes it negative: loaded too).
        created = sum(1 for kv in changed.kvs if kv.create_revision > since)
        deleted = self._keys - (changed.count - created)
        if deleted:
            log.info(
                "keyspace: keys deleted before a progress notification's revision; loading",
                root=self.root.decode(),
                revision=at,
                since=since,
                deleted=deleted,
            )
            await self.load(backend, at)
            self._snapshot_revision = at
            return
        self._snapshot_revision = at
        current = self.header
        self.header = Header(at, current.cluster_id, current.member_id, current.raft_term)
        fresh = [kv for kv in changed.kvs if not self._reflects(kv)]
        if not fresh:
            self._notify_waiters()  # Nothing an observer derives changed.
            return
        log.info(
            "keyspace: keys modified before a progress notification's revision",
            root=self.root.decode(),
            revision=at,
            since=since,
            modified=len(fresh),
        )
        puts = [Event(EventType.PUT, kv) for kv in fresh]
        self.kvs, issues = apply_events(self.kvs, puts, self.decoder)
        # A snapshot skips versions and creations between revisions: only a value that fails
        # to decode is worth a warning.
        self._log_issues("progress", (i for i in issues if i.error is not None))
        self._keys = changed.count
        self._notify()

    def _reflects(self, kv: KeyValue) -> bool:
        """Whether the mirror holds ``kv``'s key at its revision or a later one."""
        i, found = self.index(kv.key)
        return found and self.kvs[i].kv.mod_revision >= kv.mod_revision

    async def wait_for_revision(self, revision: int, timeout_s: float) -> None:
        """Return once the mirror reflects ``revision``. Raises TimeoutError after
        ``timeout_s``, and WatchStoppedError if the watch ended first. A waiter behind asks
        for progress notifications (see the module docstring)."""
        loop = asyncio.get_running_loop()
        ask_at, every_s = loop.time() + progress_after_s, progress_after_s
        try:
            async with asyncio.timeout(timeout_s):
                while self.header.revision < revision:
                    if self._watch_stopped is not None:
                        raise WatchStoppedError(
                            f"keyspace {self.root!r}: watch ended at revision "
                            f"{self.header.revision}, before revision {revision}"
                        ) from self._watch_stopped
                    updated = self._updated
                    if loop.time() >= ask_at and self._watching is not None:
                        await self._watching.request_watch_progress()
                        every_s = min(progress_every_s_max, every_s * 2)
                        ask_at = loop.time() + every_s
                        if self.header.revision >= revision:
                            break
                    try:
                        async with asyncio.timeout(max(0.0, ask_at - loop.time())):
                            await updated.wait()
                    except TimeoutError:
                        continue  # Time to ask for progress (the outer bound still holds).
        except TimeoutError:
            raise TimeoutError(
                f"keyspace {self.root!r}: revision {revision} not reached within {timeout_s}s "
                f"(at {self.header.revision})"
            ) from None

    def _notify(self) -> None:
        for observer in list(self.observers):
            observer()
        self._notify_waiters()

    def _notify_waiters(self) -> None:
        updated, self._updated = self._updated, asyncio.Event()
        updated.set()

    def _log_issues(self, during: str, issues: Iterable[ApplyIssue]) -> None:
        for issue in issues:
            log.warning(
                f"keyspace: {issue.problem}",
                root=self.root.decode(),
                key=issue.key,
                during=during,
                error=repr(issue.error) if issue.error is not None else None,
            )
