"""S3 through a broker, end to end, on a real moto server: a broker appends, rolls and persists
fragments of each codec to `s3://bucket/prefix/?endpoint=...`; the bucket's listing is checked
key by key (prefix + journal + postfix + content name, SHA1 of the decompressed content,
contiguous content equal to what was appended); then the content is read back once the
brokers that wrote it are gone, both proxied by a fresh broker and directly from the store
through signed URLs (`do_not_proxy`)."""

from __future__ import annotations

import contextlib
import hashlib
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from broker import client
from broker.fragment.codecs import CompressionCodec, decompress
from broker.fragment.naming import extension_of
from broker.fragment.store_health import CHECK_CONTENT, CHECK_KEY
from broker.fragment.stores.base import FragmentReader, StoreURL
from broker.fragment.stores.registry import new_registry
from broker.fragment.stores.s3_store import S3Store
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import OffsetNotYetAvailableError
from broker.testing.moto_server import MotoServer, credentials_env
from tests.broker.broker_testkit import Cluster, journal_spec, replica_of

PREFIX = "some/prefix/"
_NAME = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})-([0-9a-f]{40})(\.[a-z]+)?$")
CODECS = [pb.NONE, pb.GZIP, pb.ZSTANDARD, pb.SNAPPY]


@pytest.fixture(scope="module")
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
    name = f"e2e-{secrets.token_hex(6)}"
    moto.create_bucket(name)
    return name


class CountingS3Store(S3Store):
    """The real S3 store, counting the files brokers open (to tell proxied reads, where the
    broker opens each file, from direct ones, where it opens none)."""

    def __init__(self, url: StoreURL) -> None:
        super().__init__(url)
        self.opens = 0

    async def _open(self, key: str) -> FragmentReader:
        self.opens += 1
        return await super()._open(key)


@pytest.fixture
async def cluster(aws_env: None) -> AsyncIterator[Cluster]:
    registry = new_registry()
    registry.register("s3", CountingS3Store)
    c = Cluster(stores=registry)
    try:
        yield c
    finally:
        await c.close()
        assert c.stores is not None
        await c.stores.close()


def appends(journal: str) -> list[bytes]:
    """Eight appends of varied, compressible lines: about three fragments of 1 KiB."""
    return [
        b"".join(b"%s append %d line %d\n" % (journal.encode(), i, j) for j in range(12))
        for i in range(8)
    ]


def bucket_objects(moto: MotoServer, bucket: str) -> dict[str, bytes]:
    """Every object in the bucket (whatever its key), with its stored bytes."""
    s3: Any = moto.client()
    try:
        out = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", ()):
                out[obj["Key"]] = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        return out
    finally:
        s3.close()


def check_objects(
    objects: dict[str, bytes], journal: str, postfix: str, codec: int
) -> list[tuple[int, int, str]]:
    """Check each key against its content; return (begin, end, content) in offset order,
    checking that the spans are contiguous from offset 0."""
    spans: list[tuple[int, int, bytes]] = []
    for key, stored in objects.items():
        if key == PREFIX + CHECK_KEY:
            assert stored == CHECK_CONTENT  # The brokers' health check of the store (Gazette's).
            continue
        head = PREFIX + journal + "/" + (postfix + "/" if postfix else "")
        assert key.startswith(head), key
        match = _NAME.match(key[len(head) :])
        assert match is not None, key
        begin, end, sha1_hex, ext = match.groups()
        assert (ext or "") == extension_of(codec)
        content = decompress(CompressionCodec(codec), stored)
        assert hashlib.sha1(content).hexdigest() == sha1_hex, key
        assert len(content) == int(end, 16) - int(begin, 16)
        spans.append((int(begin, 16), int(end, 16), content))
    spans.sort()
    assert [b for b, _, _ in spans] == [0] + [e for _, e, _ in spans[:-1]]  # Contiguous.
    return [(b, e, c.decode()) for b, e, c in spans]


