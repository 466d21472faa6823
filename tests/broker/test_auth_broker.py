"""Authorization on real in-process brokers: refusals change nothing; accepted tokens work,
including through a proxying broker and replication; selectors scope reads, lists, applies;
streams end when their token expires; the HTTP gateway and environment-configured clients."""

from __future__ import annotations

import asyncio
import base64
import math
import time

import aiohttp
import grpc
import grpc.aio
import pytest
from broker_testkit import Cluster, journal_spec, local_content

from broker.auth import (
    ALL,
    APPEND,
    APPLY,
    LIST,
    READ,
    REPLICATE,
    Claims,
    KeyedAuth,
    TokenAuthorizer,
    client_interceptors,
)
from broker.client import (
    Appender,
    JournalClient,
    Reader,
    apply_journals,
    list_all_fragments,
    list_journals,
    upsert,
)
from broker.client.route_cache import ChannelPool
from broker.http_gateway import HttpGateway
from broker.metrics import value_of
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pbg
from broker.protocol.selector import parse_selector
from broker.protocol.status import JournalNotFoundError, OffsetNotYetAvailableError
from broker.server import Broker

KEY = b"the cluster's pre-shared key (32B)"
OTHER_KEY = b"someone else's key, 32 bytes long"
KEYS = base64.b64encode(KEY).decode()
SIGNER = KeyedAuth([KEY])
FORGER = KeyedAuth([OTHER_KEY])
J = "auth/journal"
OTHER = "other/journal"
EXPIRED = {"reason": "expired"}


def token(capability: int, selector: str = "", *, signer: KeyedAuth = SIGNER) -> str:
    return signer.sign(Claims(capability, parse_selector(selector)), 600)


def client_of(broker: Broker, bearer: str | None) -> JournalClient:
    authorizer = TokenAuthorizer(bearer) if bearer is not None else None
    return JournalClient(
        broker.endpoint, channels=ChannelPool(interceptors=client_interceptors(authorizer))
    )


async def append(broker: Broker, bearer: str | None, journal: str, data: bytes) -> pb.Fragment:
    client = client_of(broker, bearer)
    try:
        appender = Appender(client, pb.AppendRequest(journal=journal))
        await appender.write(data)
        return await appender.commit()
    finally:
        await client.close()


async def read_all(broker: Broker, journal: str) -> bytes:
    client = client_of(broker, token(READ))
    out = b""
    try:
        reader = Reader(client, pb.ReadRequest(journal=journal, offset=0))
        with pytest.raises(OffsetNotYetAvailableError):
            while chunk := await reader.read():
                out += chunk
    finally:
        await client.close()
    return out


async def start(cluster: Cluster, suffix: str = "broker-a") -> Broker:
    return await cluster.start_broker("zone-a", suffix, auth_keys=KEYS)


async def test_refused_appends_append_nothing(cluster: Cluster) -> None:
    b = await start(cluster)
    await cluster.create(journal_spec(J), [b])
    refused_before = value_of("gazette_auth_rejections_total", {"reason": "missing"})

    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await append(b, None, J, b"no token")
    assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "missing or empty authorization token" in (missing.value.details() or "")

    with pytest.raises(grpc.aio.AioRpcError) as forged:
        await append(b, token(ALL, signer=FORGER), J, b"wrong key")
    assert forged.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "signature matches none of our keys" in (forged.value.details() or "")

    with pytest.raises(grpc.aio.AioRpcError) as no_append:
        await append(b, token(READ | LIST), J, b"read-only token")
    assert no_append.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "missing required APPEND capability" in (no_append.value.details() or "")

    # Out of the token's scope, the journal is as if it did not exist.
    with pytest.raises(JournalNotFoundError):
        await append(b, token(APPEND, f"name={OTHER}"), J, b"other scope")

    assert value_of("gazette_auth_rejections_total", {"reason": "missing"}) == refused_before + 1
    # Nothing was appended: the first accepted append lands at offset 0.
    commit = await append(b, token(APPEND, "prefix=auth/"), J, b"accepted")
    assert (commit.begin, commit.end) == (0, 8)
    assert await read_all(b, J) == b"accepted"


async def test_proxied_and_replicated_appends_carry_tokens(cluster: Cluster) -> None:
    a = await start(cluster, "broker-a")
    b = await start(cluster, "broker-b")
    c = await start(cluster, "broker-c")
    # Primary a, replica b; c is not in the route and proxies.
    await cluster.create(journal_spec(J, replication=2), [a, b])
    commit = await append(c, token(APPEND, f"name={J}"), J, b"through c")
    assert (commit.begin, commit.end) == (0, 9)
    assert local_content(a, J) == (0, b"through c")
    assert local_content(b, J) == (0, b"through c")  # Replicated under a's own token.
    # The proxy forwards the caller's scope: out of it, refused at c already.
    with pytest.raises(JournalNotFoundError):
        await append(c, token(APPEND, f"name={OTHER}"), J, b"out of scope")
    assert await read_all(c, J) == b"through c"  # A proxied read.


