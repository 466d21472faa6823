"""Fragment stores: the conformance suite on memory://, file:// and s3:// (a real moto server),
plus each backend's own rules (URL arguments, atomic writes, listing hygiene). The shared rules
also run on gs:// and azure:// / azure-ad:// (emulators of conftest.py); their conformance and
own rules are in test_fragment_stores_cloud.py."""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from broker.fragment import naming
from broker.fragment.codecs import CompressionCodec, compress
from broker.fragment.stores.base import (
    Content,
    FragmentNotFoundError,
    FragmentReader,
    FragmentStore,
    StoreError,
    StoreURL,
    StoreURLError,
    as_bytes_io,
)
from broker.fragment.stores.conformance import ConformanceError, check_blob_store
from broker.fragment.stores.file_store import FileStore
from broker.fragment.stores.memory_store import MemoryBuckets, MemoryStore
from broker.fragment.stores.registry import StoreRegistry, new_registry, open_url
from broker.fragment.stores.s3_store import S3Store
from broker.protocol import protocol_pb2 as pb
from broker.testing.moto_server import MotoServer, credentials_env


def fragment(journal: str, begin: int, content: bytes, codec: CompressionCodec) -> pb.Fragment:
    return pb.Fragment(
        journal=journal,
        begin=begin,
        end=begin + len(content),
        sum=naming.content_sum(content),
        compression_codec=naming.pb_codec(codec),
    )


# --- Fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in credentials_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def bucket(moto: MotoServer) -> str:
    name = f"test-{secrets.token_hex(6)}"
    moto.create_bucket(name)
    return name


@pytest.fixture
async def s3_store(moto: MotoServer, bucket: str, aws_env: None) -> AsyncIterator[S3Store]:
    store = S3Store(StoreURL.parse(moto.store_url(bucket, "root/prefix/")))
    yield store
    await store.close()


@pytest.fixture
def file_store(tmp_path: Path) -> FileStore:
    (tmp_path / "fragments").mkdir()
    return FileStore(StoreURL.parse("file:///fragments/"), root=tmp_path)


@pytest.fixture
def memory_store() -> MemoryStore:
    return MemoryStore(StoreURL.parse("memory://bucket/some/prefix/"), buckets=MemoryBuckets())


# --- Conformance ------------------------------------------------------------------------------


async def test_memory_store_conforms() -> None:
    # Through the registry and the process-wide buckets, so that its signed URLs resolve.
    registry = new_registry()
    await check_blob_store(registry.get(f"memory://conformance-{secrets.token_hex(4)}/p/"))
    await registry.close()


async def test_file_store_conforms(file_store: FileStore) -> None:
    await check_blob_store(file_store)


async def test_file_store_at_filesystem_root_conforms(tmp_path: Path) -> None:
    # The Gazette default: URL paths are absolute file-system paths.
    store = new_registry().get(f"file://{tmp_path}/")
    await check_blob_store(store)


async def test_s3_store_conforms(s3_store: S3Store) -> None:
    await check_blob_store(s3_store)


async def test_s3_store_without_prefix_conforms(
    moto: MotoServer, bucket: str, aws_env: None
) -> None:
    store = new_registry().get(moto.store_url(bucket))
    await check_blob_store(store)
    await store.close()


class ForgetfulStore(MemoryStore):
    """Loses every put: the conformance suite must catch it."""

    async def _put(self, key: str, content: Content, content_encoding: str) -> None:
        return None


class CorruptingStore(MemoryStore):
    """Stores content with one byte changed."""

    async def _put(self, key: str, content: Content, content_encoding: str) -> None:
        data = bytearray(as_bytes_io(content).read())
        data[-1] ^= 1
        await super()._put(key, bytes(data), content_encoding)


@pytest.mark.parametrize("cls", [ForgetfulStore, CorruptingStore])
async def test_conformance_catches_broken_stores(cls: type[MemoryStore]) -> None:
    store = cls(StoreURL.parse("memory://broken/"), buckets=MemoryBuckets())
    with pytest.raises(ConformanceError):
        await check_blob_store(store)


# --- Shared rules, on every backend -----------------------------------------------------------


@pytest.fixture(params=["memory", "file", "s3", "gcs", "azure", "azure_ad"])
def any_store(request: pytest.FixtureRequest) -> FragmentStore:
    store: FragmentStore = request.getfixturevalue(f"{request.param}_store")
    return store


async def test_keys_follow_store_prefix_and_content_path(any_store: FragmentStore) -> None:
    f = fragment("a/journal", 0, b"x", CompressionCodec.NONE)
    f.path_postfix = "p=1"
    assert any_store.key(f) == any_store.key_prefix + "a/journal/p=1/" + naming.content_name(f)


