"""Every RPC of a consumer's Shard service refuses a missing, expired, wrongly signed,
under-capable or out-of-scope token, in the clear and over TLS; the refusals change nothing; a
token in scope is served, and a Stat proxied between members carries it (table-driven:
security_testkit)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from broker.auth import APPLY, LIST, READ, Claims, TokenAuthorizer, client_interceptors
from broker.client.route_cache import ChannelPool, grpc_target
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import consumer_pb2_grpc as cpbg
from broker.protocol.selector import parse_selector
from broker.protocol.status import ShardNotFoundError
from broker.tls import ClientTls, load_client_tls, load_server_tls
from gazette_consumer.shard_client import ShardClient
from gazette_consumer.topology import shard_key
from tests.gazette_consumer.consumer_testkit import ROOT, Group, primary_and_standbys, shard_spec
from tests.security.security_testkit import (
    KEYS,
    SIGNER,
    Metadata,
    Outcome,
    Rpc,
    accepted_mismatches,
    answered,
    refusal_mismatches,
    refused,
)
from tests.security.tls_testkit import CertAuthority

SHARD = "shard-a"
OTHER = "shard-b"
IN_SCOPE = "team=counts"
OUT_OF_SCOPE = "team=sums"


def status_name(status: int) -> str:
    return str(cpb.Status.Name(status))  # type: ignore[arg-type]


def shard_rpcs(stub: cpbg.ShardStub) -> list[Rpc]:
    """Each Shard RPC, about SHARD (labelled team=counts; OTHER is team=sums)."""

    async def stat(md: Metadata) -> Outcome:
        response = await stub.Stat(cpb.StatRequest(shard=SHARD), metadata=md)
        return answered(status_name(response.status))

    async def list_(md: Metadata) -> Outcome:
        response = await stub.List(cpb.ListRequest(), metadata=md)
        return answered(",".join(s.spec.id for s in response.shards))

    async def apply(md: Metadata) -> Outcome:
        spec = shard_spec(SHARD, team="counts", owner="someone-else")
        change = cpb.ApplyRequest.Change(upsert=spec, expect_mod_revision=-1)
        response = await stub.Apply(cpb.ApplyRequest(changes=[change]), metadata=md)
        return answered(status_name(response.status))

    async def get_hints(md: Metadata) -> Outcome:
        response = await stub.GetHints(cpb.GetHintsRequest(shard=SHARD), metadata=md)
        return answered(status_name(response.status))

    async def unassign(md: Metadata) -> Outcome:
        request = cpb.UnassignRequest(shards=[SHARD])
        response = await stub.Unassign(request, metadata=md)
        return answered(f"{status_name(response.status)} {','.join(response.shards)}")

    not_found = answered("SHARD_NOT_FOUND")
    denied = refused(grpc.StatusCode.PERMISSION_DENIED, f"does not cover shard '{SHARD}'")
    return [
        Rpc("Stat", READ, stat, answered("OK"), not_found),
        # A token sees only the shards its selector matches.
        Rpc("List", LIST, list_, answered(SHARD), answered(OTHER)),
        Rpc("GetHints", READ, get_hints, answered("OK"), not_found),
        Rpc("Apply", APPLY, apply, answered("OK"), denied),
        Rpc("Unassign", APPLY, unassign, answered(f"OK {SHARD}"), denied),  # Last: it moves.
    ]


@pytest.fixture
async def group() -> AsyncIterator[Group]:
    g = await Group.open()
    try:
        yield g
    finally:
        await g.close()


def _channel(endpoint: str, tls: ClientTls | None) -> grpc.aio.Channel:
    target, secure = grpc_target(endpoint)
    assert secure == (tls is not None), endpoint
    if tls is None:
        return grpc.aio.insecure_channel(target)
    return grpc.aio.secure_channel(target, tls.credentials())


@pytest.mark.parametrize("transport", ["plaintext", "tls"])
async def test_every_shard_rpc_refuses_bad_tokens(
    transport: str, group: Group, tmp_path: Path
) -> None:
    client_tls = None
    options: dict[str, object] = {}
    if transport == "tls":
        ca = CertAuthority.new(tmp_path, "ca")
        cert = ca.issue("consumer")
        client_tls = load_client_tls(ca.cert)
        options = {"tls": load_server_tls(cert.cert, cert.key), "peer_tls": client_tls}
    node = await group.join("zone-a", "consumer-a", auth_keys=KEYS, **options)
    endpoint = node.member.endpoint
    assert endpoint.startswith("https://" if client_tls else "http://")
    await group.put_shard(shard_spec(SHARD, team="counts"))
    await group.put_shard(shard_spec(OTHER, team="sums"))
    await group.until(primary_and_standbys(group, [SHARD, OTHER], standbys=0))
    before = _revisions(group)
    async with _channel(endpoint, client_tls) as channel:
        rpcs = shard_rpcs(cpbg.ShardStub(channel))
        problems = await refusal_mismatches(rpcs, OUT_OF_SCOPE)
        assert problems == [], "\n".join(problems)
        # No spec changed, and the shards are still assigned as they were.
        assert _revisions(group) == before
        assert primary_and_standbys(group, [SHARD, OTHER], standbys=0)() is None
        problems = await accepted_mismatches(rpcs, IN_SCOPE)
        assert problems == [], "\n".join(problems)


def _revisions(group: Group) -> dict[str, int]:
    """The mod revision of each shard's spec."""
    out = {}
    for shard in (SHARD, OTHER):
        entry = group.ks.get(shard_key(ROOT, shard).encode())
        assert entry is not None, shard
        out[shard] = entry.kv.mod_revision
    return out


