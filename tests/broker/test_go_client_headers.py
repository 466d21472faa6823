"""Every response header of every RPC passes Gazette's Header.Validate, which Go clients run on
every response (re-implemented below from Gazette's broker/protocol header_extensions.go,
route_extensions.go, broker_spec_extensions.go, endpoint.go and validator.go), here on the
embedded keyspace, the default a Go client would meet. The broker answers for journals through
a member of the route and through a broker proxying to it, for statuses other than OK too; the
consumer answers its Shard RPCs."""

from __future__ import annotations

import unicodedata
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from broker.fragment.stores.registry import new_registry
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.shard_client import ShardClient, upsert
from tests.broker.broker_testkit import Cluster, journal_spec
from tests.gazette_consumer.consumer_testkit import Group, shard_spec

J = "headers/journal"
STORE = "file:///frags/"

# --- Gazette's rules ----------------------------------------------------------------------------

TOKEN_SYMBOLS = "-_+/."  # validator.go


class GoValidationError(AssertionError):
    pass


def go_token(value: str, low: int, high: int, what: str) -> None:
    # Go's len() counts bytes; letters and numbers of any script, or the token symbols.
    if not low <= len(value.encode()) <= high:
        raise GoValidationError(f"{what}: invalid length ({value!r}; expected [{low}, {high}])")
    for ch in value:
        if not (ch.isalpha() or unicodedata.category(ch).startswith("N") or ch in TOKEN_SYMBOLS):
            raise GoValidationError(f"{what}: not a valid token ({value!r})")


def go_process_id(pid: pb.ProcessSpec.ID, what: str) -> None:
    go_token(pid.zone, 1, 32, f"{what}.Zone")  # minZoneLen, maxZoneLen
    go_token(pid.suffix, 4, 128, f"{what}.Suffix")  # minBrokerSuffixLen, maxBrokerSuffixLen


def go_endpoint(endpoint: str, what: str) -> None:
    parts = urlsplit(endpoint)
    if not parts.scheme:
        raise GoValidationError(f"{what}: not absolute: {endpoint}")
    if not parts.netloc:
        raise GoValidationError(f"{what}: missing host: {endpoint}")


def go_route(route: pb.Route) -> None:
    for i, member in enumerate(route.members):
        go_process_id(member, f"Route.Members[{i}]")
        if i and not (route.members[i - 1].zone, route.members[i - 1].suffix) < (
            member.zone,
            member.suffix,
        ):
            raise GoValidationError(f"Route: Members not in unique, sorted order (index {i})")
    if not -1 <= route.primary < len(route.members):
        raise GoValidationError(f"Route: invalid Primary ({route.primary})")
    if route.endpoints and len(route.endpoints) != len(route.members):
        raise GoValidationError("Route: len(Endpoints) != 0, and != len(Members)")
    for i, endpoint in enumerate(route.endpoints):
        if endpoint:
            go_endpoint(endpoint, f"Route.Endpoints[{i}]")


def go_header(header: pb.Header) -> None:
    """Gazette's Header.Validate."""
    if header.process_id.zone or header.process_id.suffix:
        go_process_id(header.process_id, "ProcessId")
    go_route(header.route)
    etcd = header.etcd
    if etcd.cluster_id == 0:
        raise GoValidationError("Etcd: invalid ClusterId (expected != 0)")
    if etcd.member_id == 0:
        raise GoValidationError("Etcd: invalid MemberId (expected != 0)")
    if etcd.revision <= 0:
        raise GoValidationError(f"Etcd: invalid Revision ({etcd.revision}; expected 0 < revision)")
    if etcd.raft_term == 0:
        raise GoValidationError("Etcd: invalid RaftTerm (expected != 0)")


def test_the_rules_refuse_what_go_refuses() -> None:
    good = pb.Header(
        process_id=pb.ProcessSpec.ID(zone="z", suffix="broker-1"),
        route=pb.Route(
            members=[pb.ProcessSpec.ID(zone="z", suffix="broker-1")],
            primary=0,
            endpoints=["http://127.0.0.1:8080"],
        ),
        etcd=pb.Header.Etcd(cluster_id=1, member_id=2, revision=3, raft_term=4),
    )
    go_header(good)
    for field in ("cluster_id", "member_id", "revision", "raft_term"):
        bad = pb.Header()
        bad.CopyFrom(good)
        setattr(bad.etcd, field, 0)
        with pytest.raises(GoValidationError, match="Etcd"):
            go_header(bad)
    bad = pb.Header()
    bad.CopyFrom(good)
    bad.route.primary = 1
    with pytest.raises(GoValidationError, match="Primary"):
        go_header(bad)


