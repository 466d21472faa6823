"""memory:// — an in-process fragment store, the library's fake for tests and simulations.

Buckets live in a `MemoryBuckets` registry shared by every store opened on it (by default one
per process), so that two brokers of one test given the same URL see the same files, as they
would with a real store. Modification times come from an injectable clock, so that tests of
retention and of the index's "jump over old gaps" rule can control them.

URL form: `memory://<bucket>/<optional/prefix/>`. No query arguments but Gazette's `find` and
`replace` rewriting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

from broker.fragment.stores.base import (
    BytesReader,
    Content,
    FragmentNotFoundError,
    FragmentReader,
    FragmentStore,
    ListedObject,
    StoreURL,
    StoreURLError,
    as_bytes_io,
)

SCHEME = "memory"


@dataclass(frozen=True)
class MemoryObject:
    data: bytes
    mod_time_s: int
    content_encoding: str


class MemoryBuckets:
    """Named buckets of objects. Thread-safe, as store operations may run in worker threads."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, dict[str, MemoryObject]] = {}

    def put(self, bucket: str, key: str, data: bytes, content_encoding: str = "") -> None:
        obj = MemoryObject(bytes(data), int(self._clock()), content_encoding)
        with self._lock:
            self._buckets.setdefault(bucket, {})[key] = obj

    def get(self, bucket: str, key: str) -> MemoryObject | None:
        with self._lock:
            return self._buckets.get(bucket, {}).get(key)

    def delete(self, bucket: str, key: str) -> None:
        with self._lock:
            self._buckets.get(bucket, {}).pop(key, None)

    def items(self, bucket: str, prefix: str) -> list[tuple[str, MemoryObject]]:
        with self._lock:
            objects = self._buckets.get(bucket, {})
            return sorted((k, v) for k, v in objects.items() if k.startswith(prefix))

    def clear(self) -> None:
        with self._lock:
            self._buckets.clear()


# The process-wide buckets, used by stores opened through the registry.
default_buckets = MemoryBuckets()


def object_url(bucket: str, key: str) -> str:
    """A memory:// URL naming one object, as signed URLs of this store do."""
    return f"{SCHEME}://{bucket}/{quote(key)}"


def read_object_url(url: str, buckets: MemoryBuckets = default_buckets) -> FragmentReader:
    """A reader of the object a memory:// object URL names."""
    parts = urlsplit(url)
    bucket, key = parts.hostname or "", unquote(parts.path[1:])
    obj = buckets.get(bucket, key)
    if obj is None:
        raise FragmentNotFoundError(f"{SCHEME}://{bucket}/", key)
    return BytesReader(obj.data)


class MemoryStore(FragmentStore):
    def __init__(self, url: StoreURL, buckets: MemoryBuckets = default_buckets) -> None:
        if url.scheme != SCHEME:
            raise StoreURLError(f"scheme must be {SCHEME!r} (got {url.url!r})")
        if not url.host:
            raise StoreURLError(f"must name a bucket as the URL host (got {url.url!r})")
        args = url.take_args(("find", "replace"))
        super().__init__(url, find=args.get("find", ""), replace=args.get("replace", ""))
        self._bucket = url.host
        self._buckets = buckets

    async def _put(self, key: str, content: Content, content_encoding: str) -> None:
        # Read everything first, then publish in one step: readers never see a partial file.
        data = as_bytes_io(content).read()
        self._buckets.put(self._bucket, key, data, content_encoding)

    async def _open(self, key: str) -> FragmentReader:
        obj = self._buckets.get(self._bucket, key)
        if obj is None:
            raise FragmentNotFoundError(self.url, key)
        return BytesReader(obj.data)

    async def _exists(self, key: str) -> bool:
        return self._buckets.get(self._bucket, key) is not None

    async def _delete(self, key: str) -> None:
        self._buckets.delete(self._bucket, key)

    async def _sign(self, key: str, ttl_s: float) -> str:
        # Nothing to sign in-process; the URL is only meaningful to read_object_url.
        return object_url(self._bucket, key)

    async def _list(self, prefix: str) -> list[ListedObject]:
        return [
            ListedObject(key[len(prefix) :], obj.mod_time_s, len(obj.data))
            for key, obj in self._buckets.items(self._bucket, prefix)
        ]
