"""The FragmentStore interface: where persisted fragment files live, and how they are named.

A fragment store is named by a URL, Gazette's `protocol.FragmentStore`: a scheme choosing the
backend (`file`, `s3`, `gs`, `azure`, `azure-ad`, or our in-process `memory` fake), a host (the
bucket, for object stores), a path ending in '/' that roots every key (for azure-ad://, after
its account and container segments: see `key_prefix`), and query arguments configuring the
backend. The
URL string itself is written into `Fragment.backing_store` of every fragment listed from it.

The split between this base class and the backends mirrors Gazette's: backends only move bytes
under keys (put, get, head, list, delete, sign); this class turns Fragments into keys and keys
back into Fragments, with every rule of naming (see `naming.py`) in one place.

Content handed to `put()` is already compressed with the fragment's codec, and `open()` returns
the stored bytes as they are: decompression is the reader's business. For
GZIP_OFFLOAD_DECOMPRESSION the file is stored with `Content-Encoding: gzip`, so that an HTTP
client following a signed URL may have the store (or its own transport) decompress it.

Semantics every backend keeps (and `conformance.check_blob_store` verifies):
- put is atomic (a reader sees the whole file or none) and idempotent: names are content
  addresses, so putting a name that exists leaves equivalent content in place.
- open of a missing fragment raises FragmentNotFoundError; exists says False. Signing does not
  look the file up (an S3 presigned URL is computed locally): its reader finds out.
- delete of a missing fragment is a no-op (object stores cannot tell the difference cheaply,
  and retention pruning must be retryable).
- list returns every fragment of a journal, under every path postfix, with `mod_time` and
  `backing_store` set; keys that are not canonical fragment names are logged and skipped.
  Files that cannot hold their fragment (empty, for a non-empty fragment) are skipped too, but
  `listing` reports them as `damaged`: the fragment index must know that the content of their
  range is lost (broker/fragment/index.py), rather than take the range for a gap.
"""

from __future__ import annotations

import abc
import asyncio
import builtins
import contextlib
import io
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import BinaryIO, Protocol, TypeVar
from urllib.parse import parse_qs, urlsplit

from broker.fragment import naming
from broker.fragment.codecs import CompressionCodec
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import ValidationError

log = get_logger(__name__)

T = TypeVar("T")

# Signed URLs live at most a week: S3 refuses longer presigned URLs, and a reader holding a URL
# longer than that is a bug.
signed_url_ttl_max_s = 7 * 24 * 3600.0
# Reads through a store stream in pieces of at most this size.
read_chunk_bytes_default = 1 << 20


class StoreError(Exception):
    """A fragment store operation failed (I/O, network, permissions, a malformed response)."""


class StoreURLError(ValidationError):
    """A fragment store URL, or one of its query arguments, is not acceptable."""


class FragmentNotFoundError(StoreError):
    """The fragment's file does not exist in the store."""

    def __init__(self, store_url: str, key: str) -> None:
        super().__init__(f"fragment store {store_url}: no file at key {key!r}")
        self.store_url = store_url
        self.key = key


@dataclass(frozen=True)
class StoreURL:
    """A parsed fragment store URL. `prefix` is the path without its leading '/' (so "" or
    ending in '/'), prepended to every key; `args` are query arguments keyed in lower case."""

    url: str
    scheme: str
    host: str
    prefix: str
    args: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, url: str) -> StoreURL:
        parts = urlsplit(url)
        if not parts.scheme:
            raise StoreURLError(f"must be an absolute URL with a scheme (got {url!r})")
        if not parts.path.endswith("/"):
            raise StoreURLError(f"path must end in '/' (got {url!r})")
        args: dict[str, str] = {}
        try:
            query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        except ValueError as err:
            raise StoreURLError(f"malformed query ({err}) (got {url!r})") from None
        for key, values in query.items():
            # Gazette decodes arguments into struct fields matched case-insensitively.
            lowered = key.lower()
            if len(values) != 1 or lowered in args:
                raise StoreURLError(f"query argument {key!r} is repeated (got {url!r})")
            args[lowered] = values[0]
        return cls(url, parts.scheme, parts.hostname or "", parts.path[1:], args)

    def take_args(self, allowed: Iterable[str]) -> dict[str, str]:
        """The query arguments, refusing any not in `allowed` (lower case): a misspelled
        argument silently ignored would be a misconfigured store in production."""
        allowed_set = set(allowed)
        unknown = sorted(set(self.args) - allowed_set)
        if unknown:
            raise StoreURLError(
                f"unknown query argument(s) {', '.join(unknown)} for a {self.scheme}:// store"
                f" (allowed: {', '.join(sorted(allowed_set)) or 'none'}) (got {self.url!r})"
            )
        return dict(self.args)


