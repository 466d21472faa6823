"""FragmentIndex: what a replica knows of its journal's content, and where each byte lives.

Every broker of a journal's route keeps one index, the source of every read it serves. It joins
two kinds of fragments in one CoverSet (see `cover_set.py` for why fragments covered by others
are dropped):

- *local* fragments: committed spans of this broker's spool, with the spool file holding their
  content. They arrive through `spool_commit` as the spool commits, one per commit (each newer
  one covers the previous one of the same fragment).
- *remote* fragments: those listed from the journal's BLOB stores (`replace_remote`, after each
  listing) or just uploaded by the persister (`add_persisted`). They carry `backing_store` and
  `mod_time`, and have no local file: reads of them go through the store.

A local fragment stays in the index until a remote fragment (or a contiguous run of them) covers
it. Only then is it dropped, so that a read never finds a hole between "no longer local" and
"not yet listed". Dropping it does not close its file: the index does not own spool files (the
spool owns the current one, the persister the completed ones), and a concurrent read may still be
using it. Readers that find a file closed under them simply query the index again, which by then
answers with the remote fragment.

Blocking reads at the write head wait in `wait_for`, woken by each update of the index. Appends
wait for `first_refresh`: until the stores were listed once, the index cannot know the journal's
true end, and the primary must not propose an offset below it.

Gaps. Offsets no fragment covers are normal at a moment (content still being persisted by a
previous primary is listed a little later), and reads of them block. They are also left behind
for good when fragments are deleted (retention) or lost. A read may therefore jump forward over
a gap to the next *persisted* fragment, but only when that fragment is old enough that nothing
could still fill the gap (`offset_jump_age_s`), or when the read starts at offset 0 (the reader
wants "everything there is"). Gazette's rule, with Gazette's threshold.

Lost content. A gap can also be content that is gone: a fragment file that a listing showed
and a later listing no longer shows (deleted, not by retention), or an empty file where a
fragment should be (`StoreListing.damaged`). The index remembers such ranges (lost.py) until a
fragment covers them again, and a read of one, or a jump over one, answers with it
(`QueryResult.lost`) instead of blocking or skipping: the broker fails the read with DATA_LOSS
(read_api.py). A listing may run while this broker uploads a fragment, and miss it: fragments
indexed by `add_persisted` after the listing began (`listing_mark`) are kept, not taken for
vanished. A fragment a read finds missing from its store past the journal's retention was
pruned since the last listing, not lost: the read fails UNAVAILABLE (retried) and the
refresher lists the stores again at once (`pruned_since_listing`), after which reads go on
past the pruned range as the listing shows it.

The index is driven by one event loop and holds no I/O of its own; `IndexRefresher` (below) is
the small async shell that lists the stores periodically.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from broker.fragment.cover_set import CoverSet
from broker.fragment.lost import LostFragment, lost_in_gap, past_retention, update_lost
from broker.fragment.spool import LocalFragment
from broker.fragment.spool_file import SpoolFile
from broker.fragment.stores.base import StoreError, StoreListing
from broker.fragment.stores.registry import StoreRegistry
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import ValidationError

log = get_logger(__name__)

# A read of an offset no fragment covers may jump to the next persisted fragment only once that
# fragment is at least this old: by then, any fragment that could fill the gap (being uploaded by
# an earlier primary, say) would have been listed.
offset_jump_age_s: Final = 6 * 3600.0

# Fragments this broker persisted, remembered until a listing that began after them: bounds the
# memory of a refresher whose listings keep failing.
recent_persisted_max: Final = 4096
# Refresh intervals are clamped to this range whatever the spec says (it is validated to the
# same range; the clamp protects against a spec that bypassed validation).
refresh_interval_min_s: Final = 1.0
refresh_interval_max_s: Final = 24 * 3600.0
# A listing asked for by a read (a fragment pruned since the last one) waits this long first,
# so that one listing serves every read that asks meanwhile.
relist_delay_s: Final = 1.0
# One listing of all of a journal's stores may take at most this long before it counts as failed.
store_list_timeout_s_default: Final = 300.0
# A failed listing is retried sooner than the next regular refresh: first after this delay,
# doubling up to the refresh interval.
refresh_retry_backoff_initial_s: Final = 1.0


class IndexClosedError(Exception):
    """The index was closed (its replica was torn down); nothing more will be indexed."""


class IndexInvariantError(AssertionError):
    """An internal invariant broke: a bug, not bad input. Raised explicitly (not by `assert`)."""


@dataclass(frozen=True, slots=True)
class IndexedFragment:
    """A fragment of the index: local when `file` holds its content, remote otherwise.

    `fragment` is owned by the index and never mutated; queries hand out copies."""

    fragment: pb.Fragment
    file: SpoolFile | None = None

    @property
    def begin(self) -> int:
        return self.fragment.begin

    @property
    def end(self) -> int:
        return self.fragment.end

    @property
    def mod_time(self) -> int:
        return self.fragment.mod_time


@dataclass(frozen=True, slots=True)
class QueryResult:
    """The answer to a read at some offset.

    `offset` is where the read continues: the requested offset, the write head for a request of
    -1, or further on after a jump over a gap or over fragments older than `begin_mod_time`.
    `fragment` (a copy) covers `offset`, or is None if nothing does yet; `file` is its local
    content (None for a remote fragment). `write_head` is the index's end offset. `lost` is set
    (and `fragment` None) when the content at `offset` is known to be lost."""

    offset: int
    write_head: int
    fragment: pb.Fragment | None
    file: SpoolFile | None
    lost: LostFragment | None = None

    @property
    def found(self) -> bool:
        return self.fragment is not None


def _copy(fragment: pb.Fragment) -> pb.Fragment:
    out = pb.Fragment()
    out.CopyFrom(fragment)
    return out


class FragmentIndex:
    """The index of one journal (see the module docstring). Use from one event loop."""

    def __init__(self, journal: str, *, clock: Callable[[], float] = time.time) -> None:
        self.journal = journal
        self._clock = clock
        self._set: CoverSet[IndexedFragment] = CoverSet()
        self._local: CoverSet[IndexedFragment] = CoverSet()
        # The persisted fragments alone: in `_set`, a local fragment wider than persisted ones
        # drops them (reads are served either way), yet what the store holds is asked too
        # (`persisted_fragments`: a quorum log compacts what its store holds).
        self._persisted: CoverSet[IndexedFragment] = CoverSet()
        self._lost: CoverSet[LostFragment] = CoverSet()
        # Fragments indexed by add_persisted, numbered, until a listing that began after them.
        self._persisted_seq = 0
        self._recent_persisted: list[tuple[int, IndexedFragment]] = []
        # Replaced on every update; waiters hold the one current when they started waiting.
        self._changed = asyncio.Event()
        self.first_refresh = asyncio.Event()
        # Set when a read found a listed fragment pruned: the refresher lists the stores soon
        # rather than at its interval (`IndexRefresher`).
        self.relist_wanted = asyncio.Event()
        self._closed = False

    # --- Views ------------------------------------------------------------------------------

    @property
    def begin_offset(self) -> int:
        return self._set.begin_offset

    @property
    def end_offset(self) -> int:
        """The write head as far as this index knows: the end of its last fragment."""
        return self._set.end_offset

    @property
    def has_local(self) -> bool:
        """Whether any local fragment is not yet covered by a persisted one."""
        return bool(self._local)

    @property
    def closed(self) -> bool:
        return self._closed

    def fragments(self) -> list[pb.Fragment]:
        """Copies of every fragment of the index, in offset order."""
        return [_copy(f.fragment) for f in self._set]

    def snapshot(self) -> list[IndexedFragment]:
        """The indexed fragments themselves (not copies): read, do not modify."""
        return list(self._set)

    def persisted_fragments(self) -> list[IndexedFragment]:
        """The persisted (remote) fragments the index knows, in offset order, whether or not a
        local fragment covers them in `snapshot` (read, do not modify)."""
        return list(self._persisted)

    def local_fragments(self) -> list[IndexedFragment]:
        return list(self._local)

    def lost_fragments(self) -> list[LostFragment]:
        """The ranges of lost content the index knows of, in offset order."""
        return list(self._lost)

    def listing_mark(self) -> int:
        """Take before listing the stores, and pass to `replace_remote(since=)`: fragments
        persisted after it are kept even if the listing misses them."""
        return self._persisted_seq

    # --- Updates ----------------------------------------------------------------------------

    def spool_commit(self, local: LocalFragment) -> None:
        """Index a spool commit: the committed fragment and the file holding its content."""
        self._check_open()
        self._check_journal(local.fragment)
        entry = IndexedFragment(local.fragment, local.file)
        # As in Gazette, both sets take it unconditionally: if a remote fragment already covers
        # it, the set keeps the remote one, and the next listing drops the local one.
        self._set.add(entry)
        self._local.add(entry)
        self._wake()

    # The Spool's observer hook has this name; a replica may pass the index's method through.
    on_commit = spool_commit

    def replace_remote(
        self,
        fragments: Iterable[pb.Fragment],
        *,
        since: int | None = None,
        damaged: Iterable[pb.Fragment] = (),
        listed_stores: Collection[str] | None = None,
        retention_s: float = 0.0,
    ) -> None:
        """Replace every remote fragment with `fragments` (one listing of all stores), keeping
        the local fragments that they do not cover. Sets `first_refresh`.

        With `listed_stores` (the stores listed), remote fragments of those stores that the
        listing no longer covers, and `damaged` ones, become lost ranges (see the module
        docstring); those within `retention_s` of their end (0: kept forever) were pruned.
        `since` is the `listing_mark` taken before listing."""
        self._check_open()
        remote: CoverSet[IndexedFragment] = CoverSet()
        for fragment in fragments:
            self._check_journal(fragment)
            remote.add(IndexedFragment(fragment))
        damaged = list(damaged)
        for fragment in damaged:
            self._check_journal(fragment)
        if since is not None:
            for seq, entry in self._recent_persisted:
                if seq > since:
                    remote.add(entry)  # Uploaded while the listing ran: it may lack it.
            self._recent_persisted = [(q, e) for q, e in self._recent_persisted if q > since]
        previous = [entry for entry in self._set if entry.file is None]
        self._persisted = remote.copy()  # Before the local fragments join it.
        self._local = self._local.difference(remote)
        for entry in self._local:
            # Not covered by the union of remote fragments, so by none of them alone.
            if not remote.add(entry):
                raise IndexInvariantError(
                    f"index of {self.journal}: local fragment [{entry.begin}, {entry.end}) is"
                    " covered by a remote fragment after their difference was taken"
                )
        self._set = remote
        if listed_stores is not None:
            self._lost = update_lost(
                self._lost,
                self._set.contiguous_runs(),
                previous=[entry.fragment for entry in previous],
                damaged=damaged,
                stores=set(listed_stores),
                retention_s=retention_s,
                now=self._clock(),
                journal=self.journal,
            )
        self._wake()
        self.first_refresh.set()

    def add_persisted(self, fragment: pb.Fragment) -> None:
        """Index a fragment just uploaded by this broker (backing_store and mod_time set). The
        local fragment it covers is dropped, so reads now go through the store."""
        self._check_open()
        self._check_journal(fragment)
        if not fragment.backing_store:
            raise ValidationError("must be set on a persisted fragment", "backing_store")
        entry = IndexedFragment(_copy(fragment))
        self._set.add(entry)
        self._persisted.add(entry)
        self._local = self._local.difference(CoverSet([entry]))
        self._persisted_seq += 1
        self._recent_persisted.append((self._persisted_seq, entry))
        del self._recent_persisted[:-recent_persisted_max]
        self._wake()

    def pruned_since_listing(self, fragment: pb.Fragment, retention_s: float) -> bool:
        """A read found `fragment`'s file missing from its store. True if it is a remote
        fragment of the index past the journal's retention (`retention_s`, 0: forever): it was
        pruned (`gazctl journals prune`) since the last listing, which is not loss. The index
        then asks for a new listing (`relist_wanted`) rather than drop it itself: a listing
        also brings back shorter fragments it covered, which may still hold part of its range.
        False: the missing file is lost content, and the caller says so."""
        self._check_open()
        if not past_retention(fragment, retention_s, self._clock()):
            return False
        if not any(entry.file is None and entry.fragment == fragment for entry in self._set):
            return False
        if not self.relist_wanted.is_set():
            log.info(
                "fragment pruned since the last listing: listing the stores again",
                journal=self.journal,
                begin=fragment.begin,
                end=fragment.end,
                store=fragment.backing_store,
            )
            self.relist_wanted.set()
        return True

    def close(self, *, close_files: bool = True) -> None:
        """Stop the index: waiters raise IndexClosedError, updates are refused. With
        `close_files`, the files of local fragments still held are closed: call it once the
        spool is closed and the persister done, when the index is the last user of the files
        it holds (e.g. those of a journal without stores, which are never persisted)."""
        if self._closed:
            return
        self._closed = True
        if close_files:
            for entry in self._local:
                if entry.file is not None:
                    entry.file.close()
        self._wake()

    # --- Queries ----------------------------------------------------------------------------

    def query(self, offset: int, *, begin_mod_time: int = 0) -> QueryResult:
        """Where a read of `offset` (-1: the write head) continues, without waiting."""
        self._check_open()
        if offset == -1:
            offset = self._set.end_offset
        if offset < 0:
            raise ValidationError(f"must be >= -1 (got {offset})", "offset")
        requested = offset
        items = self._set
        while True:
            ind, found = items.longest_overlapping_index(offset)
            if not found:
                # Lost content in the gap is answered, never skipped (see the module docstring).
                gap_end = items[ind].begin if ind != len(items) else None
                lost = lost_in_gap(self._lost, offset, gap_end)
                if lost is not None and lost.begin > offset:
                    if not self._may_jump(requested, lost.fragment.mod_time):
                        return QueryResult(offset, items.end_offset, None, None)
                    offset = lost.begin
                if lost is not None:
                    if lost.fragment.mod_time != 0 and lost.fragment.mod_time < begin_mod_time:
                        offset = lost.end  # Older than the reader wants: nothing lost for it.
                        continue
                    return QueryResult(offset, items.end_offset, None, None, lost)
            if not found and ind != len(items) and self._may_jump(requested, items[ind].mod_time):
                offset, found = items[ind].begin, True
            if not found:
                return QueryResult(offset, items.end_offset, None, None)
            entry = items[ind]
            if entry.mod_time != 0 and entry.mod_time < begin_mod_time:
                # Persisted before the reader's lower bound: skip over its content. Each skip
                # moves strictly forward, past one fragment, so the loop ends.
                offset = entry.end
                continue
            return QueryResult(offset, items.end_offset, _copy(entry.fragment), entry.file)

    def _may_jump(self, requested: int, mod_time: int) -> bool:
        """Whether a read of `requested` may jump a gap to content persisted at `mod_time`."""
        if mod_time == 0:
            return False  # Local only: the gap before it may still be filled by a listing.
        return requested == 0 or mod_time < self._clock() - offset_jump_age_s

    async def wait_for(
        self, offset: int, *, begin_mod_time: int = 0, timeout_s: float | None = None
    ) -> QueryResult:
        """Like `query`, but wait until a fragment covers the read (blocking reads at the head),
        or the read is of lost content (`lost` is set).

        An `offset` of -1 is resolved to the write head once, on entry. Raises TimeoutError
        after `timeout_s` (None: no limit), and IndexClosedError if the index is closed."""
        result = self.query(offset, begin_mod_time=begin_mod_time)
        offset = result.offset
        async with asyncio.timeout(timeout_s):
            while not result.found and result.lost is None:
                await self._changed.wait()
                result = self.query(offset, begin_mod_time=begin_mod_time)
        return result

    async def wait_first_refresh(self, timeout_s: float | None = None) -> None:
        """Return once the stores were listed at least once. Raises TimeoutError, and
        IndexClosedError if the index is closed first."""
        async with asyncio.timeout(timeout_s):
            while not self.first_refresh.is_set():
                self._check_open()
                await self._changed.wait()

    # --- Internals --------------------------------------------------------------------------

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _check_open(self) -> None:
        if self._closed:
            raise IndexClosedError(f"index of {self.journal} is closed")

    def _check_journal(self, fragment: pb.Fragment) -> None:
        if fragment.journal != self.journal:
            raise ValidationError(
                f"must be the index's journal {self.journal!r} (got {fragment.journal!r})",
                "journal",
            )

    def __repr__(self) -> str:
        return f"FragmentIndex<{self.journal} {self._set!r} local={len(self._local)}>"


# --- Refreshing from the stores -------------------------------------------------------------------


SpecSource = Callable[[], pb.JournalSpec | None]


def refresh_interval_s(spec: pb.JournalSpec) -> float:
    """The spec's refresh interval, clamped to [refresh_interval_min_s, refresh_interval_max_s]."""
    interval = spec.fragment.refresh_interval.ToNanoseconds() / 1e9
    return min(max(interval, refresh_interval_min_s), refresh_interval_max_s)


