"""Store health through brokers, as a Go client sees it: the FragmentStoreHealth RPC (with the
delete probe) and FRAGMENT_STORE_UNHEALTHY from appends to a journal whose primary store fails
its health checks; appends go through again once the store recovers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from broker.fragment.store_health import HealthSchedule
from broker.fragment.stores.base import Content, StoreError, StoreURL
from broker.fragment.stores.file_store import FileStore
from broker.fragment.stores.registry import StoreRegistry, new_registry
from broker.protocol import protocol_pb2 as pb
from tests.broker.broker_testkit import Cluster, journal_spec

J = "health/journal"
STORE = "file:///frags/"
FAST = HealthSchedule(retry_intervals_s=(0.0, 0.01), healthy_interval_s=3600.0, jitter=0.0)


class BrokenFileStore(FileStore):
    """A file store whose puts or deletes can be made to fail (permissions taken away)."""

    def __init__(self, url: StoreURL, root: Path) -> None:
        super().__init__(url, root=root)
        self.fail_put = False
        self.fail_delete = False

    async def _put(self, key: str, content: Content, content_encoding: str) -> None:
        if self.fail_put:
            raise StoreError("AccessDenied (injected)")
        await super()._put(key, content, content_encoding)

    async def _delete(self, key: str) -> None:
        if self.fail_delete:
            raise StoreError("AccessDenied on delete (injected)")
        await super()._delete(key)


class Env:
    def __init__(self, root: Path) -> None:
        (root / "frags").mkdir()
        (root / "broken").mkdir()
        self.registry: StoreRegistry = new_registry(file_root=root)
        self.registry.register("file", lambda url: BrokenFileStore(url, root))

    def store(self, url: str = STORE) -> BrokenFileStore:
        built = self.registry.get(url)
        assert isinstance(built, BrokenFileStore)
        return built


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[Cluster, Env]]:
    stores = Env(tmp_path)
    cluster = Cluster(stores=stores.registry)
    try:
        yield cluster, stores
    finally:
        await cluster.close()


async def health(
    cluster: Cluster, store: str, *, check_delete: bool = False, prefix: str = ""
) -> pb.FragmentStoreHealthResponse:
    request = pb.FragmentStoreHealthRequest(
        fragment_store=store, check_delete=check_delete, check_delete_prefix=prefix
    )
    response: pb.FragmentStoreHealthResponse = await cluster.stub(
        cluster.brokers[0]
    ).FragmentStoreHealth(request)
    return response


async def test_fragment_store_health_rpc(env: tuple[Cluster, Env]) -> None:
    cluster, stores = env
    broker = await cluster.start_broker("zone-a", "broker-a", store_health=FAST)
    resp = await health(cluster, STORE)
    assert (resp.status, resp.store_health_error) == (pb.OK, "")
    # An unrouted header: this broker, no route, the keyspace's revision.
    assert resp.header.process_id == broker.id
    assert resp.header.route == pb.Route(primary=-1)
    assert resp.header.etcd.revision == broker.ks.header.revision

    # The delete probe, at the root and under a prefix.
    assert (await health(cluster, STORE, check_delete=True)).status == pb.OK
    assert (await health(cluster, STORE, check_delete=True, prefix="recovery/")).status == pb.OK
    stores.store().fail_delete = True
    resp = await health(cluster, STORE, check_delete=True, prefix="recovery/")
    assert resp.status == pb.FRAGMENT_STORE_UNHEALTHY
    assert "delete-probe DELETE failed: AccessDenied" in resp.store_health_error

    # A store that fails its checks (its first one is awaited).
    other = "file:///broken/"
    stores.store(other).fail_put = True
    resp = await health(cluster, other)
    assert resp.status == pb.FRAGMENT_STORE_UNHEALTHY
    assert f"fragment store {other}: health check PUT failed" in resp.store_health_error


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        (
            pb.FragmentStoreHealthRequest(fragment_store="s3://bucket/no-slash"),
            "fragment_store: path must end in '/'",
        ),
        (
            pb.FragmentStoreHealthRequest(fragment_store="ftp://host/path/"),
            "fragment_store: unsupported fragment store scheme 'ftp'",
        ),
        (
            pb.FragmentStoreHealthRequest(fragment_store=STORE, check_delete_prefix="p/"),
            "check_delete_prefix: cannot be set when check_delete is false",
        ),
        (
            pb.FragmentStoreHealthRequest(
                fragment_store=STORE, check_delete=True, check_delete_prefix="p"
            ),
            "check_delete_prefix: must end in '/'",
        ),
        (
            pb.FragmentStoreHealthRequest(
                fragment_store=STORE, check_delete=True, check_delete_prefix="../up/"
            ),
            "check_delete_prefix: cannot traverse outside the store",
        ),
    ],
    ids=["no-slash", "scheme", "prefix-without-delete", "prefix-slash", "traversal"],
)
async def test_bad_requests_are_refused(
    env: tuple[Cluster, Env], request_: pb.FragmentStoreHealthRequest, error: str
) -> None:
    cluster, _ = env
    await cluster.start_broker("zone-a", "broker-a", store_health=FAST)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await cluster.stub(cluster.brokers[0]).FragmentStoreHealth(request_)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error in (caught.value.details() or "")


async def test_appends_fail_while_the_primary_store_is_unhealthy(
    env: tuple[Cluster, Env],
) -> None:
    cluster, stores = env
    store = stores.store()
    store.fail_put = True
    broker = await cluster.start_broker(
        "zone-a", "broker-a", store_health=FAST, pulse_enabled=False
    )
    await cluster.create(journal_spec(J, stores=[STORE]), [broker])
    resp = await cluster.append(broker, J, [b"never"])
    assert resp.status == pb.FRAGMENT_STORE_UNHEALTHY
    assert f"fragment store {STORE}: health check PUT failed" in resp.store_health_error
    assert resp.header.etcd.revision > 0
    assert broker.resolver.replicas[J].index.end_offset == 0  # Nothing was appended.

    store.fail_put = False
    resp = await cluster.append(broker, J, [b"hello"])
    assert (resp.status, resp.commit.begin, resp.commit.end) == (pb.OK, 0, 5)
