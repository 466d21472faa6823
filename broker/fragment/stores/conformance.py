"""check_blob_store: the behaviour every FragmentStore must have, as runnable library code.

Run it against any store (a new backend, a fault-injecting wrapper, a real bucket) to check it
keeps the contract the persister, the index and readers rely on (see `base.py`):

    await check_blob_store(FileStore(StoreURL.parse("file:///"), root=tmp_dir))

It writes only under a fresh journal name (so a shared bucket is safe to use) and deletes
what it wrote. Failures raise `ConformanceError` naming the broken expectation.
"""

from __future__ import annotations

import io
import secrets
from collections.abc import Callable

from broker.fragment import naming
from broker.fragment.codecs import CompressionCodec, compress, decompress
from broker.fragment.stores.base import FragmentNotFoundError, FragmentStore
from broker.fragment.stores.registry import open_url
from broker.protocol import protocol_pb2 as pb

# Files written by the check are small; refuse to buffer anything larger when reading back.
check_file_bytes_max = 1 << 20
signed_url_ttl_s = 60.0


class ConformanceError(AssertionError):
    """A store broke its contract."""


def _expect(ok: bool, what: str) -> None:
    # Not `assert`: this is library code, and `python -O` must not turn the check off.
    if not ok:
        raise ConformanceError(what)


def _identity(f: pb.Fragment) -> tuple[object, ...]:
    # The fields a listing must reproduce from the name alone.
    return (
        f.journal,
        f.begin,
        f.end,
        naming.digest_of_sum(f.sum),
        f.compression_codec,
        f.path_postfix,
    )


def _make(
    journal: str, begin: int, content: bytes, codec: CompressionCodec, postfix: str = ""
) -> tuple[pb.Fragment, bytes]:
    fragment = pb.Fragment(
        journal=journal,
        begin=begin,
        end=begin + len(content),
        sum=naming.content_sum(content),
        compression_codec=naming.pb_codec(codec),
        path_postfix=postfix,
    )
    return fragment, compress(codec, content)


async def check_blob_store(
    store: FragmentStore,
    *,
    journal: str | None = None,
    token: Callable[[], str] = lambda: secrets.token_hex(8),
) -> None:
    """Exercise put / open / exists / list / delete / signed_url of `store`."""
    journal = journal or f"conformance/{token()}/journal"
    _expect(await store.list(journal) == [], f"fresh journal {journal} lists no fragments")

    base = b"".join(b"line %d of the conformance journal\n" % i for i in range(200))
    cases = [
        _make(journal, 0, base, CompressionCodec.NONE),
        _make(journal, len(base), base[:1000], CompressionCodec.GZIP, "a=1/b=2"),
        _make(journal, len(base) + 1000, base[:3000], CompressionCodec.ZSTANDARD),
        _make(journal, len(base) + 4000, base[:500], CompressionCodec.SNAPPY, "a=1/b=3"),
        _make(journal, len(base) + 4500, base[:700], CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION),
        # Overlaps others: stores hold any fragmentation; the index sorts it out.
        _make(journal, 10, base[10:20], CompressionCodec.NONE),
    ]
    missing, _ = _make(journal, 1 << 40, b"never written", CompressionCodec.NONE)

    _expect(not await store.exists(missing), "exists() of an absent fragment is False")
    try:
        await store.open(missing)
    except FragmentNotFoundError:
        pass
    else:
        raise ConformanceError("open() of an absent fragment raises FragmentNotFoundError")

    for i, (fragment, stored) in enumerate(cases):
        _expect(not await store.exists(fragment), f"fragment {i} absent before put")
        # Bytes, seekable file objects, and streams that cannot seek (as the persister hands
        # over a spool file's section) are all accepted content.
        content: bytes | io.BufferedReader | io.BytesIO = stored
        if i % 3 == 1:
            content = io.BytesIO(stored)
        elif i % 3 == 2:
            content = io.BufferedReader(_Unseekable(stored))
        await store.put(fragment, content)
        _expect(await store.exists(fragment), f"fragment {i} exists after put")
        await _check_content(store, fragment, stored, f"fragment {i}")

    # Content-addressed puts are idempotent: a second identical put changes nothing.
    fragment, stored = cases[1]
    await store.put(fragment, stored)
    await _check_content(store, fragment, stored, "fragment 1 after a repeated put")

    listed = await store.list(journal)
    _expect(
        sorted(_identity(f) for f in listed) == sorted(_identity(f) for f, _ in cases),
        f"list() parses back exactly the fragments put (got {[naming.content_path(f) for f in listed]})",
    )
    for f in listed:
        _expect(f.backing_store == store.url, f"listed backing_store is the store URL ({f})")
        _expect(f.mod_time > 0, f"listed mod_time is set ({f})")

    only = await store.list(journal, path_postfix="a=1/b=2")
    _expect(
        [_identity(f) for f in only] == [_identity(cases[1][0])],
        "list(path_postfix=...) returns only that postfix's fragments",
    )

    for i, (fragment, stored) in enumerate(cases):
        url = await store.signed_url(fragment, signed_url_ttl_s)
        async with await open_url(url) as reader:
            got = await reader.read_all(check_file_bytes_max)
        _expect(got == stored, f"signed URL of fragment {i} reads the stored bytes ({url})")

    for i, (fragment, _) in enumerate(cases):
        await store.delete(fragment)
        _expect(not await store.exists(fragment), f"fragment {i} absent after delete")
    await store.delete(cases[0][0])  # Deleting again is a no-op.
    _expect(await store.list(journal) == [], "list() is empty once every fragment is deleted")


class _Unseekable(io.RawIOBase):
    """A readable stream that cannot seek or tell."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        return self._data.readinto(buffer)


async def _check_content(
    store: FragmentStore, fragment: pb.Fragment, stored: bytes, what: str
) -> None:
    got = await store.read(fragment, check_file_bytes_max)
    _expect(got == stored, f"{what}: open() returns the stored bytes")
    content = decompress(fragment.compression_codec, got)
    _expect(
        naming.content_sum(content) == fragment.sum,
        f"{what}: decompressed content matches the fragment's SHA1",
    )
    _expect(len(content) == fragment.end - fragment.begin, f"{what}: content length matches")
