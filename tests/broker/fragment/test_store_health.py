"""Fragment store health checks (Gazette's): the check's steps against real stores (memory, file,
and S3 on moto, whose signed URL is fetched over HTTP), the delete probe, the retry schedule,
and the monitor's background checks (first check, failure, recovery, bounds)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from broker.fragment.store_health import (
    CHECK_CONTENT,
    CHECK_KEY,
    DELETE_PROBE_NAME,
    FirstCheckPendingError,
    HealthSchedule,
    StoreHealthLimitError,
    StoreHealthMonitor,
    StoreUnhealthyError,
    check_delete,
    run_check,
)
from broker.fragment.stores.base import (
    Content,
    FragmentReader,
    ListedObject,
    StoreError,
    StoreURL,
)
from broker.fragment.stores.file_store import FileStore
from broker.fragment.stores.memory_store import MemoryBuckets, MemoryStore
from broker.fragment.stores.registry import StoreRegistry
from broker.fragment.stores.s3_store import S3Store
from broker.fragments_api import StoreHealthAPI
from broker.protocol import protocol_pb2 as pb
from broker.testing.moto_server import MotoServer, credentials_env

STORE = "memory://bucket/root/"
FAST = HealthSchedule(retry_intervals_s=(0.0, 0.01), healthy_interval_s=3600.0, jitter=0.0)
wait_s = 10.0


class BrokenStore(MemoryStore):
    """A memory store whose operations can be made to fail, one by one."""

    def __init__(self, url: StoreURL, buckets: MemoryBuckets) -> None:
        super().__init__(url, buckets=buckets)
        self.fail_put = False
        self.fail_delete = False
        self.hide_listing = False
        self.corrupt_reads = False
        self.checks = 0

    async def _put(self, key: str, content: Content, content_encoding: str) -> None:
        if self.fail_put:
            raise StoreError("AccessDenied (injected)")
        if key.endswith(CHECK_KEY):
            self.checks += 1
        await super()._put(key, content, content_encoding)

    async def _open(self, key: str) -> FragmentReader:
        if self.corrupt_reads:
            await super()._put(key, b"something else\n", "")
        return await super()._open(key)

    async def _delete(self, key: str) -> None:
        if self.fail_delete:
            raise StoreError("AccessDenied on delete (injected)")
        await super()._delete(key)

    async def _list(self, prefix: str) -> list[ListedObject]:
        return [] if self.hide_listing else await super()._list(prefix)


class Env:
    def __init__(self) -> None:
        self.buckets = MemoryBuckets()
        self.stores: dict[str, BrokenStore] = {}
        self.registry = StoreRegistry({"memory": self._build})

    def _build(self, url: StoreURL) -> BrokenStore:
        store = BrokenStore(url, self.buckets)
        self.stores[url.url] = store
        return store

    def store(self, url: str = STORE) -> BrokenStore:
        built = self.registry.get(url)
        assert isinstance(built, BrokenStore)
        return built


@pytest.fixture
def env() -> Env:
    return Env()


@pytest.fixture
async def monitor(env: Env) -> AsyncIterator[StoreHealthMonitor]:
    m = StoreHealthMonitor(env.registry, FAST)
    task = asyncio.ensure_future(m.run())
    try:
        yield m
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def next_status(monitor: StoreHealthMonitor, url: str) -> StoreUnhealthyError | None:
    """The error of the store's next completed check."""
    next_check, _ = monitor.status(url)
    async with asyncio.timeout(wait_s):
        await next_check.wait()
    return monitor.status(url)[1]


# --- One check ------------------------------------------------------------------------------


async def test_a_check_of_a_healthy_store_leaves_its_test_object(env: Env) -> None:
    store = env.store()
    await run_check(store)
    # Under the store's root, as Gazette's (".test/health-check").
    assert env.buckets.get("bucket", "root/" + CHECK_KEY).data == CHECK_CONTENT  # type: ignore[union-attr]


async def test_a_check_of_a_file_store(tmp_path: Path) -> None:
    (tmp_path / "frags").mkdir()
    store = FileStore(StoreURL.parse("file:///frags/"), root=tmp_path)
    await run_check(store)
    assert (tmp_path / "frags" / ".test" / "health-check").read_bytes() == CHECK_CONTENT
    missing = FileStore(StoreURL.parse("file:///not-mounted/"), root=tmp_path)
    with pytest.raises(StoreUnhealthyError, match=r"file:///not-mounted/: health check PUT failed"):
        await run_check(missing)


