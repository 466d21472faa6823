"""Health of fragment stores, checked as Gazette's brokers check it.

A broker checks each store it uses in the background: it puts a small object at
``.test/health-check`` under the store's root, gets it back and compares, lists ``.test/`` and
finds it, signs a GET URL for it and, for an http(s) URL, fetches it and compares again. Any
step failing (or the whole check taking longer than ``check_timeout_s``) makes the store
unhealthy, with an error naming the step. A healthy store is checked again after
``healthy_interval_s`` (30 minutes); an unhealthy one sooner and sooner less often (Gazette's
schedule: at once, 0.1 s, 1 s, 1 s, 10 s, 10 s, then every 100 s), each interval jittered by
±20% so that brokers do not check in step. Checks of one store by many brokers at once are
harmless: they put the same content at the same key.

Who asks, and what for:

- the append machine, before an append to a journal, asks about the journal's primary store
  (the first of its spec): until the store's first check completes, and while it is unhealthy,
  it waits for the next checks, at most ``append_checks_max`` of them (Gazette's 5), then fails
  the append with FRAGMENT_STORE_UNHEALTHY and the store's error. Content a broker cannot
  persist would otherwise pile up in its spools;
- the FragmentStoreHealth RPC (``gazctl journals store-health``) reports a store's health,
  waiting for its first check, and with ``check_delete`` also runs the delete probe: put a
  throwaway object at ``<prefix>.gazette-delete-probe`` and remove it (the periodic check never
  deletes anything; retention pruning and recovery-log pruning need the permission).

A store is checked from the first time it is asked about. Checks of a store nobody asked about
for ``idle_stop_s`` stop (its next question starts them again, as a first check), and at most
``monitored_stores_max`` stores are checked at once: a question about another store is
answered with StoreHealthLimitError rather than start checks of every URL a client names.

``report()`` lists the checked stores and their health; the HTTP gateway shows it under
``/debug/ready``. A broker stays ready while a store is unhealthy: the store is every broker's,
and taking brokers out of rotation would not bring it back.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from broker.fragment.stores.base import FragmentStore
from broker.fragment.stores.registry import StoreRegistry, open_url
from broker.logging import get_logger

log = get_logger(__name__)

CHECK_KEY: Final = ".test/health-check"
CHECK_CONTENT: Final = b"health-check\n"
DELETE_PROBE_NAME: Final = ".gazette-delete-probe"
DELETE_PROBE_CONTENT: Final = b"gazette-delete-probe\n"
# Signed URLs of checks live this long (Gazette's).
check_url_ttl_s: Final = 300.0
# A check reads back at most this much (the object is 13 bytes; anything longer is wrong).
check_read_bytes_max: Final = 1024
# Appends wait for at most this many health checks of an unhealthy (or not yet checked) primary
# store before they fail FRAGMENT_STORE_UNHEALTHY (Gazette's storeHealthCheckRetries).
append_checks_max: Final = 5
# Stores checked at once by one broker.
monitored_stores_max_default: Final = 1024
# How long the delete probe may take.
delete_probe_timeout_s: Final = 60.0


class StoreUnhealthyError(Exception):
    """A store failed its health check (or the delete probe); the message names the step."""


class FirstCheckPendingError(StoreUnhealthyError):
    """The store's first health check has not completed yet."""

    def __init__(self, url: str) -> None:
        super().__init__(f"fragment store {url}: first health check has not completed yet")


class StoreHealthLimitError(StoreUnhealthyError):
    """The broker checks as many stores as it may already."""


@dataclass(frozen=True)
class HealthSchedule:
    """When checks run (see the module docstring). Tests shorten it."""

    healthy_interval_s: float = 30 * 60.0
    # After the n-th failure in a row (from 0), the next check waits retry_intervals_s[n]
    # (the last entry once n is past the end).
    retry_intervals_s: tuple[float, ...] = (0.0, 0.1, 1.0, 1.0, 10.0, 10.0, 100.0)
    jitter: float = 0.2
    check_timeout_s: float = 60.0
    idle_stop_s: float = 3600.0
    # Slack over a check's own bounds before whoever waits for it gives up.
    check_wait_margin_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.retry_intervals_s or min(self.retry_intervals_s) < 0:
            raise ValueError("retry_intervals_s: must be non-empty, each >= 0")
        if self.healthy_interval_s <= 0 or self.check_timeout_s <= 0 or self.idle_stop_s <= 0:
            raise ValueError("healthy_interval_s, check_timeout_s, idle_stop_s: must be > 0")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter: must be in [0, 1) (got {self.jitter})")

    def next_interval_s(self, healthy: bool, failures: int, rand: float) -> float:
        """The wait before the next check, after a check that left the store ``healthy`` or
        not (``failures``: failed checks in a row before this one); ``rand`` in [0, 1)."""
        if healthy:
            base = self.healthy_interval_s
        else:
            base = self.retry_intervals_s[min(failures, len(self.retry_intervals_s) - 1)]
        return base * (1 + (rand - 0.5) * 2 * self.jitter)


