"""The Shard gRPC service of consumer members, over real gRPC and the embedded keyspace:
List/Apply/Unassign/GetHints round trips and their bad input, and Stat of local, remote,
missing, primary-less and stopped shards."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest

from broker.keyspace.backend import Backend
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import recorded_op_pb2 as rpb
from broker.protocol.status import (
    NoShardPrimaryError,
    ShardEtcdTransactionFailedError,
    ShardNotFoundError,
    ShardStoppedError,
)
from gazette_consumer.shard_client import ShardClient, ShardRequestError, delete, upsert
from tests.gazette_consumer.consumer_testkit import Group, Node, primary_and_standbys, shard_spec


@pytest.fixture
async def group() -> AsyncIterator[Group]:
    g = await Group.open()
    try:
        yield g
    finally:
        await g.close()


@pytest.fixture
async def one(group: Group) -> AsyncIterator[tuple[Node, ShardClient]]:
    node = await group.join("zone-a", "consumer-a")
    async with ShardClient(node.member.endpoint) as client:
        yield node, client


def specs(listing: cpb.ListResponse) -> dict[str, tuple[cpb.ShardSpec, int]]:
    return {s.spec.id: (s.spec, s.mod_revision) for s in listing.shards}


# --- Apply and List ------------------------------------------------------------------------------


async def test_apply_then_list_round_trip(group: Group, one: tuple[Node, ShardClient]) -> None:
    _, client = one
    a = shard_spec("shard-a", team="counts", sources=("examples/words",))
    b = shard_spec("shard-b", team="sums")
    applied = await client.apply([upsert(a), upsert(b)])
    listing = await client.list_shards()
    got = specs(listing)
    assert [s.spec for s in listing.shards] == [a, b]
    assert got["shard-a"][1] == got["shard-b"][1] == applied.header.etcd.revision

    # Selectors see the labels and the meta-label "id".
    assert [s.spec.id for s in (await client.list_shards("team=sums")).shards] == ["shard-b"]
    assert [s.spec.id for s in (await client.list_shards("id=shard-a")).shards] == ["shard-a"]
    assert [s.spec.id for s in (await client.list_shards("id!=shard-a")).shards] == ["shard-b"]

    # Once assigned, a shard lists its route (with endpoints) and one status per member.
    await group.until(primary_and_standbys(group, ["shard-a", "shard-b"], standbys=0))
    [listed] = (await client.list_shards("id=shard-a")).shards
    assert [(m.zone, m.suffix) for m in listed.route.members] == [("zone-a", "consumer-a")]
    assert listed.route.primary == 0
    assert list(listed.route.endpoints) == [one[0].member.endpoint]
    assert [s.code for s in listed.status] == [cpb.ReplicaStatus.PRIMARY]

    # An update guarded by the current revision applies; a deletion too.
    a.hot_standbys = 2
    await client.apply([upsert(a, got["shard-a"][1]), delete("shard-b", got["shard-b"][1])])
    after = specs(await client.list_shards())
    assert list(after) == ["shard-a"] and after["shard-a"][0].hot_standbys == 2


async def test_a_stale_revision_changes_nothing(one: tuple[Node, ShardClient]) -> None:
    _, client = one
    await client.apply([upsert(shard_spec("shard-a")), upsert(shard_spec("shard-b"))])
    before = specs(await client.list_shards())
    changed = shard_spec("shard-a", team="x")
    fresh = shard_spec("shard-c")
    # One stale guard (and one "must not exist" of an existing shard) fails the whole request.
    with pytest.raises(ShardEtcdTransactionFailedError):
        await client.apply([upsert(changed, before["shard-a"][1] - 1), upsert(fresh)])
    with pytest.raises(ShardEtcdTransactionFailedError):
        await client.apply([upsert(fresh), upsert(shard_spec("shard-b"), 0)])
    assert specs(await client.list_shards()) == before


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (upsert(cpb.ShardSpec(id="shard-x")), "changes[1].upsert.max_txn_duration: must be > 0s"),
        (upsert(shard_spec("bad#id")), "changes[1].upsert.id"),
        (upsert(shard_spec("shard-x"), -2), "changes[1].expect_mod_revision: must be >= 0 or -1"),
        (delete("shard-x", 0), "changes[1].expect_mod_revision: must be > 0 or -1"),
        (cpb.ApplyRequest.Change(), "changes[1]: neither upsert nor delete is set"),
        (upsert(shard_spec("shard-ok")), "changes[1]: must not change shard 'shard-ok' twice"),
    ],
)
async def test_bad_apply_requests_change_nothing(
    one: tuple[Node, ShardClient], change: cpb.ApplyRequest.Change, field: str
) -> None:
    _, client = one
    with pytest.raises(ShardRequestError, match=f"^ApplyRequest\\.{field}".replace("[", "\\[")):
        await client.apply([upsert(shard_spec("shard-ok")), change])
    assert (await client.list_shards()).shards == []


async def test_bad_list_selector_is_refused(one: tuple[Node, ShardClient]) -> None:
    _, client = one
    bad = cpb.ListRequest()
    bad.selector.include.labels.add(name="x", value="bad\x01value")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.stub().List(bad)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ListRequest.selector.include" in (err.value.details() or "")


# --- Unassign ------------------------------------------------------------------------------------


async def test_unassign_moves_primaries_and_failed_replicas(
    group: Group, one: tuple[Node, ShardClient]
) -> None:
    node, client = one
    await client.apply([upsert(shard_spec("shard-a")), upsert(shard_spec("shard-b"))])
    await group.until(primary_and_standbys(group, ["shard-a", "shard-b"], standbys=0))

    # Nothing failed: only_failed removes nothing; a dry run names what would go.
    assert await client.unassign(["shard-a", "shard-b"], only_failed=True) == []
    assert await client.unassign(["shard-a"], dry_run=True) == ["shard-a"]
    assert [f.spec.id for f in node.shards.started] == ["shard-a", "shard-b"]

    # An unknown shard fails the request, which removes nothing.
    with pytest.raises(ShardNotFoundError):
        await client.unassign(["shard-a", "shard-nope"])
    with pytest.raises(ShardRequestError, match=r"UnassignRequest\.shards\[0\]"):
        await client.unassign(["bad#id"])

    # The primary's assignment goes; the allocator assigns the shard again and a new replica
    # starts (the only member is the only place for it).
    node.shards.running("shard-b").fail("boom")
    await group.until(
        lambda: (
            None
            if group.assignments()["shard-b"][0].status.code == cpb.ReplicaStatus.FAILED
            else "shard-b not failed yet"
        )
    )
    assert await client.unassign(["shard-a", "shard-b"], only_failed=True) == ["shard-b"]
    await group.until(primary_and_standbys(group, ["shard-a", "shard-b"], standbys=0))
    assert [f.spec.id for f in node.shards.started] == ["shard-a", "shard-b", "shard-b"]
    assert await client.unassign(["shard-a"]) == ["shard-a"]
    await group.until(primary_and_standbys(group, ["shard-a", "shard-b"], standbys=0))
    assert [f.spec.id for f in node.shards.started].count("shard-a") == 2


# --- GetHints ------------------------------------------------------------------------------------


async def test_get_hints(group: Group, one: tuple[Node, ShardClient]) -> None:
    _, client = one
    plain = shard_spec("shard-plain")
    logged = shard_spec("shard-logged")
    logged.recovery_log_prefix = "recovery/logs"
    logged.hint_prefix = "/hints"
    logged.hint_backups = 2
    await client.apply([upsert(plain), upsert(logged)])

    # No recovery log (every shard today: recovery logs are not built yet): no hints.
    none = await client.get_hints("shard-plain")
    assert not none.primary_hints.HasField("hints") and list(none.backup_hints) == []

    # Hints as Gazette stores them: binary at the primary key, JSON at a backup key.
    primary = rpb.FSMHints(log="recovery/logs/shard-logged")
    primary.live_nodes.add(fnode=3).segments.add(author=7, first_seq_no=3, last_seq_no=9)
    await group.admin.put(b"/hints/shard-logged.primary", primary.SerializeToString())
    await group.admin.put(
        b"/hints/shard-logged.backup.1", b'{"log": "recovery/logs/shard-logged", "live_nodes": []}'
    )
    got = await client.get_hints("shard-logged")
    assert got.primary_hints.hints == primary
    assert [h.HasField("hints") for h in got.backup_hints] == [False, True]
    assert got.backup_hints[1].hints.log == "recovery/logs/shard-logged"

    await group.admin.put(b"/hints/shard-logged.backup.0", b"\xff\xff not hints")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.get_hints("shard-logged")
    assert err.value.code() == grpc.StatusCode.DATA_LOSS
    assert "/hints/shard-logged.backup.0" in (err.value.details() or "")
    with pytest.raises(ShardNotFoundError):
        await client.get_hints("shard-nope")


# --- Stat ----------------------------------------------------------------------------------------


async def test_stat_of_a_local_primary_waits_for_read_through(
    group: Group, one: tuple[Node, ShardClient]
) -> None:
    node, client = one
    await client.apply([upsert(shard_spec("shard-a", sources=("in/a", "in/b")))])
    await group.until(primary_and_standbys(group, ["shard-a"], standbys=0))
    fake = node.shards.running("shard-a")
    fake.advance({"in/a": 10}, {"out/x": 5})
    assert dict((await client.stat("shard-a")).read_through) == {"in/a": 10}

    # Asked to read through offsets it has not reached (and one of a journal it does not
    # read, which is ignored), it answers only once a transaction got there.
    looked = fake.progress_read
    stat = asyncio.create_task(client.stat("shard-a", {"in/a": 100, "in/b": 7, "other/j": 9}))
    await looked.wait()
    looked = fake.progress_read
    fake.advance({"in/a": 50, "in/b": 7})
    await looked.wait()
    assert not stat.done()
    fake.advance({"in/a": 120, "in/b": 7}, {"out/x": 40})
    response = await stat
    assert dict(response.read_through) == {"in/a": 120, "in/b": 7}
    assert dict(response.publish_at) == {"out/x": 40}
    assert response.header.process_id == node.member.id


async def test_stat_of_a_remote_shard_is_proxied_to_its_primary(group: Group) -> None:
    nodes = [await group.join("zone-a", "consumer-a"), await group.join("zone-b", "consumer-b")]
    async with ShardClient(nodes[0].member.endpoint) as client:
        await client.apply([upsert(shard_spec("shard-r"))])
    await group.until(primary_and_standbys(group, ["shard-r"], standbys=0))
    [assigned] = group.assignments()["shard-r"]
    [b] = [n for n in nodes if n.member.config.suffix == assigned.suffix]  # The primary.
    [a] = [n for n in nodes if n is not b]
    async with ShardClient(a.member.endpoint) as via_a:
        b.shards.running("shard-r").advance({"in/r": 33})
        response = await via_a.stat("shard-r")
        assert dict(response.read_through) == {"in/r": 33}
        assert response.header.process_id == b.member.id
        assert list(response.header.route.endpoints) == [b.member.endpoint]

        # A request already proxied once (it carries a header) is not proxied again.
        proxied = cpb.StatRequest(shard="shard-r", header=response.header)
        proxied.header.process_id.CopyFrom(a.member.id)
        answer = await via_a.stub().Stat(proxied)
        assert answer.status == cpb.NOT_SHARD_PRIMARY
        assert answer.header.process_id == a.member.id
        # One meant for another process is refused.
        misdirected = cpb.StatRequest(shard="shard-r", header=response.header)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await via_a.stub().Stat(misdirected)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_stat_of_missing_primaryless_and_stopped_shards(
    group: Group, one: tuple[Node, ShardClient]
) -> None:
    node, client = one
    disabled = shard_spec("shard-off")
    disabled.disable = True
    await client.apply([upsert(shard_spec("shard-a", sources=("in/a",))), upsert(disabled)])
    await group.until(primary_and_standbys(group, ["shard-a"], standbys=0))
    with pytest.raises(ShardNotFoundError):
        await client.stat("shard-nope")
    with pytest.raises(NoShardPrimaryError):
        await client.stat("shard-off")

    # The primary fails while a Stat waits on it: the Stat is answered SHARD_STOPPED.
    fake = node.shards.running("shard-a")
    looked = fake.progress_read
    stat = asyncio.create_task(client.stat("shard-a", {"in/a": 100}))
    await looked.wait()
    fake.fail("application error")
    with pytest.raises(ShardStoppedError):
        await stat


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (cpb.StatRequest(shard="x"), "StatRequest.shard"),
        (cpb.StatRequest(shard="shard-a", read_through={"in/a": -1}), "StatRequest.read_through"),
    ],
)
async def test_bad_stat_requests_are_refused(
    one: tuple[Node, ShardClient], request_: cpb.StatRequest, field: str
) -> None:
    _, client = one
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.stub().Stat(request_)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(field)


@pytest.mark.etcd
async def test_apply_list_unassign_on_real_etcd() -> None:
    if shutil.which("etcd") is None:
        pytest.skip("etcd not installed: run `make system-deps`")
    from broker.keyspace.etcd import EtcdBackend
    from broker.testing.etcd_server import EtcdServer

    async with EtcdServer() as server:

        async def connect() -> Backend:
            return EtcdBackend([server.endpoint], dial_timeout_s=5, request_timeout_s=5)

        group = await Group.open(connect)
        try:
            node = await group.join("zone-a", "consumer-a")
            async with ShardClient(node.member.endpoint) as client:
                await client.apply([upsert(shard_spec("shard-a")), upsert(shard_spec("shard-b"))])
                before = specs(await client.list_shards())
                with pytest.raises(ShardEtcdTransactionFailedError):
                    await client.apply([upsert(shard_spec("shard-a", team="x"), 0)])
                with pytest.raises(ShardRequestError):
                    await client.apply([upsert(cpb.ShardSpec(id="shard-c"))])
                assert specs(await client.list_shards()) == before
                await group.until(primary_and_standbys(group, ["shard-a", "shard-b"], standbys=0))
                assert await client.unassign(["shard-a"]) == ["shard-a"]
                await group.until(primary_and_standbys(group, ["shard-a", "shard-b"], standbys=0))
                assert [f.spec.id for f in node.shards.started].count("shard-a") == 2
        finally:
            await group.close()
