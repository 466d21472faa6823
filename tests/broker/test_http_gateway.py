"""The HTTP gateway against a real in-process broker, through a real HTTP client (aiohttp)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import grpc
import pytest
from broker_testkit import FAST_CONFIG, Cluster, journal_spec, replica_of, wait_until

from broker.client.route_cache import JournalClient
from broker.http_gateway import HttpGateway, http_status_of, http_status_of_grpc
from broker.keyspace.embedded import EmbeddedStore
from broker.metrics import value_of
from broker.protocol import protocol_pb2 as pb
from broker.server import Broker

J = "gw/journal"
MAX_INT64 = (1 << 63) - 1


@dataclass
class Env:
    cluster: Cluster
    broker: Broker
    gateway: HttpGateway
    session: aiohttp.ClientSession

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.gateway.port}/{path}"

    async def put(self, journal: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        async with self.session.put(self.url(journal), data=io.BytesIO(body)) as resp:
            return resp.status, dict(resp.headers), await resp.read()

    async def get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        async with self.session.get(self.url(path)) as resp:
            return resp.status, dict(resp.headers), await resp.read()


async def start_env(
    *, broker_options: dict[str, Any] | None = None, **gateway_options: Any
) -> tuple[Env, JournalClient]:
    cluster = Cluster()
    broker = await cluster.start_broker("zone-a", "broker-a", **(broker_options or {}))
    await cluster.create(journal_spec(J), [broker])
    client = JournalClient(broker.endpoint)
    gateway = HttpGateway(client, **gateway_options)
    await gateway.start("127.0.0.1", 0)
    return Env(cluster, broker, gateway, aiohttp.ClientSession()), client


async def stop_env(env: Env, client: JournalClient) -> None:
    await env.session.close()
    await env.gateway.stop()
    await client.close()
    await env.cluster.close()


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    e, client = await start_env()
    try:
        yield e
    finally:
        await stop_env(e, client)


async def test_put_then_get_returns_the_same_bytes(env: Env) -> None:
    body = b"hello\nworld\n"
    status, headers, raw = await env.put(J, body)
    assert status == 200
    doc = json.loads(raw)
    sha1 = hashlib.sha1(body).hexdigest()
    assert doc == {"status": "OK", "journal": J, "begin": 0, "end": len(body), "sha1": sha1}
    assert headers["X-Commit-Begin"] == "0" and headers["X-Commit-End"] == str(len(body))
    assert headers["X-Commit-SHA1-Sum"] == sha1 and headers["X-Write-Head"] == str(len(body))
    assert "broker-a" in headers["X-Route-Token"]

    status, headers, content = await env.get(f"{J}?offset=0&block=false")
    assert status == 206 and content == body
    assert headers["Content-Range"] == f"bytes 0-{MAX_INT64}/{MAX_INT64}"
    assert headers["X-Write-Head"] == str(len(body))
    assert headers["X-Fragment-Name"].startswith("0000000000000000-")
    assert "X-Fragment-Location" not in headers  # Not persisted: no signed URL.

    # A second append follows on; reading from the middle starts there.
    status, headers, _ = await env.put(J, b"more")
    assert status == 200 and headers["X-Commit-Begin"] == str(len(body))
    status, headers, content = await env.get(f"{J}?offset=6&block=0")
    assert status == 206 and content == b"world\nmore"
    assert headers["Content-Range"].startswith("bytes 6-")


async def test_non_blocking_read_at_the_head_is_416_with_the_write_head(env: Env) -> None:
    await env.put(J, b"abc")
    for path in (f"{J}?offset=-1&block=false", f"{J}?offset=3", J + "?offset=-1"):
        status, headers, body = await env.get(path)
        assert status == 416, path
        assert body == b"OFFSET_NOT_YET_AVAILABLE\n"
        assert headers["X-Write-Head"] == "3"


async def test_head_returns_metadata_only(env: Env) -> None:
    await env.put(J, b"abcdef")
    async with env.session.head(env.url(f"{J}?offset=2")) as resp:
        assert resp.status == 206
        assert resp.headers["Content-Range"].startswith("bytes 2-")
        assert resp.headers["X-Write-Head"] == "6"
        assert await resp.read() == b""


async def test_blocking_read_waits_for_and_streams_new_appends(env: Env) -> None:
    await env.put(J, b"old")

    async def read_four() -> tuple[int, str, bytes]:
        # Nothing is answered before content exists at offset 3: the headers come with it.
        async with env.session.get(env.url(f"{J}?offset=3&block=true")) as resp:
            return resp.status, resp.headers["Content-Range"], await resp.content.readexactly(4)

    reading = asyncio.ensure_future(read_four())
    status, _, _ = await env.put(J, b"new!")
    assert status == 200
    status, content_range, content = await reading
    assert (status, content) == (206, b"new!")
    assert content_range.startswith("bytes 3-")
    # The client closed its blocking read; the journal goes on.
    status, headers, _ = await env.put(J, b"+")
    assert status == 200 and headers["X-Commit-Begin"] == "7"


async def test_unknown_journal_is_404_with_the_status_name(env: Env) -> None:
    status, _, body = await env.get("no/such/journal?block=false")
    assert (status, body) == (404, b"JOURNAL_NOT_FOUND\n")
    status, _, body = await env.put("no/such/journal", b"data")
    assert (status, body) == (404, b"JOURNAL_NOT_FOUND\n")


@pytest.mark.parametrize(
    ("path", "names"),
    [
        (f"{J}?offset=abc", "offset: must be an integer (got 'abc')"),
        (f"{J}?offset=-5", "offset: must be >= -1"),
        (f"{J}?offset=99999999999999999999", "must fit in 64 bits"),
        (f"{J}?block=maybe", "block: must be true or false"),
        (f"{J}?offset=1&offset=2", "given 2 times"),
        (f"{J}?bogus=1", "query.bogus: unknown parameter"),
        ("abc", "journal"),  # Too short a name.
        ("a//b/c", "journal"),  # Not a clean path.
    ],
)
async def test_bad_read_requests_are_400_naming_the_field(env: Env, path: str, names: str) -> None:
    status, _, body = await env.get(path)
    assert status == 400
    assert names in body.decode(), body


async def test_bad_append_requests_are_400_and_append_nothing(env: Env) -> None:
    status, _, body = await env.put(f"{J}?offset=3", b"data")
    assert status == 400 and b"unknown parameter" in body
    status, _, body = await env.put("x", b"data")
    assert status == 400 and b"journal" in body
    async with env.session.delete(env.url(J)) as resp:
        assert resp.status == 405 and resp.headers["Allow"] == "GET, HEAD, PUT"
    status, headers, _ = await env.put(J, b"z")
    assert status == 200 and headers["X-Commit-Begin"] == "0"


async def test_a_large_body_is_one_append() -> None:
    env, client = await start_env(body_chunk_bytes=64 << 10)
    try:
        await env.put(J, b"head")
        body = bytes(range(256)) * 12_000  # ~3 MiB: dozens of chunks.
        status, headers, _ = await env.put(J, body)
        assert status == 200
        assert (headers["X-Commit-Begin"], headers["X-Commit-End"]) == ("4", str(4 + len(body)))
        status, _, content = await env.get(f"{J}?offset=4&block=false")
        assert status == 206 and content == body
    finally:
        await stop_env(env, client)


async def test_a_body_over_the_limit_is_413_and_appends_nothing() -> None:
    env, client = await start_env(append_bytes_max=1000, body_chunk_bytes=100)
    try:
        status, _, body = await env.put(J, b"x" * 5000)
        assert status == 413 and b"at most 1000 bytes" in body
        status, headers, _ = await env.put(J, b"y" * 1000)  # Exactly at the limit.
        assert status == 200 and headers["X-Commit-Begin"] == "0"
        status, _, content = await env.get(f"{J}?block=false")
        assert content == b"y" * 1000
    finally:
        await stop_env(env, client)


async def test_a_client_that_disconnects_mid_body_appends_nothing() -> None:
    # Small body chunks, so that the append is under way before the client goes; no pulses,
    # so that only that append takes the journal's pipeline.
    env, client = await start_env(broker_options={"pulse_enabled": False}, body_chunk_bytes=1000)
    try:
        await env.put(J, b"before|")
        pipeline = replica_of(env.broker, J).pipeline_slot
        assert pipeline.available()
        _, writer = await asyncio.open_connection("127.0.0.1", env.gateway.port)
        writer.write(
            f"PUT /{J} HTTP/1.1\r\nHost: test\r\nContent-Length: 100000\r\n\r\n".encode()
            + b"p" * 50_000
        )
        await writer.drain()
        # The append holds the pipeline while it streams the body.
        await wait_until(lambda: not pipeline.available())
        writer.close()
        await writer.wait_closed()
        # Appends are serialized: this one commits after the aborted one rolled back, right
        # where the journal stood before it.
        status, headers, _ = await env.put(J, b"after")
        assert status == 200 and headers["X-Commit-Begin"] == "7"
        status, _, content = await env.get(f"{J}?block=false")
        assert content == b"before|after"
    finally:
        await stop_env(env, client)


async def test_readiness_lists_the_fragment_stores_and_their_health() -> None:
    report: list[tuple[str, str | None]] = [("file:///a/", None), ("s3://b/", "PUT failed")]
    ready = False
    env, client = await start_env(ready=lambda: ready, store_health=lambda: report)
    try:
        status, _, body = await env.get("debug/ready")
        assert status == 503
        assert body.decode().endswith(
            "\nfragment store file:///a/: healthy\nfragment store s3://b/: unhealthy: PUT failed\n"
        )
        ready = True  # An unhealthy store does not make the broker unready: it is every broker's.
        status, _, body = await env.get("debug/ready")
        assert (status, body.decode()) == (
            200,
            "ready\nfragment store file:///a/: healthy\n"
            "fragment store s3://b/: unhealthy: PUT failed\n",
        )
    finally:
        await stop_env(env, client)


async def test_readiness_and_metrics() -> None:
    ready = False
    env, client = await start_env(ready=lambda: ready)
    try:
        status, _, body = await env.get("debug/ready")
        assert status == 503 and b"not ready" in body
        ready = True
        status, _, body = await env.get("debug/ready")
        assert (status, body) == (200, b"ready\n")

        before = value_of("gazette_http_gateway_requests_total", {"method": "PUT", "code": "200"})
        assert (await env.put(J, b"counted"))[0] == 200
        status, headers, body = await env.get("debug/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        text = body.decode()
        assert "gazette_http_gateway_requests_total" in text
        assert "gazette_appends_total" in text
        after = value_of("gazette_http_gateway_requests_total", {"method": "PUT", "code": "200"})
        assert after == before + 1
    finally:
        await stop_env(env, client)


async def test_journal_requests_wait_for_a_client() -> None:
    gateway = HttpGateway(None)
    port = await gateway.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/{J}") as resp:
                assert resp.status == 503 and b"starting" in await resp.read()
            async with session.get(f"http://127.0.0.1:{port}/debug/ready") as resp:
                assert resp.status == 200  # The default readiness: always.
    finally:
        await gateway.stop()


def test_status_mapping() -> None:
    assert http_status_of(pb.JOURNAL_NOT_FOUND) == 404
    assert http_status_of(pb.NOT_JOURNAL_PRIMARY_BROKER) == 503
    assert http_status_of(pb.INSUFFICIENT_JOURNAL_BROKERS) == 503
    assert http_status_of(pb.OFFSET_NOT_YET_AVAILABLE) == 416
    assert http_status_of(pb.WRONG_APPEND_OFFSET) == 409
    assert http_status_of(pb.REGISTER_MISMATCH) == 409
    assert http_status_of(pb.NOT_ALLOWED) == 403
    assert http_status_of(pb.INDEX_HAS_GREATER_OFFSET) == 500
    assert http_status_of_grpc(grpc.StatusCode.UNAUTHENTICATED) == 401
    assert http_status_of_grpc(grpc.StatusCode.PERMISSION_DENIED) == 403
    assert http_status_of_grpc(grpc.StatusCode.INTERNAL) == 502


async def test_readiness_follows_the_broker_lifecycle() -> None:
    store = EmbeddedStore()
    backend = store.connect()
    broker = Broker(backend, replace(FAST_CONFIG, zone="zone-a", suffix="broker-a"))
    gateway = HttpGateway(ready=broker.is_ready)
    port = await gateway.start("127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}/debug/ready"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(url) as resp:
                assert resp.status == 503  # Not started yet.
            await broker.start()
            async with session.get(url) as resp:
                assert resp.status == 200
            await broker.stop()
            async with session.get(url) as resp:
                assert resp.status == 503
    finally:
        await gateway.stop()
        await backend.close()