class StoreHealth:
    """The health of one store as of its last check, and the event of the next one."""

    def __init__(self, url: str, asked_at: float) -> None:
        self.url = url
        self.error: StoreUnhealthyError | None = FirstCheckPendingError(url)
        self.asked_at = asked_at
        self.checks = 0
        self._next = asyncio.Event()

    def status(self) -> tuple[asyncio.Event, StoreUnhealthyError | None]:
        """(set once the next check completes, the error of the last check or None)."""
        return self._next, self.error

    def update(self, error: StoreUnhealthyError | None) -> None:
        self.error = error
        self.checks += 1
        done, self._next = self._next, asyncio.Event()
        done.set()


def store_prefix(store: FragmentStore) -> str:
    """The key prefix of the store's root ("" or ending in '/')."""
    # Not the URL's path: an azure-ad:// URL names account and container before its keys.
    return store.key_prefix


async def run_check(store: FragmentStore) -> None:
    """One health check of ``store`` (see the module docstring); StoreUnhealthyError if any
    step fails."""
    key = store_prefix(store) + CHECK_KEY
    step = "PUT"
    try:
        await store._put(key, CHECK_CONTENT, "")
        step = "GET"
        async with await store._open(key) as reader:
            got = await reader.read_all(check_read_bytes_max)
        if got != CHECK_CONTENT:
            raise StoreUnhealthyError(f"content mismatch: got {got!r}, want {CHECK_CONTENT!r}")
        step = "LIST"
        listed = await store._list(store_prefix(store) + ".test/")
        if not any(obj.rel_path == "health-check" for obj in listed):
            raise StoreUnhealthyError("the listing does not show the test object")
        step = "SignGet"
        url = await store._sign(key, check_url_ttl_s)
        if not url.startswith(("http://", "https://")):
            return  # As Gazette: only http(s) signed URLs are fetched.
        step = "fetch of the signed URL"
        async with await open_url(url) as reader:
            got = await reader.read_all(check_read_bytes_max)
        if got != CHECK_CONTENT:
            raise StoreUnhealthyError(f"content mismatch: got {got!r}, want {CHECK_CONTENT!r}")
    except Exception as err:
        raise StoreUnhealthyError(
            f"fragment store {store.url}: health check {step} failed: {err}"
        ) from err


async def check_delete(store: FragmentStore, prefix: str) -> None:
    """The delete probe: put, then remove, ``<prefix>.gazette-delete-probe`` under the store's
    root (``prefix`` "" or ending in '/', validated by the caller)."""
    key = store_prefix(store) + prefix + DELETE_PROBE_NAME
    step = "PUT"
    try:
        async with asyncio.timeout(delete_probe_timeout_s):
            await store._put(key, DELETE_PROBE_CONTENT, "")
            step = "DELETE"
            await store._delete(key)
    except Exception as err:
        raise StoreUnhealthyError(
            f"fragment store {store.url}: delete-probe {step} failed: {err}"
        ) from err


