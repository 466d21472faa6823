"""End-to-end appends through real in-process brokers (loopback gRPC, embedded keyspace)."""

from __future__ import annotations

import asyncio
import hashlib
import itertools

import grpc
import pytest
from broker_testkit import (
    Cluster,
    header_of_another_cluster,
    journal_spec,
    local_content,
    replica_of,
)

from broker.client import Appender, JournalClient
from broker.fragment.naming import sum_from_digest
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.protocol.status import RegisterMismatchError, StatusError

J = "test/journal"


async def test_single_broker_append_lands_in_spool_and_index(cluster: Cluster) -> None:
    b = await cluster.start_broker("zone-a", "broker-a")
    await cluster.create(journal_spec(J), [b])

    resp = await cluster.append(b, J, [b"hello, ", b"world\n"])

    assert resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (0, 13)
    assert resp.commit.sum == sum_from_digest(hashlib.sha1(b"hello, world\n").digest())
    assert resp.header.process_id == b.id
    assert [m.suffix for m in resp.header.route.members] == ["broker-a"]
    assert local_content(b, J) == (0, b"hello, world\n")
    assert replica_of(b, J).index.end_offset == 13

    resp = await cluster.append(b, J, [b"more\n"])
    assert (resp.commit.begin, resp.commit.end) == (13, 18)
    assert local_content(b, J) == (0, b"hello, world\nmore\n")


async def test_replicated_append_is_identical_on_every_replica(cluster: Cluster) -> None:
    brokers = [await cluster.start_broker(f"zone-{z}", f"broker-{z}") for z in "abc"]
    await cluster.create(journal_spec(J, replication=3), brokers)

    for i in range(5):
        resp = await cluster.append(brokers[0], J, [f"append {i}\n".encode(), b"x" * (i + 1)])
        assert resp.status == pb.OK, resp

    expected = b"".join(f"append {i}\n".encode() + b"x" * (i + 1) for i in range(5))
    # Success was reported only after every replica acknowledged the commit.
    for b in brokers:
        assert local_content(b, J) == (0, expected), b


async def test_append_to_a_replica_is_proxied_to_the_primary(cluster: Cluster) -> None:
    primary, other = (
        await cluster.start_broker("zone-a", "aaaa"),
        await cluster.start_broker("zone-b", "bbbb"),
    )
    await cluster.create(journal_spec(J, replication=2), [primary, other])

    resp = await cluster.append(other, J, [b"via the replica\n"])

    assert resp.status == pb.OK
    assert resp.header.process_id == primary.id  # Answered by the primary.
    assert local_content(primary, J) == (0, b"via the replica\n")
    assert local_content(other, J) == (0, b"via the replica\n")

    # do_not_proxy: the replica answers itself, and refuses.
    resp = await cluster.append(other, J, [b"no"], do_not_proxy=True)
    assert resp.status == pb.NOT_JOURNAL_PRIMARY_BROKER
    assert resp.header.process_id == other.id


async def test_concurrent_appenders_never_interleave(cluster: Cluster) -> None:
    brokers = [await cluster.start_broker(f"zone-{z}", f"broker-{z}") for z in "ab"]
    await cluster.create(journal_spec(J, replication=2), brokers)

    async def appender(tag: bytes, n: int) -> list[pb.AppendResponse]:
        out = []
        for i in range(n):
            # Several chunks per append: an interleaving would split them.
            chunks = [tag + b"<", str(i).encode() * 3, b">" + tag + b"\n"]
            out.append(await cluster.append(brokers[i % 2], J, chunks))
        return out

    results = await asyncio.gather(*(appender(t, 8) for t in (b"A", b"B", b"C")))
    _, content = local_content(brokers[0], J)
    assert local_content(brokers[1], J) == (0, content)
    for tag, responses in zip((b"A", b"B", b"C"), results, strict=True):
        for i, resp in enumerate(responses):
            assert resp.status == pb.OK
            expected = tag + b"<" + str(i).encode() * 3 + b">" + tag + b"\n"
            # Each append's bytes are contiguous, exactly at its reported offsets.
            assert content[resp.commit.begin : resp.commit.end] == expected
    spans = sorted((r.commit.begin, r.commit.end) for rs in results for r in rs)
    assert spans[0][0] == 0 and spans[-1][1] == len(content)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