@pytest.mark.parametrize(
    ("fault", "step"),
    [
        ("fail_put", "PUT failed: AccessDenied"),
        ("corrupt_reads", "GET failed: content mismatch"),
        ("hide_listing", "LIST failed: the listing does not show the test object"),
    ],
)
async def test_a_failing_step_is_named(env: Env, fault: str, step: str) -> None:
    store = env.store()
    setattr(store, fault, True)
    with pytest.raises(StoreUnhealthyError, match=rf"^fragment store {STORE}: health check {step}"):
        await run_check(store)


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


async def test_a_check_of_s3_fetches_its_signed_url(
    moto: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in credentials_env().items():
        monkeypatch.setenv(key, value)
    bucket = f"health-{secrets.token_hex(6)}"
    moto.create_bucket(bucket)
    store = S3Store(StoreURL.parse(moto.store_url(bucket, "root/")))
    try:
        await run_check(store)
        body = moto.client().get_object(Bucket=bucket, Key="root/" + CHECK_KEY)["Body"].read()
        assert body == CHECK_CONTENT
    finally:
        await store.close()
    # A bucket that does not exist fails the check's first step.
    gone = S3Store(StoreURL.parse(moto.store_url(f"missing-{secrets.token_hex(6)}", "root/")))
    try:
        with pytest.raises(StoreUnhealthyError, match=r"health check PUT failed"):
            await run_check(gone)
    finally:
        await gone.close()


# --- The delete probe -----------------------------------------------------------------------


async def test_the_delete_probe_puts_and_removes_its_object(env: Env) -> None:
    store = env.store()
    await check_delete(store, "recovery/")
    await check_delete(store, "")
    assert env.buckets.get("bucket", f"root/recovery/{DELETE_PROBE_NAME}") is None
    assert env.buckets.get("bucket", f"root/{DELETE_PROBE_NAME}") is None
    store.fail_delete = True
    with pytest.raises(StoreUnhealthyError, match=r"delete-probe DELETE failed: AccessDenied"):
        await check_delete(store, "recovery/")
    store.fail_put = True
    with pytest.raises(StoreUnhealthyError, match=r"delete-probe PUT failed"):
        await check_delete(store, "recovery/")


# --- The schedule ---------------------------------------------------------------------------


def test_the_schedule_is_gazettes() -> None:
    schedule = HealthSchedule(jitter=0.0)
    assert schedule.next_interval_s(True, 7, 0.5) == 30 * 60.0
    assert [schedule.next_interval_s(False, n, 0.5) for n in range(9)] == [
        0.0, 0.1, 1.0, 1.0, 10.0, 10.0, 100.0, 100.0, 100.0,
    ]  # fmt: skip
    jittered = HealthSchedule()  # ±20%
    assert jittered.next_interval_s(False, 4, 0.0) == pytest.approx(8.0)
    assert jittered.next_interval_s(False, 4, 0.999999) == pytest.approx(12.0, rel=1e-5)
    with pytest.raises(ValueError, match="retry_intervals_s"):
        HealthSchedule(retry_intervals_s=())
    with pytest.raises(ValueError, match="jitter"):
        HealthSchedule(jitter=1.0)


# --- The monitor ----------------------------------------------------------------------------


async def test_the_first_check_then_healthy(env: Env, monitor: StoreHealthMonitor) -> None:
    next_check, error = monitor.status(STORE)
    assert isinstance(error, FirstCheckPendingError)
    async with asyncio.timeout(wait_s):
        await next_check.wait()
    assert monitor.status(STORE)[1] is None
    assert env.store().checks == 1  # Healthy: next check in an hour, not before.


async def test_an_unhealthy_store_is_retried_until_it_recovers(
    env: Env, monitor: StoreHealthMonitor
) -> None:
    env.store().fail_put = True
    error = await next_status(monitor, STORE)
    assert isinstance(error, StoreUnhealthyError) and "PUT failed" in str(error)
    error = await next_status(monitor, STORE)  # Retried (at once, then after 10 ms).
    assert error is not None
    env.store().fail_put = False
    while error is not None:  # Each turn waits for the next retry: at most a few.
        error = await next_status(monitor, STORE)
    assert monitor.status(STORE)[1] is None


async def test_waiting_for_health_is_bounded_by_checks(
    env: Env, monitor: StoreHealthMonitor
) -> None:
    env.store().fail_put = True
    never = asyncio.Event()
    async with asyncio.timeout(wait_s):
        error = await monitor.wait_healthy(STORE, never, checks_max=3)
    assert isinstance(error, StoreUnhealthyError) and "PUT failed" in str(error)
    assert env.store().checks == 0  # The put failed every time...
    # ...and the wait ended after the first check and 3 more.
    env.store().fail_put = False
    async with asyncio.timeout(wait_s):
        assert await monitor.wait_healthy(STORE, never, checks_max=50) is None


async def test_an_invalidated_wait_returns_at_once(env: Env, monitor: StoreHealthMonitor) -> None:
    env.store().fail_put = True
    invalidated = asyncio.Event()
    invalidated.set()
    assert await monitor.wait_healthy(STORE, invalidated) is None


async def test_at_most_so_many_stores_are_checked(env: Env) -> None:
    monitor = StoreHealthMonitor(env.registry, FAST, stores_max=1)
    monitor.status(STORE)
    done, error = monitor.status("memory://other/")
    assert done.is_set() and isinstance(error, StoreHealthLimitError)
    assert "already checks 1 stores" in str(error)
    never = asyncio.Event()
    assert isinstance(await monitor.wait_healthy("memory://other/", never), StoreHealthLimitError)


async def test_checks_of_a_store_nobody_asks_about_stop(env: Env) -> None:
    now = [0.0]
    schedule = HealthSchedule(healthy_interval_s=0.01, jitter=0.0, idle_stop_s=60.0)
    monitor = StoreHealthMonitor(env.registry, schedule, clock=lambda: now[0])
    task = asyncio.ensure_future(monitor.run())
    try:
        assert await next_status(monitor, STORE) is None
        now[0] = 61.0  # Nobody asked for longer than idle_stop_s: the loop ends.
        stopped, _ = monitor._health[STORE].status()
        async with asyncio.timeout(wait_s):
            await stopped.wait()
        assert STORE not in monitor._health
        # Asking again starts afresh, with a first check.
        _, error = monitor.status(STORE)
        assert isinstance(error, FirstCheckPendingError)
        assert await next_status(monitor, STORE) is None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_wait_for_checks_that_never_come_is_bounded(env: Env) -> None:
    # A monitor that is not running (its broker is stopping) checks nothing.
    schedule = HealthSchedule(
        check_timeout_s=0.01, retry_intervals_s=(0.0,), jitter=0.0, check_wait_margin_s=0.01
    )
    monitor = StoreHealthMonitor(env.registry, schedule)
    async with asyncio.timeout(wait_s):
        error = await monitor.wait_healthy(STORE, asyncio.Event())
    assert isinstance(error, StoreUnhealthyError)
    assert "no health check completed within 0.02s" in str(error)


async def test_the_rpc_builds_no_store_past_the_limit(env: Env) -> None:
    monitor = StoreHealthMonitor(env.registry, FAST, stores_max=1)
    api = StoreHealthAPI(monitor, lambda: pb.Header())
    monitor.status(STORE)
    request = pb.FragmentStoreHealthRequest(fragment_store="memory://other/")
    response = await api.fragment_store_health(request, context=None)  # type: ignore[arg-type]
    assert response.status == pb.FRAGMENT_STORE_UNHEALTHY
    assert "already checks 1 stores" in response.store_health_error
    assert list(env.stores) == []  # No store was built for the URL (nor for STORE yet).


async def test_the_report_lists_each_checked_store_and_its_health(
    env: Env, monitor: StoreHealthMonitor
) -> None:
    other = "memory://other/root/"
    assert monitor.report() == []  # Nothing asked about, nothing checked.
    env.store(other).fail_put = True
    assert await next_status(monitor, STORE) is None
    error = await next_status(monitor, other)
    assert error is not None
    assert monitor.report() == [(STORE, None), (other, str(error))]  # By URL.
