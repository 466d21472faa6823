"""The keyspace conformance kit's harness and helpers (see conformance.py): the harness protocol,
the embedded harness, the error a failed check raises, and the assertions the checks share."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Protocol

from broker.keyspace.backend import (
    Backend,
    Event,
    KeyValue,
    WatchResponse,
)
from broker.keyspace.embedded import EmbeddedBackend

# Upper bound on waiting for a watch event or a mirror revision that should come promptly.
event_timeout_s = 10.0


class KeySpaceHarness(Protocol):
    """What check_keyspace needs of the environment around a backend."""

    @property
    def backend(self) -> Backend:
        """The backend under test. The checks do not close it."""
        ...

    async def interrupt(self) -> None:
        """Break the backend's connection, so that its active watches fail with
        UnavailableError, and return once new requests can succeed again (embedded: break the
        watches; etcd: stop and restart the server)."""
        ...

    async def new_backend(self) -> Backend:
        """Another client of the same store. The checks close it."""
        ...


class EmbeddedHarness:
    """The harness for an EmbeddedBackend: interrupting breaks every watch of its store."""

    def __init__(self, backend: EmbeddedBackend | None = None) -> None:
        self._backend = backend if backend is not None else EmbeddedBackend()

    @property
    def backend(self) -> Backend:
        return self._backend

    async def interrupt(self) -> None:
        self._backend.break_watches()

    async def new_backend(self) -> Backend:
        return self._backend.new_client()


class ConformanceError(AssertionError):
    """A backend did not behave as the Backend contract (etcd v3's semantics) requires."""


Check = Callable[[KeySpaceHarness], Awaitable[None]]


def _expect(condition: bool, what: str) -> None:
    # Explicit, so that python -O does not strip the checks.
    if not condition:
        raise ConformanceError(what)


def _scope(check: str) -> bytes:
    """A fresh prefix for one check's keys: a clean path (no trailing '/'), usable as a
    KeySpace root."""
    return f"/gazette-conformance/{uuid.uuid4().hex[:12]}/{check}".encode()


async def _expect_raises(
    exc_type: type[BaseException], what: str, call: Awaitable[object]
) -> BaseException:
    try:
        await call
    except exc_type as exc:
        return exc
    raise ConformanceError(f"{what}: expected {exc_type.__name__}, but it succeeded")


async def _only(backend: Backend, key: bytes) -> KeyValue | None:
    kvs = (await backend.range(key)).kvs
    _expect(len(kvs) <= 1, f"range of the single key {key!r} returned {len(kvs)} keys")
    return kvs[0] if kvs else None


async def _aclose(stream: AsyncIterator[WatchResponse]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


async def _watch_until(
    backend: Backend, key: bytes, range_end: bytes | None, start: int, until: int
) -> list[WatchResponse]:
    """Watch responses from ``start`` until one carries an event of revision >= ``until``."""
    stream = backend.watch(key, range_end, start)
    responses: list[WatchResponse] = []
    try:
        async with asyncio.timeout(event_timeout_s):
            async for resp in stream:
                responses.append(resp)
                if any(e.kv.mod_revision >= until for e in resp.events):
                    return responses
    except TimeoutError:
        raise ConformanceError(
            f"watch of {key!r} from revision {start}: no event of revision {until} within "
            f"{event_timeout_s}s (got {responses})"
        ) from None
    finally:
        await _aclose(stream)
    raise ConformanceError(f"watch of {key!r} ended before revision {until}")


def _summary(events: list[Event]) -> list[tuple[str, bytes, bytes, int]]:
    return [(e.type.name, e.kv.key, e.kv.value, e.kv.mod_revision) for e in events]


# -- Key/value basics ---------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _running(coro: Coroutine[Any, Any, object]) -> AsyncIterator[None]:
    """Run ``coro`` as a task for the body's duration, then cancel it; if it had failed, raise
    its error. (Not a TaskGroup: that would wrap the body's own failure in an ExceptionGroup.)"""
    task = asyncio.create_task(coro)
    try:
        yield
    finally:
        task.cancel()
        await asyncio.wait([task])
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error