class StoreHealthMonitor:
    """Background health checks of the stores a broker is asked about (module docstring).
    ``run()`` runs the checks (in the broker's TaskGroup); ``status()`` may be called before."""

    def __init__(
        self,
        registry: StoreRegistry,
        schedule: HealthSchedule | None = None,
        *,
        stores_max: int = monitored_stores_max_default,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if stores_max < 1:
            raise ValueError(f"stores_max: must be >= 1 (got {stores_max})")
        self.registry = registry
        self.schedule = schedule if schedule is not None else HealthSchedule()
        self._stores_max = stores_max
        self._clock = clock
        self._rand = rand
        self._health: dict[str, StoreHealth] = {}
        self._unstarted: list[StoreHealth] = []
        self._tg: asyncio.TaskGroup | None = None

    def report(self) -> list[tuple[str, str | None]]:
        """(url, error or None if healthy) of every store checked now, by URL: what
        ``/debug/ready`` shows. A store whose first check is pending is reported with that."""
        return [
            (url, None if health.error is None else str(health.error))
            for url, health in sorted(self._health.items())
        ]

    def has_room_for(self, url: str) -> bool:
        """Whether ``status(url)`` would check the store (it is checked already, or the broker
        checks fewer than ``stores_max`` stores)."""
        return url in self._health or len(self._health) < self._stores_max

    def status(self, url: str) -> tuple[asyncio.Event, StoreUnhealthyError | None]:
        """The store's health (see StoreHealth.status); starts its checks if needed."""
        health = self._health.get(url)
        if health is None:
            if not self.has_room_for(url):
                done = asyncio.Event()
                done.set()  # No check will come: whoever waits sees this answer again.
                return done, StoreHealthLimitError(
                    f"fragment store {url}: not checked, this broker already checks"
                    f" {self._stores_max} stores"
                )
            health = self._health[url] = StoreHealth(url, self._clock())
            self._start(health)
        health.asked_at = self._clock()
        return health.status()

    async def wait_healthy(
        self, url: str, invalidated: asyncio.Event, checks_max: int = append_checks_max
    ) -> StoreUnhealthyError | None:
        """Wait until ``url`` is healthy (None), at most ``checks_max`` further checks (then
        its error), or until ``invalidated`` is set (then None: the caller looks again). Each
        wait for a check is bounded by the longest a check and the wait before it take, so that
        a monitor that stopped checking (its broker is stopping) holds no append for ever."""
        schedule = self.schedule
        check_wait_s = (
            schedule.check_timeout_s
            + max(schedule.retry_intervals_s) * (1 + schedule.jitter)
            + schedule.check_wait_margin_s
        )
        for waited in range(checks_max + 1):
            next_check, error = self.status(url)
            if error is None or waited == checks_max:
                return error
            waiter = asyncio.ensure_future(next_check.wait())
            stopper = asyncio.ensure_future(invalidated.wait())
            try:
                done, _ = await asyncio.wait(
                    (waiter, stopper), timeout=check_wait_s, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                waiter.cancel()
                stopper.cancel()
            if invalidated.is_set():
                return None
            if not done:
                return StoreUnhealthyError(
                    f"fragment store {url}: no health check completed within {check_wait_s:g}s"
                )
        raise AssertionError("not reached")

    async def run(self) -> None:
        """Run the checks until cancelled."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            try:
                unstarted, self._unstarted = self._unstarted, []
                for health in unstarted:
                    self._start(health)
                await asyncio.Event().wait()  # Until cancelled; the checks run meanwhile.
            finally:
                self._tg = None

    def _start(self, health: StoreHealth) -> None:
        if self._tg is None:
            self._unstarted.append(health)
        else:
            self._tg.create_task(self._check_loop(health), name=f"store health {health.url}")

    async def _check_loop(self, health: StoreHealth) -> None:
        failures = 0
        schedule = self.schedule
        while self._clock() - health.asked_at < schedule.idle_stop_s:
            error = await self._check(health.url)
            health.update(error)
            if error is None:
                if failures:
                    log.info("fragment store healthy again", store=health.url)
                interval_s = schedule.next_interval_s(True, 0, self._rand())
                failures = 0
            else:
                log.warning("fragment store health check failed", store=health.url, error=error)
                interval_s = schedule.next_interval_s(False, failures, self._rand())
                failures += 1
            await asyncio.sleep(interval_s)
        # Nobody asked for long: stop checking; a later question starts afresh.
        del self._health[health.url]
        health.update(FirstCheckPendingError(health.url))

    async def _check(self, url: str) -> StoreUnhealthyError | None:
        try:
            store = self.registry.get(url)
            async with asyncio.timeout(self.schedule.check_timeout_s):
                await run_check(store)
        except StoreUnhealthyError as err:
            return err
        except TimeoutError:
            return StoreUnhealthyError(
                f"fragment store {url}: health check took longer than"
                f" {self.schedule.check_timeout_s}s"
            )
        except Exception as err:  # An unusable URL, a store that cannot be built.
            return StoreUnhealthyError(f"fragment store {url}: {err}")
        return None
