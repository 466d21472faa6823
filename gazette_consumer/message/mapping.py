"""Mapping functions: which journal (and framing) a message is published to.

A *mapping function* takes a message and returns the `Partition` it goes to: a journal name and
that journal's content type (the value of its ``content-type`` label, which selects the
framing). Mappings choose among *partitions*: a set of journals, usually those matching a label
selector, kept current by a `PartitionsWatch` over the broker's List RPC. A static `Partitions`
works the same way, for tests and benchmarks.

- `random_mapping`: any partition, uniformly at random (no key, no ordering across messages).
- `modulo_mapping(key_fn)`: FNV-1a (32 bit) of the message key, modulo the number of
  partitions, over partitions sorted by name: the same key and journal names choose the same
  journal as Gazette's Go ``ModuloMapping``. Adding a partition moves most keys.
- `rendezvous_mapping(key_fn)`: highest-random-weight hashing. Each (key, journal) pair gets
  a pseudo-random weight and the heaviest journal wins, so adding a partition moves only the
  keys it now wins, and removing one moves only the keys it held. (Gazette's Go version weighs
  by XOR of two 32-bit FNV hashes, which gives some partitions half the keys and others a
  sixteenth; we use a mixing hash instead, so keyed assignments differ from Go's.)

With no partitions, every mapping raises `EmptyPartitionsError`.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Final, NamedTuple, TypeVar

from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import ValidationError, validate_journal_name
from gazette_consumer.message.framing import CONTENT_TYPE_LABEL

M = TypeVar("M")

_MASK64: Final = (1 << 64) - 1
_FNV32_OFFSET: Final = 0x811C9DC5
_FNV32_PRIME: Final = 0x01000193

# A rendezvous mapping remembers this many key → partition choices per partitions snapshot.
rendezvous_cache_entries_max_default: Final = 1 << 16


class Partition(NamedTuple):
    """A journal messages may be mapped to, and its content type."""

    journal: str
    content_type: str


class EmptyPartitionsError(LookupError):
    """No partition is available to map a message to (none match the selector, or the
    watch has not delivered its first snapshot)."""


class PartitionsWatchError(RuntimeError):
    """A partitions watch kept ending without delivering a snapshot."""


class InvalidPartitionsError(ValueError):
    """Partitions that cannot be mapped over (e.g. a journal listed twice)."""


class Partitions:
    """An immutable snapshot of partitions, sorted by journal name."""

    __slots__ = ("_items", "_seeds")

    def __init__(self, partitions: Iterable[Partition | tuple[str, str]] = ()) -> None:
        items = sorted(Partition(*p) for p in partitions)
        for index, item in enumerate(items):
            try:
                validate_journal_name(item.journal)
            except ValidationError as err:
                raise InvalidPartitionsError(f"partition journal {item.journal!r}: {err}") from err
            if index and items[index - 1].journal == item.journal:
                raise InvalidPartitionsError(f"journal {item.journal!r} is listed twice")
        self._items: tuple[Partition, ...] = tuple(items)
        # Per-journal hashes for rendezvous weights, computed on first use.
        self._seeds: tuple[int, ...] | None = None

    @classmethod
    def of_journals(cls, journals: Iterable[str], content_type: str) -> Partitions:
        """Partitions of the named journals, all of one content type."""
        return cls(Partition(journal, content_type) for journal in journals)

    @classmethod
    def from_list_response(cls, response: pb.ListResponse) -> Partitions:
        """The journals of a List snapshot; each one's content type is its label's value
        ("" without one: publishing to it then fails with UnknownContentTypeError)."""
        out = []
        for journal in response.journals:
            content_type = ""
            for label in journal.spec.labels.labels:
                if label.name == CONTENT_TYPE_LABEL:
                    content_type = label.value
                    break
            out.append(Partition(journal.spec.name, content_type))
        return cls(out)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Partition]:
        return iter(self._items)

    def __getitem__(self, index: int) -> Partition:
        return self._items[index]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Partitions) and self._items == other._items

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return f"Partitions({[p.journal for p in self._items]!r})"

    @property
    def journals(self) -> list[str]:
        return [p.journal for p in self._items]

    def rendezvous_seeds(self) -> tuple[int, ...]:
        """A 64-bit hash of each journal name, in partition order."""
        if self._seeds is None:
            self._seeds = tuple(hash64(p.journal.encode()) for p in self._items)
        return self._seeds

    def __call__(self) -> Partitions:
        """A snapshot is also its own partitions function."""
        return self


PartitionsFunc = Callable[[], Partitions]
MappingFunc = Callable[[M], Partition]
KeyFunc = Callable[[M], bytes | str]


def fnv1a32(data: bytes) -> int:
    """32-bit FNV-1a, as Go's ``hash/fnv.New32a``."""
    h = _FNV32_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV32_PRIME) & 0xFFFF_FFFF
    return h