@dataclass(frozen=True)
class StoreListing:
    """One listing of a journal's fragments in a store: `fragments` usable, in key order, and
    `damaged` ones whose files cannot hold their content (skipped from `fragments`)."""

    fragments: list[pb.Fragment]
    damaged: list[pb.Fragment]


@dataclass(frozen=True)
class ListedObject:
    """One object of a backend listing: its key relative to the listed prefix."""

    rel_path: str
    mod_time_s: int
    size: int


Content = bytes | bytearray | memoryview | BinaryIO


class FragmentReader(abc.ABC):
    """A stream of a fragment file's stored bytes. Close it (or use `async with`)."""

    @abc.abstractmethod
    async def read(self, size: int = read_chunk_bytes_default) -> bytes:
        """Up to `size` bytes; b"" at end of file."""

    @abc.abstractmethod
    async def aclose(self) -> None: ...

    async def read_all(self, bytes_max: int) -> bytes:
        """The rest of the file, refusing to buffer more than `bytes_max` bytes."""
        chunks: list[bytes] = []
        total = 0
        while chunk := await self.read():
            total += len(chunk)
            if total > bytes_max:
                raise StoreError(f"fragment file exceeds {bytes_max} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def __aenter__(self) -> FragmentReader:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


class BlockingReader(FragmentReader):
    """Wraps a blocking file-like (a local file, an S3 body, an HTTP response), reading it in a
    worker thread so the event loop never blocks on disk or network."""

    def __init__(self, raw: _Readable) -> None:
        self._raw = raw

    async def read(self, size: int = read_chunk_bytes_default) -> bytes:
        return await asyncio.to_thread(self._raw.read, size)

    async def aclose(self) -> None:
        # Closing runs to completion even if the caller is cancelled meanwhile (a reader that
        # stopped reading, a cancelled RPC): a plain to_thread cancelled before a worker picked
        # it up would never close, leaving the file to the collector.
        await run_to_completion(self._raw.close)


class BytesReader(FragmentReader):
    """A reader over bytes already in memory."""

    def __init__(self, data: bytes) -> None:
        self._buf = io.BytesIO(data)

    async def read(self, size: int = read_chunk_bytes_default) -> bytes:
        return self._buf.read(size)

    async def aclose(self) -> None:
        self._buf.close()


async def run_blocking_put(fn: Callable[[], None]) -> None:
    """Run a blocking write in a worker thread and wait for it to end, even when cancelled.

    A thread cannot be interrupted: if the awaiting task were let go at cancellation, the write
    would outlive it (a temporary file still being written, a multipart upload still running)
    while its caller believes it over, say a broker that has stopped. So cancellation waits for
    the write to finish, then propagates."""
    await run_to_completion(fn)


async def run_to_completion(fn: Callable[[], T], discard: Callable[[T], None] | None = None) -> T:
    """Run blocking `fn` in a worker thread and return its result; if cancelled meanwhile,
    wait for the thread to end (see run_blocking_put), hand a result nobody will take to
    `discard`, and propagate the cancellation."""
    task = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([task])
        if not task.cancelled():
            if task.exception() is None and discard is not None:
                discard(task.result())
            # Otherwise retrieved: the cancellation, not the thread's outcome, stands.
        raise


def content_encoding_of(fragment: pb.Fragment) -> str:
    """The HTTP Content-Encoding a store sets on the fragment's file ("" for none)."""
    if int(fragment.compression_codec) == CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION:
        return "gzip"
    return ""


def as_bytes_io(content: Content) -> BinaryIO:
    """Content as a readable binary stream (from its current position, for file objects)."""
    if isinstance(content, bytes | bytearray | memoryview):
        return io.BytesIO(bytes(content))
    return content


class FragmentStore(abc.ABC):
    """A BLOB store of fragment files, rooted at a store URL. See the module docstring."""

    def __init__(self, url: StoreURL, *, find: str = "", replace: str = "") -> None:
        self._url = url
        # Gazette's RewriterConfig: remaps part of journal names within keys.
        self._find = find
        self._replace = replace

    @property
    def url(self) -> str:
        """The store URL, as written into Fragment.backing_store."""
        return self._url.url

    @property
    def key_prefix(self) -> str:
        """The root of every key: the URL's path without its leading '/' for most stores
        ("" or ending in '/'); for azure-ad://, the part after the account and container."""
        return self._url.prefix

    def key(self, fragment: pb.Fragment) -> str:
        """The fragment's key within this store."""
        return naming.object_key(self._url.prefix, fragment, self._find, self._replace)

    async def put(self, fragment: pb.Fragment, content: Content) -> None:
        """Store `content` (already compressed with the fragment's codec) as the fragment's
        file, atomically. Putting a fragment that exists is a no-op in effect."""
        await self._put(self.key(fragment), content, content_encoding_of(fragment))

    async def open(self, fragment: pb.Fragment) -> FragmentReader:
        """A reader of the fragment file's stored (still compressed) bytes."""
        return await self._open(self.key(fragment))

    async def read(self, fragment: pb.Fragment, bytes_max: int) -> bytes:
        """The whole stored file, refusing files larger than `bytes_max`."""
        async with await self.open(fragment) as reader:
            return await reader.read_all(bytes_max)

    async def exists(self, fragment: pb.Fragment) -> bool:
        return await self._exists(self.key(fragment))

    async def delete(self, fragment: pb.Fragment) -> None:
        """Remove the fragment's file; a no-op if it is absent."""
        await self._delete(self.key(fragment))

    async def signed_url(self, fragment: pb.Fragment, ttl_s: float) -> str:
        """A URL that lets its bearer GET the fragment file for `ttl_s` seconds."""
        if not 0 < ttl_s <= signed_url_ttl_max_s:
            raise ValidationError(f"must be in (0, {signed_url_ttl_max_s}] (got {ttl_s})", "ttl_s")
        return await self._sign(self.key(fragment), ttl_s)

    async def list(
        self, journal: str, path_postfix: str | None = None
    ) -> builtins.list[pb.Fragment]:
        """Every fragment of `journal` in this store (only those under `path_postfix`, if
        given), in key order, with mod_time and backing_store set."""
        return (await self.listing(journal, path_postfix)).fragments

    async def listing(self, journal: str, path_postfix: str | None = None) -> StoreListing:
        """Like `list`, also naming the damaged fragments it skips (see the module
        docstring)."""
        prefix = naming.journal_prefix(self._url.prefix, journal, self._find, self._replace)
        out = StoreListing([], [])
        for obj in await self._list(prefix):
            fragment = self._parse_listed(journal, obj)
            if fragment is None:
                continue
            if path_postfix is not None and fragment.path_postfix != path_postfix:
                continue
            if obj.size == 0 and fragment.end > fragment.begin:
                # An empty object cannot hold non-empty content: a failed upload, or a file
                # emptied since. Its range must not be read as a gap (see `listing`).
                log.warning("zero-length fragment file", store=self.url, path=obj.rel_path)
                out.damaged.append(fragment)
            else:
                out.fragments.append(fragment)
        return out

    def _parse_listed(self, journal: str, obj: ListedObject) -> pb.Fragment | None:
        if obj.rel_path.endswith("/"):
            return None  # Directory placeholder objects, e.g. from FUSE-mounted buckets.
        try:
            fragment = naming.parse_fragment_from_relative_path(journal, obj.rel_path)
        except ValidationError as err:
            log.warning("skipping unparseable fragment file", store=self.url, err=str(err))
            return None
        if not naming.is_canonical(fragment, obj.rel_path):
            log.warning("skipping non-canonical fragment name", store=self.url, path=obj.rel_path)
            return None
        fragment.mod_time = obj.mod_time_s
        fragment.backing_store = self.url
        return fragment

    async def close(self) -> None:
        """Release clients and connections. The default has nothing to release."""
        return None

    # --- Backend operations on keys -----------------------------------------------------------

    @abc.abstractmethod
    async def _put(self, key: str, content: Content, content_encoding: str) -> None: ...

    @abc.abstractmethod
    async def _open(self, key: str) -> FragmentReader: ...

    @abc.abstractmethod
    async def _exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    async def _delete(self, key: str) -> None: ...

    @abc.abstractmethod
    async def _sign(self, key: str, ttl_s: float) -> str: ...

    @abc.abstractmethod
    async def _list(self, prefix: str) -> builtins.list[ListedObject]:
        """Objects whose key starts with `prefix` (recursively), keys relative to it."""
