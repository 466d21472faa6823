"""From fragment store URLs to store instances, and from signed URLs to readers.

Journal specs name their stores by URL; brokers and readers turn each URL into one shared
store instance (clients and connection pools are per store, not per request), built by the
constructor registered for the URL's scheme. Tests and the simulation register their own
constructors (e.g. a fault-injecting wrapper) under the same schemes.

The cloud stores' modules (s3://, gs://, azure://) are imported when a URL of their scheme is
first built, not with this module: a process that only opens signed file:// URLs (a Spark
worker) never imports boto3 or another cloud SDK (tests/broker/fragment/
test_registry_lazy_stores.py).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from broker.fragment.stores.base import (
    BlockingReader,
    FragmentNotFoundError,
    FragmentReader,
    FragmentStore,
    StoreError,
    StoreURL,
    StoreURLError,
    read_chunk_bytes_default,
    run_to_completion,
)
from broker.fragment.stores.extras import lazy_constructor
from broker.fragment.stores.file_store import FileStore
from broker.fragment.stores.memory_store import (
    MemoryBuckets,
    MemoryStore,
    default_buckets,
    read_object_url,
)
from broker.protocol.validate import (
    FRAGMENT_STORE_SCHEMES,
    ValidationError,
    validate_fragment_store,
)

Constructor = Callable[[StoreURL], FragmentStore]

# How long fetching a signed URL may wait for the server to answer (or send more bytes).
url_timeout_s_default = 60.0
_HTTP_NOT_FOUND = 404


class StoreRegistry:
    """Store instances by URL, built on first use and then shared."""

    def __init__(self, constructors: Mapping[str, Constructor]) -> None:
        self._constructors = dict(constructors)
        self._stores: dict[str, FragmentStore] = {}

    def register(self, scheme: str, constructor: Constructor) -> None:
        """Use `constructor` for URLs of `scheme` from now on (already-built stores stay)."""
        self._constructors[scheme] = constructor

    def get(self, url: str) -> FragmentStore:
        """The store of `url`, validated with Gazette's FragmentStore rules."""
        store = self._stores.get(url)
        if store is not None:
            return store
        parsed = StoreURL.parse(url)
        if parsed.scheme in FRAGMENT_STORE_SCHEMES:
            try:
                validate_fragment_store(url)
            except ValidationError as err:
                raise StoreURLError(err.rule) from None
        constructor = self._constructors.get(parsed.scheme)
        if constructor is None:
            raise StoreURLError(
                f"unsupported fragment store scheme {parsed.scheme!r}"
                f" (supported: {', '.join(sorted(self._constructors))})"
            )
        store = constructor(parsed)
        self._stores[url] = store
        return store

    async def close(self) -> None:
        """Close every store built so far."""
        stores, self._stores = list(self._stores.values()), {}
        for store in stores:
            await store.close()


def new_registry(
    *, file_root: Path | str = "/", memory_buckets: MemoryBuckets = default_buckets
) -> StoreRegistry:
    """A registry of the built-in stores: file:// (rooted at `file_root`), s3://, memory://,
    and, when their extras are installed, gs://, azure:// and azure-ad://."""
    return StoreRegistry(
        {
            "file": lambda url: FileStore(url, root=file_root),
            "s3": lazy_constructor("broker.fragment.stores.s3_store", "S3Store", None),
            "memory": lambda url: MemoryStore(url, buckets=memory_buckets),
            "gs": lazy_constructor("broker.fragment.stores.gcs_store", "GCSStore", "gcs"),
            "azure": lazy_constructor(
                "broker.fragment.stores.azure_store", "AzureAccountStore", "azure"
            ),
            "azure-ad": lazy_constructor(
                "broker.fragment.stores.azure_store", "AzureADStore", "azure"
            ),
        }
    )


async def open_url(
    url: str,
    *,
    timeout_s: float = url_timeout_s_default,
    memory_buckets: MemoryBuckets = default_buckets,
    file_read_bytes_min: int = 0,
) -> FragmentReader:
    """A reader of the file a signed URL (from any built-in store's `signed_url`) names.

    Bytes are returned as stored: no HTTP content decoding is requested or applied. A file://
    URL's reader reads at least `file_read_bytes_min` bytes at a time (each read is a hop to a
    worker thread: a reader asking for small pieces of a large file may amortise the hops)."""
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        return read_object_url(url, memory_buckets)
    if scheme == "file":
        path = unquote(urlsplit(url).path)
        try:
            raw = await run_to_completion(lambda: open(path, "rb"), discard=lambda f: f.close())
            return _FileURLReader(raw, file_read_bytes_min)
        except FileNotFoundError:
            raise FragmentNotFoundError("file:///", path) from None
        except OSError as err:
            raise StoreError(f"opening {url}: {err}") from err
    if scheme in ("http", "https"):
        try:
            resp = await run_to_completion(
                lambda: urllib.request.urlopen(url, timeout=timeout_s),
                discard=lambda r: r.close(),
            )
        except urllib.error.HTTPError as err:
            err.close()
            if err.code == _HTTP_NOT_FOUND:
                parts = urlsplit(url)
                raise FragmentNotFoundError(
                    f"{parts.scheme}://{parts.netloc}/", unquote(parts.path[1:])
                ) from None
            raise StoreError(f"fetching signed URL: HTTP {err.code} {err.reason}") from None
        except (urllib.error.URLError, OSError) as err:
            raise StoreError(f"fetching signed URL: {err}") from err
        return BlockingReader(resp)
    raise StoreURLError(f"unsupported signed URL scheme {scheme!r}")


class _FileURLReader(BlockingReader):
    """A local file, read at least `read_bytes_min` bytes at a time."""

    def __init__(self, raw: BinaryIO, read_bytes_min: int) -> None:
        super().__init__(raw)
        self._read_bytes_min = read_bytes_min

    async def read(self, size: int = read_chunk_bytes_default) -> bytes:
        return await super().read(max(size, self._read_bytes_min))