def hash64(data: bytes) -> int:
    """A well-mixed 64-bit hash of `data` (BLAKE2b; stable across processes and versions)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def mix64(value: int) -> int:
    """A bijective 64-bit finalizer (SplitMix64's): nearby inputs give unrelated outputs."""
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def _key_bytes(key: bytes | str) -> bytes:
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    raise TypeError(f"mapping key: must be bytes or str (got {type(key).__name__})")


def _snapshot(partitions: PartitionsFunc) -> Partitions:
    snapshot = partitions()
    if not len(snapshot):
        raise EmptyPartitionsError("no partitions to map the message to")
    return snapshot


def random_mapping(
    partitions: Partitions | PartitionsFunc, *, rng: random.Random | None = None
) -> MappingFunc[object]:
    """Map each message to a partition chosen uniformly at random (`rng` for tests)."""
    uniform = (rng or random.Random()).random  # int(random() * n): 3x cheaper than randrange.
    if isinstance(partitions, Partitions):
        # A static snapshot (benchmarks, tools): map without calling or checking it again, as
        # this runs for every message published.
        items = partitions._items
        count = len(items)

        def static(message: object) -> Partition:
            if count == 1:
                return items[0]
            if not count:
                raise EmptyPartitionsError("no partitions to map the message to")
            return items[int(uniform() * count)]

        return static
    current: PartitionsFunc = partitions

    def mapping(message: object) -> Partition:
        snapshot = _snapshot(current)
        return snapshot._items[int(uniform() * len(snapshot._items))]

    return mapping


def modulo_mapping(key_fn: KeyFunc[M], partitions: Partitions | PartitionsFunc) -> MappingFunc[M]:
    """Map a message to partition ``fnv1a32(key) % len(partitions)``, as Gazette's Go
    ModuloMapping does (for the same journals and key bytes)."""
    current: PartitionsFunc = partitions  # A snapshot is its own partitions function.

    def mapping(message: M) -> Partition:
        snapshot = _snapshot(current)
        return snapshot[fnv1a32(_key_bytes(key_fn(message))) % len(snapshot)]

    return mapping


def rendezvous_choice(key: bytes, partitions: Partitions) -> Partition:
    """The partition of highest weight ``mix64(hash64(key) ^ hash64(journal))`` for `key`
    (ties, vanishingly rare, go to the first journal by name)."""
    if not len(partitions):
        raise EmptyPartitionsError("no partitions to map the message to")
    h = hash64(key)
    best, best_weight = 0, -1
    for index, seed in enumerate(partitions.rendezvous_seeds()):
        weight = mix64(h ^ seed)
        if weight > best_weight:
            best, best_weight = index, weight
    return partitions[best]


def rendezvous_mapping(
    key_fn: KeyFunc[M],
    partitions: Partitions | PartitionsFunc,
    *,
    cache_entries_max: int = rendezvous_cache_entries_max_default,
) -> MappingFunc[M]:
    """Map a message by rendezvous (highest random weight) hashing of its key. Choices are
    cached per snapshot (at most `cache_entries_max` keys), since weighing every partition
    per message is the expensive part and keys tend to repeat."""
    if cache_entries_max < 0:
        raise ValueError(f"cache_entries_max: must be >= 0 (got {cache_entries_max})")
    current: PartitionsFunc = partitions  # A snapshot is its own partitions function.
    cached_for: Partitions | None = None
    cache: dict[bytes, Partition] = {}

    def mapping(message: M) -> Partition:
        nonlocal cached_for
        snapshot = _snapshot(current)
        if cached_for is not snapshot:
            cache.clear()
            cached_for = snapshot
        key = _key_bytes(key_fn(message))
        found = cache.get(key)
        if found is None:
            found = rendezvous_choice(key, snapshot)
            if len(cache) >= cache_entries_max:
                cache.clear()  # Bounded: start over rather than track recency per hit.
            if cache_entries_max:
                cache[key] = found
        return found

    return mapping


# --- watching partitions ------------------------------------------------------------------------

# Consecutive failed watch attempts (no snapshot between them) before `PartitionsWatch.run`
# gives up and raises the last error.
watch_attempts_max_default: Final = 20
watch_backoff_initial_s: Final = 0.1
watch_backoff_max_s: Final = 5.0


class PartitionsWatch:
    """The current partitions of a journal watch, as a partitions function.

    `watch` opens a stream of List snapshots, typically
    ``lambda: watch_journals(client, "app=orders")``. Run `run()` in a TaskGroup for as long
    as the partitions are needed; it re-opens the stream when it ends or fails (with back-off,
    up to `attempts_max` consecutive failures). Calling the watch returns the latest snapshot
    (empty until the first arrives: await `ready()` first).
    """

    def __init__(
        self,
        watch: Callable[[], AsyncIterator[pb.ListResponse]],
        *,
        attempts_max: int = watch_attempts_max_default,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if attempts_max < 1:
            raise ValueError(f"attempts_max: must be >= 1 (got {attempts_max})")
        self._watch = watch
        self._attempts_max = attempts_max
        self._sleep = sleep
        self._current = Partitions()
        self._ready = asyncio.Event()
        self._changed = asyncio.Event()  # Replaced (after being set) at every snapshot.
        self.snapshots = 0  # Snapshots received, for observers and tests.

    def __call__(self) -> Partitions:
        return self._current

    async def ready(self) -> Partitions:
        """The first snapshot (or the latest, once there is one)."""
        await self._ready.wait()
        return self._current

    async def next_snapshot(self) -> Partitions:
        """The snapshot after the current one, once it arrives."""
        await self._changed.wait()
        return self._current

    async def run(self) -> None:
        """Follow the watch until cancelled; raise after `attempts_max` consecutive attempts
        that delivered no snapshot (the last one's error, or PartitionsWatchError)."""
        fruitless = 0  # Consecutive attempts without a snapshot.
        while True:
            error: Exception | None = None
            delivered = False
            try:
                async for response in self._watch():
                    self._current = Partitions.from_list_response(response)
                    self.snapshots += 1
                    self._ready.set()
                    changed, self._changed = self._changed, asyncio.Event()
                    changed.set()
                    delivered = True
            except Exception as err:
                error = err
            fruitless = 0 if delivered else fruitless + 1
            if fruitless >= self._attempts_max:
                if error is not None:
                    raise error
                raise PartitionsWatchError(f"watch ended {fruitless} times without a snapshot")
            delay = min(watch_backoff_max_s, watch_backoff_initial_s * 2.0 ** min(fruitless, 30))
            await self._sleep(delay)