async def test_open_reads_in_bounded_chunks(any_store: FragmentStore) -> None:
    content = os.urandom(3000)
    f = fragment("a/journal", 0, content, CompressionCodec.NONE)
    await any_store.put(f, content)
    reader: FragmentReader
    async with await any_store.open(f) as reader:
        pieces = []
        while piece := await reader.read(1000):
            assert len(piece) <= 1000
            pieces.append(piece)
    assert b"".join(pieces) == content
    with pytest.raises(StoreError, match="exceeds 2999 bytes"):
        await any_store.read(f, 2999)


async def test_put_reads_file_objects_from_their_position(any_store: FragmentStore) -> None:
    content = b"payload"
    f = fragment("a/journal", 0, content, CompressionCodec.NONE)
    src = io.BytesIO(b"HEADER" + content)
    src.seek(6)
    await any_store.put(f, src)
    assert await any_store.read(f, 100) == content


async def test_signed_url_ttl_is_bounded(any_store: FragmentStore) -> None:
    f = fragment("a/journal", 0, b"x", CompressionCodec.NONE)
    for ttl_s in (0, -1, 8 * 24 * 3600):
        with pytest.raises(ValueError, match="ttl_s"):
            await any_store.signed_url(f, ttl_s)


async def test_signed_url_of_missing_fragment_is_not_found(any_store: FragmentStore) -> None:
    f = fragment("a/journal", 0, b"never put", CompressionCodec.NONE)
    url = await any_store.signed_url(f, 60)
    with pytest.raises(FragmentNotFoundError):
        await open_url(url)


# --- Listing hygiene --------------------------------------------------------------------------


async def _put_raw(store: FragmentStore, key: str, data: bytes) -> None:
    # Backends' key-level put: places files whose names the store itself would never write.
    await store._put(key, data, "")


async def test_listing_skips_junk_and_non_canonical_names(any_store: FragmentStore) -> None:
    prefix = any_store.key_prefix + "a/journal/"
    good = fragment("a/journal", 0, b"content", CompressionCodec.NONE)
    await any_store.put(good, b"content")
    sum_hex = naming.digest_of_sum(good.sum).hex()
    await _put_raw(any_store, prefix + "README.txt", b"not a fragment")
    await _put_raw(any_store, prefix + f"0-7-{sum_hex}.raw", b"content")  # Short offsets.
    await _put_raw(any_store, prefix + f"0000000000000000-0000000000000007-{sum_hex}.RAW", b"c")
    # Zero bytes cannot hold 7 bytes of content: a failed upload.
    await _put_raw(any_store, prefix + f"0000000000000000-0000000000000007-{'1' * 40}.raw", b"")
    # Another journal sharing a name prefix is not listed.
    await any_store.put(fragment("a/journal-2", 0, b"other", CompressionCodec.NONE), b"other")

    listed = await any_store.list("a/journal")
    assert [naming.content_name(f) for f in listed] == [naming.content_name(good)]


async def test_listing_of_empty_fragment_with_empty_file(any_store: FragmentStore) -> None:
    empty = fragment("a/journal", 10, b"", CompressionCodec.NONE)
    await any_store.put(empty, b"")
    assert [(f.begin, f.end) for f in await any_store.list("a/journal")] == [(10, 10)]


async def test_mod_time_comes_from_the_store_clock() -> None:
    now = [1_700_000_000.0]
    buckets = MemoryBuckets(clock=lambda: now[0])
    store = MemoryStore(StoreURL.parse("memory://b/"), buckets=buckets)
    f = fragment("a/journal", 0, b"x", CompressionCodec.NONE)
    await store.put(f, b"x")
    (listed,) = await store.list("a/journal")
    assert listed.mod_time == 1_700_000_000


# --- URLs and the registry --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("file:///no/trailing/slash", "must end in '/'"),
        ("file://host/path/", "must not have a host"),
        ("s3:///path/", "bucket"),
        ("gs://bucket/path/?endpoint=http://h:1", "unknown query argument"),
        ("azure://container/path/?region=x", "unknown query argument"),
        ("azure-ad://tenant/account/", "storage container"),
        ("ftp://host/path/", "scheme"),
        ("file:///path/?find=a&find=b", "repeated"),
        ("file:///path/?bogus=1", "unknown query argument"),
        ("memory:///path/", "bucket"),
        ("relative/path/", "absolute"),
    ],
)
def test_bad_store_urls_are_rejected(url: str, message: str) -> None:
    with pytest.raises(StoreURLError, match=message):
        new_registry().get(url)