async def list_stores(registry: StoreRegistry, journal: str, stores: Sequence[str]) -> StoreListing:
    """Every fragment of `journal` in each of `stores`, in store order, and the damaged ones."""
    out = StoreListing([], [])
    for url in stores:
        listing = await registry.get(url).listing(journal)
        out.fragments.extend(listing.fragments)
        out.damaged.extend(listing.damaged)
    return out


def retention_s(spec: pb.JournalSpec) -> float:
    """The spec's fragment retention in seconds (0: kept forever)."""
    return spec.fragment.retention.ToNanoseconds() / 1e9


class IndexRefresher:
    """Keeps an index's remote fragments current by listing the journal's stores, every
    `refresh_interval` of the journal's spec (read anew before each listing, so that a changed
    interval or store list takes effect at the next one)."""

    def __init__(
        self,
        index: FragmentIndex,
        spec: SpecSource,
        registry: StoreRegistry,
        *,
        list_timeout_s: float = store_list_timeout_s_default,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if list_timeout_s <= 0:
            raise ValueError(f"list_timeout_s: must be > 0 (got {list_timeout_s})")
        self._index = index
        self._spec = spec
        self._registry = registry
        self._list_timeout_s = list_timeout_s
        self._sleep = sleep
        self.failures = 0  # Consecutive failed refreshes.

    async def refresh(self) -> bool:
        """List the stores once and replace the index's remote fragments. Returns False (and
        changes nothing) if the journal has no spec any more."""
        spec = self._spec()
        if spec is None:
            return False
        stores = list(spec.fragment.stores)
        mark = self._index.listing_mark()
        async with asyncio.timeout(self._list_timeout_s):
            listing = await list_stores(self._registry, self._index.journal, stores)
        self._index.replace_remote(
            listing.fragments,
            since=mark,
            damaged=listing.damaged,
            listed_stores=stores,
            retention_s=retention_s(spec),
        )
        return True

    async def step(self) -> float:
        """One refresh; returns the delay before the next one. Store failures are logged and
        retried sooner (bounded back-off); anything else is a bug and propagates."""
        spec = self._spec()
        interval = refresh_interval_s(spec) if spec is not None else refresh_interval_max_s
        try:
            await self.refresh()
        except (StoreError, ValidationError, OSError, TimeoutError) as err:
            self.failures += 1
            delay = min(interval, refresh_retry_backoff_initial_s * 2.0 ** (self.failures - 1))
            log.warning(
                "fragment index refresh failed (will retry)",
                journal=self._index.journal,
                error=str(err),
                failures=self.failures,
                delay_s=delay,
            )
            return delay
        self.failures = 0
        return interval

    async def run(self) -> None:
        """Refresh until cancelled or the index is closed; sooner when the index asks for a
        listing (`FragmentIndex.relist_wanted`), at most every `relist_delay_s`."""
        while not self._index.closed:
            try:
                delay = await self.step()
            except IndexClosedError:
                return  # Closed during a listing: the replica is going away.
            await self._pause(delay)

    async def _pause(self, delay: float) -> None:
        wanted = self._index.relist_wanted
        if not wanted.is_set():
            sleeping = asyncio.ensure_future(self._sleep(delay))
            woken = asyncio.ensure_future(wanted.wait())
            try:
                await asyncio.wait({sleeping, woken}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (sleeping, woken):
                    task.cancel()
                await asyncio.gather(sleeping, woken, return_exceptions=True)
        if wanted.is_set():
            # Requests within the delay are served by one listing (bounded rate, however many
            # readers find the same fragment pruned).
            await self._sleep(relist_delay_s)
            wanted.clear()
