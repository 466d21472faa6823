"""Replication across routes of 1 to 5 brokers, recovery of a restarted primary, the Replicate
RPC's refusals, flow control, and bad input at the Append boundary."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from broker_testkit import Cluster, journal_spec, local_content, replica_of

from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.topology import etcd_header, make_header

J = "repl/journal"


@pytest.mark.parametrize("replication", [1, 2, 3, 4, 5])
async def test_appends_are_on_every_replica(cluster: Cluster, replication: int) -> None:
    brokers = [
        await cluster.start_broker(f"zone-{i % 2}", f"broker-{i}") for i in range(replication)
    ]
    await cluster.create(journal_spec(J, replication=replication), brokers)
    responses = await asyncio.gather(
        *(cluster.append(brokers[i % replication], J, [b"%d;" % i]) for i in range(10))
    )
    assert all(r.status == pb.OK for r in responses)
    assert len(responses[0].header.route.members) == replication
    _, content = local_content(brokers[0], J)
    assert sorted(content.split(b";")[:-1]) == sorted(b"%d" % i for i in range(10))
    for b in brokers:
        assert local_content(b, J) == (0, content)


async def test_restarted_primary_rolls_forward_and_adopts_the_registers(
    cluster: Cluster,
) -> None:
    a = await cluster.start_broker("zone-a", "broker-a")
    b = await cluster.start_broker("zone-b", "broker-b")
    await cluster.create(journal_spec(J, replication=2), [a, b])
    owner = label_set([("owner", "a")])
    resp = await cluster.append(a, J, [b"abc"], union_registers=owner)
    assert resp.status == pb.OK

    # The primary restarts with a fresh (empty) spool; the replica still holds [0, 3).
    await cluster.stop_broker(a)
    a = await cluster.start_broker("zone-a", "broker-a")
    await cluster.assign(J, [a, b])

    resp = await cluster.append(a, J, [b"def"])
    assert resp.status == pb.OK
    # Never below what a replica holds: offsets are not written twice.
    assert (resp.commit.begin, resp.commit.end) == (3, 6)
    assert resp.registers == owner
    assert local_content(b, J) == (0, b"abcdef")
    assert local_content(a, J) == (3, b"def")


async def test_replicate_refuses_a_stale_route(cluster: Cluster) -> None:
    a = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    b = await cluster.start_broker("zone-b", "broker-b", pulse_enabled=False)
    await cluster.create(journal_spec(J, replication=2), [a, b])
    stale_route = pb.Route(members=[a.id], primary=0)
    header = make_header(b.id, stale_route, etcd_header(b.ks.header))

    call = cluster.stub(b).Replicate()
    await call.write(
        pb.ReplicateRequest(
            header=header,
            proposal=pb.Fragment(journal=J, compression_codec=pb.NONE),
            registers=pb.LabelSet(),
            acknowledge=True,
        )
    )
    resp = await call.read()
    assert resp.status == pb.WRONG_ROUTE
    assert [m.suffix for m in resp.header.route.members] == ["broker-a", "broker-b"]
    assert replica_of(b, J).spool_slot.available()  # The spool was never taken.


async def test_replicate_refuses_a_malformed_first_message(cluster: Cluster) -> None:
    b = await cluster.start_broker("zone-b", "broker-b", pulse_enabled=False)
    await cluster.create(journal_spec(J), [b])
    call = cluster.stub(b).Replicate()
    await call.write(pb.ReplicateRequest(proposal=pb.Fragment(journal=J)))  # No header.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "header: expected in the first message" in (info.value.details() or "")


def _proposal(**fields: object) -> pb.ReplicateRequest:
    request = pb.ReplicateRequest(
        proposal=pb.Fragment(journal=J, compression_codec=pb.NONE),
        registers=pb.LabelSet(),
        acknowledge=True,
    )
    for name, value in fields.items():
        target = request.proposal if hasattr(request.proposal, name) else request
        if isinstance(value, pb.LabelSet):
            target.registers.CopyFrom(value)
        else:
            setattr(target, name, value)
    return request


@pytest.mark.parametrize(
    ("first", "detail"),
    [
        (_proposal(begin=10, end=5), "proposal.end: must be >= begin (got begin=10, end=5)"),
        (_proposal(begin=-2, end=-1), "proposal.begin: must be >= 0 (got -2)"),
        (_proposal(compression_codec=99), "proposal.compression_codec: must be one of"),
        (_proposal(journal="repl//journal"), "proposal.journal: must be a clean path"),
        (_proposal(path_postfix="a//b"), "proposal.path_postfix: must be a clean path"),
        (
            _proposal(registers=pb.LabelSet(labels=[pb.Label(name="z z", value="1")])),
            "registers.labels[0].name: must be only letters",
        ),
        (_proposal(content=b"X"), "content: unexpected with a proposal (got 1 bytes)"),
        (_proposal(content_delta=5), "content_delta: unexpected with a proposal (got 5)"),
        (
            _proposal(acknowledge=False),
            "acknowledge: expected with the header (the first message)",
        ),
    ],
    ids=[
        "begin after end",
        "negative begin",
        "unknown codec",
        "bad journal",
        "bad path postfix",
        "bad registers",
        "content",
        "content delta",
        "not acknowledged",
    ],
)
async def test_replicate_refuses_a_malformed_proposal_at_once(
    cluster: Cluster, first: pb.ReplicateRequest, detail: str
) -> None:
    """Refused before the spool is taken: the primary's own stream holds it, so a check made
    once it was taken waited for it, until the call's deadline."""
    a = await cluster.start_broker("zone-a", "broker-a")
    b = await cluster.start_broker("zone-b", "broker-b")
    await cluster.create(journal_spec(J, replication=2), [a, b])
    resp = await cluster.append(a, J, [b"abc"])
    assert resp.status == pb.OK
    assert not replica_of(b, J).spool_slot.available()  # The primary's stream holds it.

    first.header.CopyFrom(make_header(b.id, resp.header.route, etcd_header(b.ks.header)))
    call = cluster.stub(b).Replicate(timeout=10)
    await call.write(first)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    assert f"replicate: {detail}" in (info.value.details() or "")
    # Nothing changed: the primary's stream goes on, and the next append follows the first.
    resp = await cluster.append(a, J, [b"def"])
    assert (resp.status, resp.commit.begin, resp.commit.end) == (pb.OK, 3, 6)
    assert local_content(b, J) == (0, b"abcdef")