def test_registry_shares_instances_and_accepts_custom_schemes(tmp_path: Path) -> None:
    registry = new_registry(file_root=tmp_path)
    assert registry.get("file:///a/") is registry.get("file:///a/")
    assert registry.get("file:///a/") is not registry.get("file:///b/")

    built: list[str] = []

    def build(url: StoreURL) -> FragmentStore:
        built.append(url.url)
        return MemoryStore(StoreURL.parse("memory://faulty/"), buckets=MemoryBuckets())

    custom = StoreRegistry({"memory": build})
    custom.get("memory://x/")
    assert built == ["memory://x/"]


def test_store_url_args_are_case_insensitive() -> None:
    url = StoreURL.parse("s3://bucket/p/?Endpoint=http://h:1&REGION=us-east-1")
    assert url.prefix == "p/"
    assert url.take_args(("endpoint", "region")) == {
        "endpoint": "http://h:1",
        "region": "us-east-1",
    }


# --- file:// specifics ------------------------------------------------------------------------


def _files_under(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


async def test_file_store_writes_atomically_and_leaves_no_temp_files(
    file_store: FileStore, tmp_path: Path
) -> None:
    content = b"abc" * 1000
    f = fragment("a/journal", 0, content, CompressionCodec.GZIP)
    await file_store.put(f, compress(CompressionCodec.GZIP, content))
    files = await asyncio.to_thread(_files_under, tmp_path)
    assert files == [f"fragments/a/journal/{naming.content_name(f)}"]


class _GatedContent(io.RawIOBase):
    """Content whose first read blocks its (worker) thread until the test opens the gate."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)
        self.started = threading.Event()
        self.gate = threading.Event()

    def readable(self) -> bool:
        return True

    def readinto(self, buf: bytearray | memoryview) -> int:  # type: ignore[override]
        self.started.set()
        self.gate.wait()
        return self._data.readinto(buf)


async def test_cancelled_put_returns_only_once_its_write_has_ended(
    file_store: FileStore, tmp_path: Path
) -> None:
    # A worker thread cannot be interrupted: a put cancelled mid-write (a stopping broker
    # cancels its persister) must wait for the thread, never leave it writing a temporary file
    # behind the caller's back.
    content = b"xyz" * 100_000
    f = fragment("a/journal", 0, content, CompressionCodec.NONE)
    gated = _GatedContent(content)
    put = asyncio.create_task(file_store.put(f, gated))  # type: ignore[arg-type]
    await asyncio.to_thread(gated.started.wait)
    put.cancel()
    asyncio.get_running_loop().call_soon(gated.gate.set)
    with pytest.raises(asyncio.CancelledError):
        await put
    files = await asyncio.to_thread(_files_under, tmp_path)
    assert files == [f"fragments/a/journal/{naming.content_name(f)}"]
    assert await file_store.read(f, len(content)) == content


async def test_file_store_first_complete_copy_wins(file_store: FileStore, tmp_path: Path) -> None:
    f = fragment("a/journal", 0, b"abc", CompressionCodec.NONE)
    await file_store.put(f, b"abc")
    # A second put of the same name keeps the existing file (equal content, by its address).
    await file_store.put(f, b"zzz")
    assert await file_store.read(f, 10) == b"abc"


async def test_file_store_ignores_partial_files(file_store: FileStore, tmp_path: Path) -> None:
    f = fragment("a/journal", 0, b"abc", CompressionCodec.NONE)
    directory = tmp_path / "fragments" / "a" / "journal"
    directory.mkdir(parents=True)
    (directory / (".partial-" + naming.content_name(f) + "xyz")).write_bytes(b"ab")
    assert await file_store.list("a/journal") == []


async def test_file_store_refuses_missing_base_directory(tmp_path: Path) -> None:
    store = FileStore(StoreURL.parse("file:///not-mounted/"), root=tmp_path)
    f = fragment("a/journal", 0, b"abc", CompressionCodec.NONE)
    with pytest.raises(StoreError, match="invalid file store directory"):
        await store.put(f, b"abc")
    assert not (tmp_path / "not-mounted").exists()


async def test_file_store_missing_base_is_an_outage_not_an_empty_store(tmp_path: Path) -> None:
    # An unmounted volume must not read as "no fragments" (an empty journal, or lost content).
    (tmp_path / "mounted").mkdir()
    store = FileStore(StoreURL.parse("file:///mounted/"), root=tmp_path)
    f = fragment("a/journal", 0, b"abc", CompressionCodec.NONE)
    await store.put(f, b"abc")
    assert await store.list("other/journal") == []  # A journal never written: no fragments.
    (tmp_path / "mounted").rename(tmp_path / "away")
    with pytest.raises(StoreError, match="invalid file store directory"):
        await store.list("a/journal")
    with pytest.raises(StoreError, match="invalid file store directory") as opened:
        await store.open(f)
    assert not isinstance(opened.value, FragmentNotFoundError)
    (tmp_path / "away").rename(tmp_path / "mounted")
    assert [(x.begin, x.end) for x in await store.list("a/journal")] == [(0, 3)]
    # A fragment missing from a store that is there is lost, and says so.
    (tmp_path / "mounted" / naming.content_path(f)).unlink()
    with pytest.raises(FragmentNotFoundError):
        await store.open(f)


async def test_file_store_keys_cannot_escape_root(file_store: FileStore) -> None:
    f = fragment("../../../../etc/journal", 0, b"abc", CompressionCodec.NONE)
    with pytest.raises(StoreError, match="escapes root"):
        await file_store.put(f, b"abc")


async def test_file_store_signed_url_is_a_file_url(file_store: FileStore, tmp_path: Path) -> None:
    f = fragment("a/journal", 0, b"abc", CompressionCodec.NONE)
    url = await file_store.signed_url(f, 60)
    assert url == f"file://{tmp_path}/fragments/a/journal/{naming.content_name(f)}"


# --- s3:// specifics --------------------------------------------------------------------------


async def test_s3_gzip_offload_is_stored_with_content_encoding(
    s3_store: S3Store, moto: MotoServer, bucket: str
) -> None:
    content = b"offloaded " * 100
    f = fragment("a/journal", 0, content, CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION)
    await s3_store.put(f, compress(CompressionCodec.GZIP, content))
    client = moto.client()
    head = client.head_object(Bucket=bucket, Key=s3_store.key(f))
    client.close()
    assert head["ContentEncoding"] == "gzip"
    assert s3_store.key(f) == f"root/prefix/a/journal/{naming.content_name(f)}"
    assert not s3_store.key(f).endswith(".gz")  # Gazette writes these names without extension.


async def test_s3_store_applies_put_arguments(moto: MotoServer, bucket: str, aws_env: None) -> None:
    store = S3Store(StoreURL.parse(moto.store_url(bucket) + "&storageclass=STANDARD_IA&sse=AES256"))
    f = fragment("a/journal", 0, b"abc", CompressionCodec.NONE)
    await store.put(f, b"abc")
    client = moto.client()
    head = client.head_object(Bucket=bucket, Key=store.key(f))
    client.close()
    await store.close()
    assert head["StorageClass"] == "STANDARD_IA"
    assert head["ServerSideEncryption"] == "AES256"


async def test_s3_store_errors_are_typed(moto: MotoServer, aws_env: None) -> None:
    store = S3Store(StoreURL.parse(moto.store_url("no-such-bucket")))
    f = fragment("a/journal", 0, b"abc", CompressionCodec.NONE)
    with pytest.raises(StoreError, match="no-such-bucket"):
        await store.put(f, b"abc")
    await store.close()


def test_s3_store_requires_a_region(aws_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(StoreURLError, match="region"):
        S3Store(StoreURL.parse("s3://bucket/?endpoint=http://127.0.0.1:1"))


def test_s3_store_rejects_unknown_profile(aws_env: None) -> None:
    with pytest.raises(StoreURLError, match="profile"):
        S3Store(StoreURL.parse("s3://bucket/?profile=nope&region=us-east-1"))


async def test_cancelled_open_closes_the_file_it_opened(
    file_store: FileStore, tmp_path: Path
) -> None:
    # An open cancelled while its worker thread is inside open(2) (a slow disk, a network
    # mount: here a FIFO, whose open blocks until a writer comes) must not leak the file the
    # thread opens afterwards: a reader cancelled mid-read would otherwise leave descriptors
    # behind until garbage collection.
    import gc
    import warnings

    f = fragment("a/journal", 0, b"x", CompressionCodec.NONE)
    path = tmp_path / "fragments" / naming.content_path(f)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    opening = asyncio.create_task(file_store.open(f))
    await asyncio.sleep(0)  # The task runs up to its wait on the worker thread.
    opening.cancel()
    writer = threading.Thread(target=lambda: open(path, "wb").close())
    writer.start()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(asyncio.CancelledError):
            await opening
        await asyncio.to_thread(writer.join)
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
