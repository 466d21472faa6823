"""List and Apply RPCs over an embedded keyspace, through a real grpc.aio server on loopback and
the client's list/apply helpers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf.duration_pb2 import Duration

from broker.client.list_apply import (
    apply_journals,
    delete,
    get_journal,
    list_journals,
    upsert,
    watch_journals,
)
from broker.client.route_cache import JournalClient
from broker.keyspace.backend import OpPut
from broker.keyspace.embedded import EmbeddedBackend, EmbeddedStore
from broker.keyspace.keyspace import KeySpace
from broker.list_apply_api import ListApplyAPI, apply_changes_max
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pb_grpc
from broker.protocol.status import EtcdTransactionFailedError, JournalNotFoundError
from broker.topology import Decoded, assignment_key, item_key, member_key, new_keyspace

ROOT = "/gazette/cluster"
LOCAL = pb.ProcessSpec.ID(zone="zone-a", suffix="broker-a")


def spec(name: str, **labels: str) -> pb.JournalSpec:
    return pb.JournalSpec(
        name=name,
        replication=1,
        labels=pb.LabelSet(
            labels=[pb.Label(name=k.replace("_", "-"), value=v) for k, v in sorted(labels.items())]
        ),
        fragment=pb.JournalSpec.Fragment(
            length=1 << 20,
            compression_codec=pb.NONE,
            refresh_interval=Duration(seconds=30),
        ),
    )


class Servicer(pb_grpc.JournalServicer):  # type: ignore[misc]
    def __init__(self, api: ListApplyAPI) -> None:
        self.api = api

    async def List(self, request: pb.ListRequest, context: Any) -> AsyncIterator[pb.ListResponse]:
        async for response in self.api.list(request, context):
            yield response

    async def Apply(self, request: pb.ApplyRequest, context: Any) -> pb.ApplyResponse:
        return await self.api.apply(request, context)


@dataclass
class Env:
    backend: EmbeddedBackend
    ks: KeySpace[Decoded]
    client: JournalClient
    stub: Any


@contextlib.asynccontextmanager
async def env(
    journals_per_response: int = 1000, *, watch: bool = True, revision_wait_s: float = 10.0
) -> AsyncIterator[Env]:
    """A ListApplyAPI over an embedded store; without `watch`, its mirror stays as loaded."""
    store = EmbeddedStore()
    backend = store.connect()
    ks = new_keyspace(ROOT)
    await ks.load(backend)
    api = ListApplyAPI(
        ks,
        backend,
        ROOT,
        LOCAL,
        journals_per_response=journals_per_response,
        revision_wait_s=revision_wait_s,
    )
    server = grpc.aio.server()
    pb_grpc.add_JournalServicer_to_server(Servicer(api), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = JournalClient(f"http://127.0.0.1:{port}")
    try:
        async with asyncio.TaskGroup() as tg:
            watching = tg.create_task(ks.watch(backend)) if watch else None
            try:
                yield Env(backend, ks, client, client.default_stub())
            finally:
                if watching is not None:
                    watching.cancel()
    finally:
        await client.close()
        await server.stop(None)
        await backend.close()


def names(response: pb.ListResponse) -> list[str]:
    return [j.spec.name for j in response.journals]


async def test_apply_creates_and_list_selects_by_labels_and_meta_labels() -> None:
    async with env() as e:
        applied = await apply_journals(
            e.client,
            [
                upsert(spec("logs/clicks/part-000", topic="clicks")),
                upsert(spec("logs/clicks/part-001", topic="clicks")),
                upsert(spec("logs/views/part-000", topic="views")),
                upsert(spec("other/journal")),
            ],
        )
        assert applied.status == pb.OK and applied.header.process_id == LOCAL
        assert applied.header.route.primary == -1
        revision = applied.header.etcd.revision

        everything = await list_journals(e.client)
        assert names(everything) == [
            "logs/clicks/part-000",
            "logs/clicks/part-001",
            "logs/views/part-000",
            "other/journal",
        ]
        assert everything.header.etcd.revision == revision  # Apply waited for its own write.
        assert all(j.mod_revision == j.create_revision == revision for j in everything.journals)
        assert names(await list_journals(e.client, "topic=clicks")) == [
            "logs/clicks/part-000",
            "logs/clicks/part-001",
        ]
        assert names(await list_journals(e.client, "prefix=logs/")) == names(everything)[:3]
        assert names(await list_journals(e.client, "name:prefix=logs/v")) == ["logs/views/part-000"]
        assert names(await list_journals(e.client, "topic,prefix notin (logs/clicks/)")) == [
            "logs/views/part-000"
        ]
        assert names(await list_journals(e.client, "name=other/journal")) == ["other/journal"]
        assert (await get_journal(e.client, "other/journal")).name == "other/journal"
        with pytest.raises(JournalNotFoundError):
            await get_journal(e.client, "missing/journal")


async def test_a_stale_expectation_fails_the_whole_transaction() -> None:
    async with env() as e:
        first = await apply_journals(e.client, [upsert(spec("a/one")), upsert(spec("a/two"))])
        created = first.header.etcd.revision
        updated = spec("a/one", owner="me")
        with pytest.raises(EtcdTransactionFailedError):
            # a/two expects a revision it does not have: nothing is applied, a/one included.
            await apply_journals(e.client, [upsert(updated, created), upsert(spec("a/two"), 1)])
        listing = await list_journals(e.client)
        assert [j.spec.labels for j in listing.journals] == [pb.LabelSet(), pb.LabelSet()]

        await apply_journals(e.client, [upsert(updated, created), delete("a/two", created)])
        listing = await list_journals(e.client)
        assert names(listing) == ["a/one"]
        assert listing.journals[0].spec == updated
        # -1 skips the comparison; 0 requires absence.
        await apply_journals(e.client, [upsert(spec("a/one"), -1)])
        with pytest.raises(EtcdTransactionFailedError):
            await apply_journals(e.client, [upsert(spec("a/one"), 0)])


async def test_a_live_journals_replication_mode_cannot_change() -> None:
    """Found by audit (2026-11-29): a journal relabelled from all-replicas to quorum took
    acknowledged quorum appends over its committed content, and its reads stalled. A change of
    the label is refused, nothing applied; other changes of the spec, and a journal deleted and
    created again in the other mode, are fine."""
    quorum = {"gazette.dev/replication-mode": "quorum"}
    async with env() as e:
        await apply_journals(e.client, [upsert(spec("a/one")), upsert(_labelled("a/two", quorum))])
        for journal, labels, was, now in (
            ("a/one", quorum, "all-replicas", "quorum"),
            ("a/two", {}, "quorum", "all-replicas"),
            ("a/two", {"gazette.dev/replication-mode": "all-replicas"}, "quorum", "all-replicas"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await apply_journals(
                    e.client, [upsert(spec("a/three")), upsert(_labelled(journal, labels), -1)]
                )
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (
                f"changes[1].upsert.labels: journal {journal!r} is replicated {was!r}"
                f" (gazette.dev/replication-mode); a live journal's mode cannot change to {now!r}"
            ) in (info.value.details() or "")
        assert names(await list_journals(e.client)) == ["a/one", "a/two"]
        assert (await get_journal(e.client, "a/one")) == spec("a/one")

        await apply_journals(e.client, [upsert(_labelled("a/two", quorum | {"owner": "me"}), -1)])
        await apply_journals(e.client, [delete("a/one")])
        await apply_journals(e.client, [upsert(_labelled("a/one", quorum))])
        assert (await get_journal(e.client, "a/one")) == _labelled("a/one", quorum)


async def test_a_mode_change_the_mirror_has_not_seen_yet_is_not_applied() -> None:
    """The check reads this broker's mirror, which may lag etcd: another writer made a/one a
    quorum journal, and this broker's mirror still shows it all-replicas. An upsert of the
    all-replicas spec without an expectation is guarded on the revision the mirror shows, so
    it is not applied (here the mirror never catches up: UNAVAILABLE, nothing applied)."""
    quorum = _labelled("a/one", {"gazette.dev/replication-mode": "quorum"})
    async with env(watch=False, revision_wait_s=0.5) as e:
        await e.backend.put(item_key(ROOT, "a/one").encode(), spec("a/one").SerializeToString())
        await e.ks.load(e.backend)  # The mirror shows a/one all-replicas...
        key = item_key(ROOT, "a/one").encode()
        await e.backend.put(key, quorum.SerializeToString())  # ...and it is quorum now.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await e.stub.Apply(pb.ApplyRequest(changes=[upsert(spec("a/one"), -1)]))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "did not reach revision" in (info.value.details() or "")
        stored = (await e.backend.range(key)).kvs[0].value
        assert pb.JournalSpec.FromString(stored) == quorum


async def test_a_mode_change_expected_at_a_revision_the_mirror_has_not_seen_is_not_applied() -> (
    None
):
    """As above, the client naming the revision it read elsewhere (the quorum spec's): its own
    expectation holds in etcd, and the guard on the spec the mirror checked still refuses."""
    quorum = _labelled("a/one", {"gazette.dev/replication-mode": "quorum"})
    async with env(watch=False, revision_wait_s=0.5) as e:
        key = item_key(ROOT, "a/one").encode()
        await e.backend.put(key, spec("a/one").SerializeToString())
        await e.ks.load(e.backend)
        header = await e.backend.put(key, quorum.SerializeToString())
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await e.stub.Apply(pb.ApplyRequest(changes=[upsert(spec("a/one"), header.revision)]))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert pb.JournalSpec.FromString((await e.backend.range(key)).kvs[0].value) == quorum


async def test_an_expectation_of_a_revision_never_seen_fails_at_once() -> None:
    async with env() as e:
        await apply_journals(e.client, [upsert(spec("a/one"))])
        with pytest.raises(EtcdTransactionFailedError):
            await apply_journals(e.client, [upsert(spec("a/one"), 1 << 40)])
        assert (await get_journal(e.client, "a/one")) == spec("a/one")


def _labelled(name: str, labels: dict[str, str]) -> pb.JournalSpec:
    out = spec(name)
    out.labels.CopyFrom(
        pb.LabelSet(labels=[pb.Label(name=k, value=v) for k, v in sorted(labels.items())])
    )
    return out


def _mixed_sign_refresh(name: str) -> pb.JournalSpec:
    # 10s - 5ns: not a Duration Go can decode, nor one that renders as JSON.
    out = spec(name)
    out.fragment.refresh_interval.CopyFrom(Duration(seconds=10, nanos=-5))
    return out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            pb.ApplyRequest.Change(upsert=pb.JournalSpec(name="a/bad", replication=1)),
            "ApplyRequest.changes[1].upsert.fragment.length: must be in [1024, 17179869184]",
        ),
        (
            pb.ApplyRequest.Change(upsert=spec("a/bad"), delete="a/bad"),
            "changes[1]: both upsert and delete are set",
        ),
        (pb.ApplyRequest.Change(), "changes[1]: neither upsert nor delete is set"),
        (
            pb.ApplyRequest.Change(delete="a/bad", expect_mod_revision=0),
            "changes[1].expect_mod_revision: must be > 0 or -1",
        ),
        (upsert(spec("a/good")), "changes[1]: must not change journal 'a/good' twice"),
        (
            upsert(_mixed_sign_refresh("a/bad")),
            "changes[1].upsert.fragment.refresh_interval: seconds and nanos must have the same sign",
        ),
    ],
)
async def test_invalid_changes_are_refused_and_nothing_is_applied(
    change: pb.ApplyRequest.Change, message: str
) -> None:
    async with env() as e:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await apply_journals(e.client, [upsert(spec("a/good")), change])
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in (info.value.details() or "")
        assert names(await list_journals(e.client)) == []


async def test_too_many_changes_are_refused() -> None:
    async with env() as e:
        changes = [upsert(spec(f"a/j{i:04d}")) for i in range(apply_changes_max + 1)]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await apply_journals(e.client, changes)
        assert "at most 128 changes" in (info.value.details() or "")


async def test_list_reports_routes_with_endpoints() -> None:
    async with env() as e:
        await apply_journals(e.client, [upsert(spec("a/routed")), upsert(spec("a/unassigned"))])
        peer = pb.ProcessSpec.ID(zone="zone-b", suffix="broker-b")
        for member, endpoint in ((LOCAL, "http://a:8080"), (peer, "http://b:8080")):
            broker = pb.BrokerSpec(process_spec=pb.ProcessSpec(id=member, endpoint=endpoint))
            await e.backend.put(
                member_key(ROOT, member.zone, member.suffix).encode(), broker.SerializeToString()
            )
        await e.backend.put(assignment_key(ROOT, "a/routed", "zone-b", "broker-b", 0).encode(), b"")
        last = await e.backend.put(
            assignment_key(ROOT, "a/routed", "zone-a", "broker-a", 1).encode(), b""
        )
        await e.ks.wait_for_revision(last.revision, 5)
        listing = await list_journals(e.client)
        routed, unassigned = listing.journals
        assert list(routed.route.members) == [LOCAL, peer]
        assert routed.route.primary == 1
        assert list(routed.route.endpoints) == ["http://a:8080", "http://b:8080"]
        assert unassigned.route == pb.Route(primary=-1)
        # The client learned the routes: reads of a/routed now go to a route member.
        assert e.client.endpoint_for("a/routed", require_primary=True) == "http://b:8080"


async def test_a_spec_stored_with_an_invalid_duration_is_left_out_of_listings() -> None:
    # Stored by an older broker, which did not check durations: Go cannot decode it, and it
    # would not render as JSON or YAML, so it must not break the listing of every journal.
    async with env() as e:
        await apply_journals(e.client, [upsert(spec("a/good"))])
        bad = _mixed_sign_refresh("a/bad")
        last = await e.backend.put(item_key(ROOT, "a/bad").encode(), bad.SerializeToString())
        await e.ks.wait_for_revision(last.revision, 5)
        listing = await list_journals(e.client)
        assert names(listing) == ["a/good"]


async def test_large_listings_are_split_across_messages() -> None:
    async with env(journals_per_response=3) as e:
        await apply_journals(e.client, [upsert(spec(f"a/j{i}")) for i in range(7)])
        messages = [m async for m in e.stub.List(pb.ListRequest())]
        assert [len(m.journals) for m in messages] == [3, 3, 1]
        assert messages[0].HasField("header") and not messages[1].HasField("header")
        # The client joins them into one snapshot.
        assert names(await list_journals(e.client)) == [f"a/j{i}" for i in range(7)]


async def test_watch_sends_a_snapshot_per_change() -> None:
    async with env() as e:
        await apply_journals(e.client, [upsert(spec("w/one", team="x"))])
        snapshots = watch_journals(e.client, "team=x")
        first = await anext(snapshots)
        assert names(first) == ["w/one"]
        # A change outside the selection sends nothing; the next matching one does.
        await apply_journals(e.client, [upsert(spec("w/other"))])
        await apply_journals(e.client, [upsert(spec("w/two", team="x"))])
        second = await anext(snapshots)
        assert names(second) == ["w/one", "w/two"]
        assert second.header.etcd.revision > first.header.etcd.revision
        await apply_journals(e.client, [delete("w/one")])
        assert names(await anext(snapshots)) == ["w/two"]
        await snapshots.aclose()


async def test_watch_resume_skips_the_snapshot_already_seen() -> None:
    async with env() as e:
        applied = await apply_journals(e.client, [upsert(spec("r/one"))])
        resume = pb.Header(etcd=pb.Header.Etcd(revision=applied.header.etcd.revision))
        call = e.stub.List(pb.ListRequest(watch=True, watch_resume=resume))
        pending = asyncio.ensure_future(call.read())
        later = await apply_journals(e.client, [upsert(spec("r/two"))])
        first = await pending
        assert first.header.etcd.revision == later.header.etcd.revision
        assert names(first) == ["r/one", "r/two"]
        call.cancel()


async def test_invalid_selectors_are_refused() -> None:
    async with env() as e:
        bad = pb.ListRequest(
            selector=pb.LabelSelector(
                include=pb.LabelSet(labels=[pb.Label(name="prefix", value="no/slash")])
            )
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            [m async for m in e.stub.List(bad)]
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "ListRequest.selector.include.labels[prefix]: must end in '/'" in (
            info.value.details() or ""
        )


def _stored(name: str, *stores: str) -> pb.JournalSpec:
    out = spec(name)
    out.fragment.stores.extend(stores)
    return out


async def test_a_journal_named_under_another_may_not_share_its_fragment_store() -> None:
    """Found by audit (2026-11-30): `nest/a/b`'s fragment files are under `<store>/nest/a/`,
    so a listing of `nest/a` took them for its own (postfix `b`) and reads of `nest/a` returned
    `nest/a/b`'s bytes, verified. An Apply making such a pair is refused, naming both, nothing
    applied; other stores, other names, and edits of a pair made elsewhere are fine."""
    s3, other = "s3://bucket/data/?profile=p", "s3://bucket/other/"
    async with env() as e:
        await apply_journals(e.client, [upsert(_stored("nest/a", s3))])
        for changes, refused, named_under in (
            ([upsert(_stored("nest/a/b", "s3://bucket/data/"))], "nest/a/b", "nest/a"),  # Query.
            ([upsert(_stored("nest/x", other)), upsert(_stored("nest", s3))], "nest", "nest/a"),
            ([upsert(_stored("nest/a/b/c", other, s3))], "nest/a/b/c", "nest/a"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await apply_journals(e.client, changes)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            details = info.value.details() or ""
            index = len(changes) - 1
            assert f"changes[{index}].upsert.name: journal {refused!r}" in details
            assert "s3://bucket/data/" in details
            assert f"{max(refused, named_under, key=len)!r} is named under" in details
        assert names(await list_journals(e.client)) == ["nest/a"]  # Nothing applied.

        # Other stores, names that are not nested ("nest/ab"), and both at once are fine.
        await apply_journals(
            e.client,
            [upsert(_stored("nest/a/b", other)), upsert(_stored("nest/ab", s3))],
        )
        # A pair that shares a store already (written by another tool) may be edited...
        made = _stored("nest/a/c", s3).SerializeToString()
        written = await e.backend.txn([], [OpPut(item_key(ROOT, "nest/a/c").encode(), made)])
        await e.ks.wait_for_revision(written.header.revision, 10)
        edited = _stored("nest/a/c", s3)
        edited.replication = 2
        await apply_journals(e.client, [upsert(edited, -1)])
        # ...but not made to share one more (nest/a/b kept to `other` so far).
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await apply_journals(e.client, [upsert(_stored("nest/a/b", other, s3), -1)])
        assert "journal 'nest/a/b' and journal 'nest/a'" in (info.value.details() or "")
        # Deleting the outer journal in the same Apply lifts it.
        await apply_journals(e.client, [delete("nest/a"), upsert(_stored("nest/a/b", s3), -1)])
        assert names(await list_journals(e.client)) == ["nest/a/b", "nest/a/c", "nest/ab"]