@pytest.mark.parametrize(
    ("first", "detail"),
    [
        (pb.AppendRequest(journal="bad journal name"), "journal"),
        (pb.AppendRequest(journal=J, offset=-1), "offset: must be >= 0"),
        (pb.AppendRequest(journal=J, content=b"x"), "content: unexpected"),
        (
            pb.AppendRequest(journal=J, union_registers=label_set([("b", "1"), ("a", "1")])),
            "union_registers",
        ),
    ],
)
async def test_append_refuses_a_malformed_first_message(
    cluster: Cluster, first: pb.AppendRequest, detail: str
) -> None:
    b = await cluster.start_broker("zone-b", "broker-b")
    await cluster.create(journal_spec(J), [b])
    call = cluster.stub(b).Append()
    await call.write(first)
    await call.done_writing()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert detail in (info.value.details() or "")
    # Nothing changed: the next append starts at 0.
    resp = await cluster.append(b, J, [b"ok"])
    assert (resp.status, resp.commit.begin) == (pb.OK, 0)


async def test_a_slow_client_is_aborted_and_rolled_back(cluster: Cluster) -> None:
    b = await cluster.start_broker(
        "zone-b",
        "broker-b",
        min_append_rate_bytes_per_s=1000,
        flow_control_burst_s=0.1,
    )
    await cluster.create(journal_spec(J), [b])
    call = cluster.stub(b).Append()
    await call.write(pb.AppendRequest(journal=J))
    await call.write(pb.AppendRequest(content=b"slow"))
    # ... and then nothing: the client has stalled.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    resp = await cluster.append(b, J, [b"fast"])
    assert (resp.status, resp.commit.begin, resp.commit.end) == (pb.OK, 0, 4)
    assert local_content(b, J) == (0, b"fast")


async def test_append_to_an_unassigned_journal(cluster: Cluster) -> None:
    b = await cluster.start_broker("zone-b", "broker-b")
    await cluster.put_spec(journal_spec(J))
    resp = await cluster.append(b, J, [b"x"])
    assert resp.status == pb.NO_JOURNAL_PRIMARY_BROKER
    resp = await cluster.append(b, "no/such/journal", [b"x"])
    assert resp.status == pb.JOURNAL_NOT_FOUND