async def test_client_abort_rolls_back_everywhere_and_offsets_are_reused(
    cluster: Cluster,
) -> None:
    brokers = [await cluster.start_broker(f"zone-{z}", f"broker-{z}") for z in "abc"]
    await cluster.create(journal_spec(J, replication=3), brokers)
    assert (await cluster.append(brokers[0], J, [b"first\n"])).status == pb.OK

    # A stream that ends without the empty commit chunk is rolled back.
    with pytest.raises(grpc.aio.AioRpcError):
        await cluster.append(brokers[0], J, [b"partial ", b"content"], commit=False)

    # A client that cancels mid-stream is rolled back too (whenever the cancellation lands;
    # test_broker_append_fsm drives the same path with the chunk certainly on every peer).
    call = cluster.stub(brokers[0]).Append()
    await call.write(pb.AppendRequest(journal=J))
    await call.write(pb.AppendRequest(content=b"cancelled content"))
    call.cancel()

    resp = await cluster.append(brokers[0], J, [b"second\n"])
    assert resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (6, 13)  # The aborted range is reused.
    for b in brokers:
        assert local_content(b, J) == (0, b"first\nsecond\n")


async def test_wrong_append_offset(cluster: Cluster) -> None:
    b = await cluster.start_broker("zone-a", "broker-a")
    await cluster.create(journal_spec(J), [b])
    assert (await cluster.append(b, J, [b"12345"])).status == pb.OK

    resp = await cluster.append(b, J, [b"nope"], offset=3)
    assert resp.status == pb.WRONG_APPEND_OFFSET
    resp = await cluster.append(b, J, [b"yes"], offset=5)
    assert resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (5, 8)
    assert local_content(b, J) == (0, b"12345yes")


async def test_registers_check_union_subtract(cluster: Cluster) -> None:
    b = await cluster.start_broker("zone-a", "broker-a")
    await cluster.create(journal_spec(J), [b])
    owner_a = label_set([("owner", "a")])
    sel_a = pb.LabelSelector(include=owner_a)
    sel_b = pb.LabelSelector(include=label_set([("owner", "b")]))

    # Empty registers match any selector.
    resp = await cluster.append(b, J, [b"1"], check_registers=sel_b, union_registers=owner_a)
    assert resp.status == pb.OK
    assert resp.registers == owner_a

    resp = await cluster.append(b, J, [b"2"], check_registers=sel_b)
    assert resp.status == pb.REGISTER_MISMATCH
    assert resp.registers == owner_a

    # Union keeps other names; subtract removes a name only with its exact values.
    resp = await cluster.append(
        b, J, [b"3"], check_registers=sel_a, union_registers=label_set([("epoch", "7")])
    )
    assert resp.registers == label_set([("epoch", "7"), ("owner", "a")])
    resp = await cluster.append(
        b, J, [b"4"], subtract_registers=label_set([("owner", "b"), ("epoch", "7")])
    )
    assert resp.registers == owner_a
    # Registers change only with content: an empty append with an update fails, changing none.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await cluster.append(b, J, [], subtract_registers=owner_a)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    resp = await cluster.append(b, J, [b"5"], check_registers=sel_a)
    assert resp.status == pb.OK
    assert resp.registers == owner_a
    assert local_content(b, J) == (0, b"1345")


async def test_register_check_and_set_race_has_exactly_one_winner(cluster: Cluster) -> None:
    # The fencing pattern of recovery logs: every contender checks that the register still holds
    # the epoch it read and sets its own. Appends are serialised, so exactly one wins; the rest
    # see REGISTER_MISMATCH and append nothing.
    brokers = [
        await cluster.start_broker("zone-a", "broker-a"),
        await cluster.start_broker("zone-b", "broker-b"),
        await cluster.start_broker("zone-a", "broker-c"),
    ]
    await cluster.create(journal_spec(J, replication=3), brokers)
    epoch0 = label_set([("epoch", "0")])
    assert (await cluster.append(brokers[0], J, [b"init;"], union_registers=epoch0)).status == pb.OK

    contenders = 8
    responses = await asyncio.gather(
        *(
            cluster.append(
                brokers[i % 3],  # Non-primaries proxy to the primary.
                J,
                [f"writer-{i};".encode()],
                check_registers=pb.LabelSelector(include=epoch0),
                subtract_registers=epoch0,
                union_registers=label_set([("epoch", f"1-{i}")]),
            )
            for i in range(contenders)
        )
    )
    winners = [i for i, r in enumerate(responses) if r.status == pb.OK]
    assert len(winners) == 1
    assert all(r.status == pb.REGISTER_MISMATCH for r in responses if r.status != pb.OK)
    winner = winners[0]
    expected = b"init;" + f"writer-{winner};".encode()
    for b in brokers:
        assert local_content(b, J) == (0, expected)
    assert responses[winner].registers == label_set([("epoch", f"1-{winner}")])