# --- The broker ---------------------------------------------------------------------------------


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    (tmp_path / "frags").mkdir()
    c = Cluster(stores=new_registry(file_root=tmp_path))
    try:
        yield c
    finally:
        await c.close()


async def test_every_broker_rpc_header_passes_gos_validation(cluster: Cluster) -> None:
    a = await cluster.start_broker("zone-a", "broker-a")
    b = await cluster.start_broker("zone-b", "broker-b")
    outsider = await cluster.start_broker("zone-c", "broker-c")
    await cluster.create(journal_spec(J, replication=2, stores=[STORE]), [a, b])
    headers: dict[str, pb.Header] = {}

    for via in (a, outsider):  # A member of the route, and a broker proxying to it.
        name = via.config.suffix
        stub = cluster.stub(via)
        resp = await cluster.append(via, J, [b"hello"])
        assert resp.status == pb.OK
        headers[f"Append OK via {name}"] = resp.header
        selector = pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name="owner", value="v")]))
        resp = await cluster.append(
            via,
            J,
            [b"x"],
            check_registers=selector,
            union_registers=pb.LabelSet(labels=[pb.Label(name="owner", value="w")]),
        )
        headers[f"Append OK (registers) via {name}"] = resp.header
        resp = await cluster.append(via, J, [b"x"], check_registers=selector)
        assert resp.status == pb.REGISTER_MISMATCH
        headers[f"Append REGISTER_MISMATCH via {name}"] = resp.header
        resp = await cluster.append(via, "headers/missing", [b"x"])
        assert resp.status == pb.JOURNAL_NOT_FOUND
        headers[f"Append JOURNAL_NOT_FOUND via {name}"] = resp.header

        call = stub.Read(pb.ReadRequest(journal=J, offset=0, block=False))
        first = await call.read()
        call.cancel()
        headers[f"Read via {name}"] = first.header
        call = stub.Read(pb.ReadRequest(journal="headers/missing"))
        headers[f"Read JOURNAL_NOT_FOUND via {name}"] = (await call.read()).header
        call.cancel()

        fragments = await stub.ListFragments(pb.FragmentsRequest(journal=J))
        headers[f"ListFragments via {name}"] = fragments.header

        call = stub.List(pb.ListRequest())
        headers[f"List via {name}"] = (await call.read()).header
        call.cancel()
        applied = await stub.Apply(pb.ApplyRequest())
        headers[f"Apply via {name}"] = applied.header
        health = await stub.FragmentStoreHealth(pb.FragmentStoreHealthRequest(fragment_store=STORE))
        assert health.status == pb.OK
        headers[f"FragmentStoreHealth via {name}"] = health.header

    for what, header in headers.items():
        try:
            go_header(header)
        except GoValidationError as err:
            raise AssertionError(f"{what}: {err}\n{header}") from None
    # The broker of one keyspace answers with its one identity.
    assert len({(h.etcd.cluster_id, h.etcd.member_id) for h in headers.values()}) == 1


# --- The consumer -------------------------------------------------------------------------------


async def test_every_shard_rpc_header_passes_gos_validation() -> None:
    group = await Group.open()
    try:
        node = await group.join("zone-a", "consumer-a")
        async with ShardClient(node.member.endpoint) as shards:
            applied = await shards.apply([upsert(shard_spec("shard-a"))])
            listing = await shards.list_shards()
            stub = shards.stub()
            stat = await stub.Stat(cpb.StatRequest(shard="shard-missing"))
            hints = await stub.GetHints(cpb.GetHintsRequest(shard="shard-a"))
        headers = {
            "Apply": applied.header,
            "List": listing.header,
            "Stat SHARD_NOT_FOUND": stat.header,
            "GetHints": hints.header,
        }
        assert stat.status == cpb.SHARD_NOT_FOUND
        for what, header in headers.items():
            try:
                go_header(header)
            except GoValidationError as err:
                raise AssertionError(f"{what}: {err}\n{header}") from None
    finally:
        await group.close()