async def read_all(
    cluster: Cluster, store_url: str, endpoint: str, journal: str, *, do_not_proxy: bool
) -> tuple[bytes, int]:
    """Everything from offset 0, and how many store files the broker opened to serve it."""
    assert cluster.stores is not None
    store = cluster.stores.get(store_url)
    assert isinstance(store, CountingS3Store)
    opens_before = store.opens
    c = client.JournalClient(endpoint)
    request = pb.ReadRequest(journal=journal, offset=0, block=False, do_not_proxy=do_not_proxy)
    reader = client.RetryReader(c, request)
    out = b""
    try:
        with contextlib.suppress(OffsetNotYetAvailableError):
            while chunk := await reader.read():
                out += chunk
    finally:
        await reader.close()
        await c.channels.close()
    return out, store.opens - opens_before


@pytest.mark.parametrize("codec", CODECS, ids=pb.CompressionCodec.Name)
async def test_appends_persist_to_s3_and_read_back_without_the_writer(
    moto: MotoServer, bucket: str, cluster: Cluster, codec: int
) -> None:
    journal = f"e2e/{pb.CompressionCodec.Name(codec).lower()}"
    store = moto.store_url(bucket, PREFIX)
    writer = await cluster.start_broker("zone-a", "writer", pulse_enabled=False)
    await cluster.create(journal_spec(journal, length=1024, codec=codec, stores=[store]), [writer])
    await replica_of(writer, journal).index.wait_first_refresh(5.0)
    written = appends(journal)
    for data in written:
        assert (await cluster.append(writer, journal, [data])).status == pb.OK
    # Stopping rolls the last fragment and persists every completed one before exiting.
    await cluster.stop_broker(writer)

    spans = check_objects(bucket_objects(moto, bucket), journal, "", codec)
    assert len(spans) >= 3, spans  # Rolled at the target length.
    assert "".join(c for _, _, c in spans).encode() == b"".join(written)

    # No broker holds the content any more: a new one lists the store and serves it.
    reader_broker = await cluster.start_broker("zone-b", "reader", pulse_enabled=False)
    await cluster.assign(journal, [reader_broker])
    index = replica_of(reader_broker, journal).index
    await index.wait_first_refresh(5.0)
    assert [(f.begin, f.end) for f in index.fragments()] == [(b, e) for b, e, _ in spans]
    assert all(f.backing_store == store for f in index.fragments())

    proxied, opens = await read_all(
        cluster, store, reader_broker.endpoint, journal, do_not_proxy=False
    )
    assert (proxied, opens) == (b"".join(written), len(spans))
    # Signed URLs of the store: the reader fetches (and decompresses) every file itself.
    direct, opens = await read_all(
        cluster, store, reader_broker.endpoint, journal, do_not_proxy=True
    )
    assert (direct, opens) == (b"".join(written), 0)


async def test_s3_postfix_directories_are_listed_and_read(
    moto: MotoServer, bucket: str, cluster: Cluster
) -> None:
    journal = "e2e/postfixed"
    store = moto.store_url(bucket, PREFIX)
    spec = journal_spec(journal, length=1024, codec=pb.GZIP, stores=[store])
    spec.fragment.path_postfix_template = (
        'codec={{ .Spool.CompressionCodec }}/year={{ .Spool.FirstAppendTime.Format "2006" }}'
    )
    now = [1_600_000_000.0]  # 2020-09-13 UTC.
    writer = await cluster.start_broker(
        "zone-a", "writer", pulse_enabled=False, clock=lambda: now[0]
    )
    await cluster.create(spec, [writer])
    await replica_of(writer, journal).index.wait_first_refresh(5.0)
    written = appends(journal)
    for data in written:
        assert (await cluster.append(writer, journal, [data])).status == pb.OK
    await cluster.stop_broker(writer)

    spans = check_objects(bucket_objects(moto, bucket), journal, "codec=GZIP/year=2020", pb.GZIP)
    assert "".join(c for _, _, c in spans).encode() == b"".join(written)

    reader_broker = await cluster.start_broker("zone-b", "reader", pulse_enabled=False)
    await cluster.assign(journal, [reader_broker])
    index = replica_of(reader_broker, journal).index
    await index.wait_first_refresh(5.0)
    assert {f.path_postfix for f in index.fragments()} == {"codec=GZIP/year=2020"}
    direct, opens = await read_all(
        cluster, store, reader_broker.endpoint, journal, do_not_proxy=True
    )
    assert (direct, opens) == (b"".join(written), 0)