async def test_selectors_scope_reads_listings_fragments_and_applies(cluster: Cluster) -> None:
    b = await start(cluster)
    await cluster.create(journal_spec(J), [b])
    await cluster.create(journal_spec(OTHER), [b])
    await append(b, token(APPEND), J, b"data")

    scoped = client_of(b, token(READ | LIST | APPLY, "prefix=auth/"))
    try:
        listing = await list_journals(scoped)
        assert [j.spec.name for j in listing.journals] == [J]
        with pytest.raises(JournalNotFoundError):
            await Reader(scoped, pb.ReadRequest(journal=OTHER)).read()
        reader = Reader(scoped, pb.ReadRequest(journal=J, offset=0))
        assert await reader.read() == b"data"
        await reader.close()
        with pytest.raises(JournalNotFoundError):
            await list_all_fragments(scoped, pb.FragmentsRequest(journal=OTHER))
        fragments = await list_all_fragments(scoped, pb.FragmentsRequest(journal=J))
        assert fragments.fragments[-1].spec.end == 4

        with pytest.raises(grpc.aio.AioRpcError) as outside:
            await apply_journals(scoped, [upsert(journal_spec(OTHER, replication=2), -1)])
        assert outside.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert f"does not cover journal '{OTHER}'" in (outside.value.details() or "")
        await apply_journals(scoped, [upsert(journal_spec("auth/new"), -1)])
    finally:
        await scoped.close()
    everything = client_of(b, token(LIST))
    try:
        names = [j.spec.name for j in (await list_journals(everything)).journals]
        assert names == ["auth/journal", "auth/new", "other/journal"]
        # The refused apply changed nothing.
        [other] = [j for j in (await list_journals(everything)).journals if j.spec.name == OTHER]
        assert other.spec.replication == 1
    finally:
        await everything.close()


async def test_a_blocking_read_ends_when_its_token_expires(cluster: Cluster) -> None:
    b = await start(cluster)
    await cluster.create(journal_spec(J), [b])
    await append(b, token(APPEND), J, b"x")
    # Expires within a second (tokens count whole seconds).
    short = SIGNER.sign(Claims(READ), 1)
    client = client_of(b, short)
    try:
        reader = Reader(client, pb.ReadRequest(journal=J, offset=0, block=True))
        assert await reader.read() == b"x"
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as expired:
            await reader.read()  # Waits at the write head until the token runs out.
        assert expired.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "expired" in (expired.value.details() or "")
        assert time.monotonic() - started < 30
    finally:
        await client.close()


async def test_the_http_gateway_passes_authorization_through(cluster: Cluster) -> None:
    b = await start(cluster)
    await cluster.create(journal_spec(J), [b])
    gateway = HttpGateway(ready=b.is_ready)
    port = await gateway.start("127.0.0.1", 0)
    gateway.attach(b.endpoint)
    url = f"http://127.0.0.1:{port}/{J}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.put(url, data=b"anonymous") as resp:
                assert resp.status == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
                assert b"UNAUTHENTICATED" in await resp.read()
            for malformed in ("Bearer garbage", "Basic dXNlcjpwYXNz", f"Bearer {token(ALL)}x"):
                async with http.get(url, headers={"Authorization": malformed}) as resp:
                    assert resp.status == 401, malformed
                    assert b"authorization" in await resp.read()
            headers = {"Authorization": f"Bearer {token(READ)}"}
            async with http.put(url, data=b"reader", headers=headers) as resp:
                assert resp.status == 403
            headers = {"Authorization": f"Bearer {token(APPEND | READ, 'prefix=auth/')}"}
            async with http.put(url, data=b"allowed", headers=headers) as resp:
                assert resp.status == 200 and resp.headers["X-Commit-Begin"] == "0"
            async with http.get(f"{url}?block=false", headers=headers) as resp:
                assert resp.status == 206 and await resp.read() == b"allowed"
    finally:
        await gateway.stop()