async def test_a_stat_proxied_over_mutual_tls_carries_the_callers_scope(
    group: Group, tmp_path: Path
) -> None:
    """Members serving mutual TLS: a Stat sent to a member that is not the shard's primary is
    proxied to the primary (dialed https://, presenting the member's certificate, signed with
    the caller's claims); a client without a certificate is refused."""
    ca = CertAuthority.new(tmp_path, "ca")
    nodes = []
    for suffix in ("consumer-a", "consumer-b"):
        cert = ca.issue(suffix)
        nodes.append(
            await group.join(
                "zone-a",
                suffix,
                auth_keys=KEYS,
                tls=load_server_tls(cert.cert, cert.key, ca.cert),
                peer_tls=load_client_tls(ca.cert, cert.cert, cert.key),
            )
        )
    await group.put_shard(shard_spec(SHARD, team="counts"))
    await group.until(primary_and_standbys(group, [SHARD], standbys=0))
    [primary] = [n for n in nodes if SHARD in {s.spec.id for s in n.shards.started}]
    [other] = [n for n in nodes if n is not primary]

    client_cert = ca.issue("client")
    tls = load_client_tls(ca.cert, client_cert.cert, client_cert.key)

    def client(selector: str, tls: ClientTls) -> ShardClient:
        token = SIGNER.sign(Claims(READ, parse_selector(selector)), 600)
        interceptors = client_interceptors(TokenAuthorizer(token))
        channels = ChannelPool(channels_max=1, interceptors=interceptors, tls=tls)
        return ShardClient(other.member.endpoint, channels=channels)

    async with client(IN_SCOPE, tls) as shards:
        response = await shards.stat(SHARD)
    assert response.header.process_id == primary.member.id  # Answered by the primary.
    async with client(OUT_OF_SCOPE, tls) as shards:
        with pytest.raises(ShardNotFoundError):
            await shards.stat(SHARD)
    # Without a client certificate, the TLS handshake fails: nothing is answered.
    async with client(IN_SCOPE, load_client_tls(ca.cert)) as shards:
        with pytest.raises(grpc.aio.AioRpcError) as refused_:
            await shards.stat(SHARD)
    assert refused_.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_stat_waiting_for_read_through_ends_when_its_token_expires(group: Group) -> None:
    node = await group.join("zone-a", "consumer-a", auth_keys=KEYS)
    await group.put_shard(shard_spec(SHARD, team="counts", sources=("in/a",)))
    await group.until(primary_and_standbys(group, [SHARD], standbys=0))
    short = SIGNER.sign(Claims(READ), 1)  # Expires within a second (whole seconds).
    channels = ChannelPool(channels_max=1, interceptors=client_interceptors(TokenAuthorizer(short)))
    async with ShardClient(node.member.endpoint, channels=channels) as shards:
        with pytest.raises(grpc.aio.AioRpcError) as expired:
            await shards.stat(SHARD, {"in/a": 100})  # Never read through: waits.
    assert expired.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "expired" in (expired.value.details() or "")