async def test_refusals_reach_an_appender_however_much_it_streamed(cluster: Cluster) -> None:
    # The broker refuses (in-band status) while the Appender is still writing: grpc.aio could
    # replace the answer with INTERNAL (grpc issue 36066) unless the broker reads the client's
    # stream to its end first (request_stream.read_to_end). Also through a proxying broker.
    primary = await cluster.start_broker("zone-a", "aaaa")
    proxy = await cluster.start_broker("zone-b", "bbbb")
    await cluster.create(journal_spec(J), [primary])
    held = label_set([("owner", "a")])
    assert (await cluster.append(primary, J, [b"1"], union_registers=held)).status == pb.OK
    errors = []
    for i in range(60):
        client = JournalClient((primary if i % 2 else proxy).endpoint)
        try:
            request = pb.AppendRequest(journal=J, check_registers=pb.LabelSelector(exclude=held))
            appender = Appender(client, request, chunk_bytes_max=64 << 10)
            with pytest.raises(StatusError) as refused:
                await appender.write(b"x" * (1 << (i % 25)))
                await appender.commit()
            errors.append(type(refused.value))
        finally:
            await client.close()
    assert errors == [RegisterMismatchError] * 60
    assert local_content(primary, J) == (0, b"1")


async def test_an_aborted_append_reports_its_status_however_much_was_streamed(
    cluster: Cluster,
) -> None:
    # As above, for appends the broker aborts with a gRPC status (here: a malformed first
    # message, INVALID_ARGUMENT) while the client is still writing.
    b = await cluster.start_broker("zone-a", "broker-a")
    await cluster.create(journal_spec(J), [b])
    codes = []
    for i in range(60):
        chunks = [b"x" * (1 << (i % 22))] * 2
        with pytest.raises(grpc.aio.AioRpcError) as aborted:
            await cluster.append(b, "not a journal name", chunks)
        codes.append(aborted.value.code())
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 60


async def test_an_append_the_primary_aborts_reports_its_status_through_a_proxy(
    cluster: Cluster,
) -> None:
    # As above, through a proxying broker: the primary aborts (a malformed message mid-stream:
    # INVALID_ARGUMENT) while the client is still writing to the proxy. The primary reads the
    # forwarded stream to its end first, so the proxy has forwarded all and relays the status.
    primary = await cluster.start_broker("zone-a", "aaaa")
    proxy = await cluster.start_broker("zone-b", "bbbb")
    await cluster.create(journal_spec(J), [primary])
    codes = []
    for i in range(40):
        call = cluster.stub(proxy).Append()
        messages = [pb.AppendRequest(journal=J), pb.AppendRequest(content=b"ok")]
        messages += [pb.AppendRequest(content=b"x", offset=1)]  # Invalid after the first.
        messages += [pb.AppendRequest(content=b"y" * (1 << (i % 18)))] * 4 + [pb.AppendRequest()]
        try:
            for message in messages:
                await call.write(message)
            await call.done_writing()
        except grpc.aio.AioRpcError:
            pass  # The broker answered early: read its answer.
        with pytest.raises(grpc.aio.AioRpcError) as aborted:
            await call
        codes.append(aborted.value.code())
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 40
    assert local_content(primary, J) == (0, b"")


async def test_a_proxied_request_meant_for_another_broker_is_refused_as_transient(
    cluster: Cluster,
) -> None:
    # Found by the soak: a broker proxied an append to the address of a broker that had just
    # restarted and not announced itself yet; the new process refused it FAILED_PRECONDITION
    # ("not us"), which clients take as final, and a shard's commit failed on it for good.
    # The proxy's view is behind: UNAVAILABLE, retried. A header from another etcd cluster
    # stays FAILED_PRECONDITION (no retry fixes that).
    b = await cluster.start_broker("zone-a", "broker-a")
    await cluster.create(journal_spec(J), [b])
    resp = await cluster.append(b, J, [b"first\n"])
    meant_elsewhere = pb.Header()
    meant_elsewhere.CopyFrom(resp.header)
    meant_elsewhere.process_id.CopyFrom(pb.ProcessSpec.ID(zone="zone-a", suffix="restarted"))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await cluster.append(b, J, [b"not here\n"], header=meant_elsewhere)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "not us" in (refused.value.details() or "")

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await cluster.append(b, J, [b"foreign\n"], header=header_of_another_cluster(resp.header))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert local_content(b, J) == (0, b"first\n")

    # Reads are resolved alike.
    async def read_code(header: pb.Header) -> grpc.StatusCode:
        call = cluster.stub(b).Read(pb.ReadRequest(journal=J, header=header))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in call:
                pass
        return refused.value.code()

    assert await read_code(meant_elsewhere) == grpc.StatusCode.UNAVAILABLE
    assert await read_code(header_of_another_cluster(resp.header)) == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