async def test_clients_take_authorization_from_the_environment(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = await start(cluster)
    await cluster.create(journal_spec(J), [b])
    monkeypatch.setenv("GAZETTE_AUTH_KEYS", KEYS)
    signing = JournalClient(b.endpoint)  # Signs its own tokens with the key.
    monkeypatch.delenv("GAZETTE_AUTH_KEYS")
    monkeypatch.setenv("GAZETTE_AUTH_TOKEN", token(APPEND, f"name={OTHER}"))
    presenting = JournalClient(b.endpoint)  # Presents a token scoped to another journal.
    try:
        appender = Appender(signing, pb.AppendRequest(journal=J))
        await appender.write(b"signed")
        assert (await appender.commit()).end == 6
        with pytest.raises(JournalNotFoundError):
            appender = Appender(presenting, pb.AppendRequest(journal=J))
            await appender.write(b"scoped out")
            await appender.commit()
    finally:
        await signing.close()
        await presenting.close()
    assert await read_all(b, J) == b"signed"


async def test_other_methods_need_a_valid_token_too(cluster: Cluster) -> None:
    b = await start(cluster)
    # With a valid token the request reaches the handler, which refuses its empty store URL.
    for bearer, code in ((None, grpc.StatusCode.UNAUTHENTICATED),
                         (token(READ), grpc.StatusCode.INVALID_ARGUMENT)):  # fmt: skip
        client = client_of(b, bearer)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await client.default_stub().FragmentStoreHealth(pb.FragmentStoreHealthRequest())
            assert info.value.code() == code
        finally:
            await client.close()


async def test_replication_out_of_scope_is_refused(cluster: Cluster) -> None:
    b = await start(cluster)
    await cluster.create(journal_spec(J), [b])
    client = client_of(b, token(REPLICATE, f"name={OTHER}"))
    try:
        call = client.default_stub().Replicate()
        await call.write(pb.ReplicateRequest(proposal=pb.Fragment(journal=J)))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert f"does not cover journal '{J}'" in (info.value.details() or "")
    finally:
        await client.close()


async def test_a_refused_append_reports_its_status_however_much_the_client_streamed(
    cluster: Cluster,
) -> None:
    # A client-streaming RPC learns its answer only once it stops writing. When the broker
    # answered (refused) while the client was still writing, grpc.aio sometimes replaced the
    # broker's status with INTERNAL "Failed execute_batch" (grpc issue 36066): the broker now
    # reads what the client still sends (bounded) before it refuses.
    b = await start(cluster)
    await cluster.create(journal_spec(J), [b])
    outcomes: list[object] = []
    for i, bearer in enumerate([None, token(READ | LIST), token(APPEND, f"name={OTHER}")] * 30):
        content = b"x" * (1 << (i % 22))
        client = client_of(b, bearer)
        try:
            appender = Appender(client, pb.AppendRequest(journal=J), chunk_bytes_max=64 << 10)
            with pytest.raises((grpc.aio.AioRpcError, JournalNotFoundError)) as refused:
                await appender.write(content)
                await appender.commit()
            err = refused.value
            outcomes.append(err.code() if isinstance(err, grpc.aio.AioRpcError) else type(err))
        finally:
            await client.close()
    expected = [
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        JournalNotFoundError,  # Out of the token's scope.
    ]
    assert outcomes == expected * 30
    assert await read_all(b, J) == b""


async def test_a_read_whose_token_expires_during_a_held_write_ends_after_it(
    cluster: Cluster,
) -> None:
    # The client does not read while its token expires, so the broker is inside a write that
    # flow control holds. Once the client reads on, it gets what was sent, then the status.
    # (tests/broker/test_auth_expiry_writes.py: why the expiry must not cut the write.)
    b = await start(cluster)
    await cluster.create(journal_spec(J), [b])
    data = bytes(range(256)) * (4 * 64 * 1024)  # 64 MiB: more than any flow-control window.
    await append(b, token(APPEND), J, data)
    expired_before = value_of("gazette_auth_rejections_total", EXPIRED)
    expires_at = math.ceil(time.time()) + 2  # Past the read's first response, surely.
    short = SIGNER.sign(Claims(READ, expires_at=expires_at), 60)
    interceptors = client_interceptors(TokenAuthorizer(short))
    target = b.endpoint.removeprefix("http://")
    async with grpc.aio.insecure_channel(target, interceptors=interceptors) as channel:
        call = pbg.JournalStub(channel).Read(pb.ReadRequest(journal=J, offset=0, block=True))
        assert (await call.read()).status == pb.OK  # The metadata response: the read is served.
        await asyncio.sleep(expires_at - time.time() + 0.2)  # Until the token has expired.
        got = b""
        with pytest.raises(grpc.aio.AioRpcError) as expired:
            while True:
                response = await asyncio.wait_for(call.read(), 30)
                assert response is not grpc.aio.EOF, "the read ended without a status"
                got += response.content
        assert expired.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert data.startswith(got) and 0 < len(got) < len(data)
    assert value_of("gazette_auth_rejections_total", EXPIRED) == expired_before + 1
