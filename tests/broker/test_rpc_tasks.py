"""InFlightRpcs (broker.rpc_tasks): after a gRPC server stops, `drain` returns only once every
RPC's handler has ended, cleanup included, and bounds the wait for handlers that do not end."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest

from broker.rpc_tasks import InFlightRpcs

METHOD = "/test.Streams/Stream"
step_timeout_s = 10.0


class Handler:
    """A server-streaming handler that sends one message, then waits until cancelled; its
    cleanup takes `cleanup_s` (closing a file in a worker thread, say), or, with `stubborn`,
    it ignores cancellation until `release` is set."""

    def __init__(self, cleanup_s: float = 0.0, stubborn: bool = False) -> None:
        self.cleanup_s = cleanup_s
        self.stubborn = stubborn
        self.started = asyncio.Event()
        self.cleaned = asyncio.Event()
        self.release = asyncio.Event()

    async def serve(self, request: bytes, context: Any) -> None:
        try:
            await context.write(b"first")
            self.started.set()
            await asyncio.Event().wait()
        finally:
            if self.stubborn:
                while not self.release.is_set():
                    with contextlib.suppress(asyncio.CancelledError):
                        await self.release.wait()
            await asyncio.sleep(self.cleanup_s)
            self.cleaned.set()


@contextlib.asynccontextmanager
async def served(handler: Handler) -> AsyncIterator[tuple[grpc.aio.Server, InFlightRpcs, str]]:
    rpcs = InFlightRpcs()
    server = grpc.aio.server(interceptors=[rpcs])
    method = grpc.unary_stream_rpc_method_handler(handler.serve)
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("test.Streams", {"Stream": method})]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield server, rpcs, f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


async def open_stream(endpoint: str, handler: Handler) -> tuple[grpc.aio.Channel, Any]:
    channel = grpc.aio.insecure_channel(endpoint)
    call = channel.unary_stream(METHOD)(b"")
    assert await call.read() == b"first"
    await asyncio.wait_for(handler.started.wait(), step_timeout_s)
    return channel, call


async def test_drain_returns_once_a_cancelled_handler_has_cleaned_up() -> None:
    handler = Handler(cleanup_s=0.3)
    async with served(handler) as (server, rpcs, endpoint):
        channel, call = await open_stream(endpoint, handler)
        assert rpcs.running == 1
        await server.stop(0)
        # grpc.aio returned from stop with the handler still running (its cleanup is slow):
        # this is what drain is for.
        assert not handler.cleaned.is_set()
        assert await rpcs.drain() == 0
        assert handler.cleaned.is_set()
        assert rpcs.running == 0
        call.cancel()
        await channel.close()


async def test_a_client_gone_first_is_drained_too() -> None:
    handler = Handler(cleanup_s=0.3)
    async with served(handler) as (server, rpcs, endpoint):
        channel, call = await open_stream(endpoint, handler)
        call.cancel()
        await channel.close()
        await server.stop(0)
        assert await rpcs.drain() == 0
        assert handler.cleaned.is_set()


async def test_a_handler_that_ignores_cancellation_is_waited_for_boundedly_and_reported() -> None:
    handler = Handler(stubborn=True)
    async with served(handler) as (server, rpcs, endpoint):
        channel, call = await open_stream(endpoint, handler)
        await server.stop(0)
        loop = asyncio.get_running_loop()
        began = loop.time()
        assert await rpcs.drain(wait_s=0.2, cancelled_wait_s=0.2) == 1
        assert loop.time() - began < step_timeout_s
        assert rpcs.running == 1
        handler.release.set()
        assert await rpcs.drain(wait_s=step_timeout_s) == 0
        assert handler.cleaned.is_set()
        call.cancel()
        await channel.close()


@pytest.mark.parametrize("calls", [3])
async def test_each_rpc_is_recorded_once_and_forgotten_when_it_ends(calls: int) -> None:
    handler = Handler()
    async with served(handler) as (server, rpcs, endpoint):
        streams = []
        for _ in range(calls):
            handler.started.clear()
            streams.append(await open_stream(endpoint, handler))
        assert rpcs.running == calls
        for channel, call in streams:
            call.cancel()
            await channel.close()
        await server.stop(0)
        assert await rpcs.drain() == 0
        assert rpcs.running == 0
