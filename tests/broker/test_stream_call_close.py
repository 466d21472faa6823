"""grpc_transport.close_stream_call(_soon): a client-streaming call through an interceptor that
the server ended leaves no request-consuming task behind once closed (a real grpc.aio server on
loopback). `cancel()` alone, which is what every call site did, leaves it pending for ever."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest

from broker import grpc_transport
from broker.auth import ForwardingAuthorizer, client_interceptors
from broker.grpc_transport import close_stream_call, close_stream_call_soon
from tests.broker.stream_call_testkit import (
    assert_nothing_left,
    reported_to_loop,
    stranded_request_consumers,
)

_METHOD = "/cleanup.Test/Chat"


async def _chat(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
    async for _ in requests:
        # One message, then the server ends the call (as a broker that goes away does).
        await context.abort(grpc.StatusCode.UNAVAILABLE, "going away")
    return


@pytest.fixture
async def target() -> AsyncIterator[str]:
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "cleanup.Test", {"Chat": grpc.stream_stream_rpc_method_handler(_chat)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def _ended_call(channel: grpc.aio.Channel) -> Any:
    """A call through the channel's interceptor that the server ended after one message."""
    call = channel.stream_stream(_METHOD)()
    await call.write(b"hello")
    with pytest.raises(grpc.aio.AioRpcError):
        await call.read()
    assert call.done()
    return call


async def test_cancel_alone_strands_the_request_consumer(target: str) -> None:
    interceptors = client_interceptors(ForwardingAuthorizer())
    async with grpc.aio.insecure_channel(target, interceptors=interceptors) as channel:
        call = await _ended_call(channel)
        call.cancel()
        await asyncio.sleep(0)
        assert len(stranded_request_consumers()) == 1  # What close_stream_call is for.
        await close_stream_call(call)
        assert stranded_request_consumers() == []


@pytest.mark.parametrize("soon", [False, True], ids=["async", "from-sync-code"])
async def test_closing_an_ended_call_leaves_nothing(target: str, soon: bool) -> None:
    interceptors = client_interceptors(ForwardingAuthorizer())
    with reported_to_loop() as reports:
        async with grpc.aio.insecure_channel(target, interceptors=interceptors) as channel:
            calls = [await _ended_call(channel) for _ in range(3)]
            # And one still running, closed by us (the client going away).
            running = channel.stream_stream(_METHOD)()
            calls.append(running)
            for call in calls:
                if soon:
                    await close_stream_call_soon(call)
                else:
                    await close_stream_call(call)
                await close_stream_call(call)  # Idempotent.
            assert running.cancelled()
            del calls, running, call
            await assert_nothing_left(reports)


class _StuckRequestSide:
    """A stream call whose request side never finishes once cancelled: what CI saw of an etcd
    Watch cancelled while it was being opened (grpc's own call, not reproducible at will)."""

    def __init__(self) -> None:
        self.cancelled = False
        self.finishing = asyncio.Event()

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    async def done_writing(self) -> None:
        self.finishing.set()
        await asyncio.Event().wait()  # Never finishes.


async def test_closing_a_call_whose_request_side_never_finishes_is_bounded() -> None:
    """A broker asked to exit while its start waited on a watch stayed for good: closing the
    watch's call waited for ever. The close is now bounded; the call is cancelled all the same
    and its finishing is left running, referenced."""
    call = _StuckRequestSide()
    before = set(grpc_transport._closing)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await close_stream_call(call)
    took_s = loop.time() - started
    assert call.cancelled and call.finishing.is_set()
    assert grpc_transport.stream_close_wait_s <= took_s < grpc_transport.stream_close_wait_s + 1.0
    left = [f for f in grpc_transport._closing - before if not f.done()]
    assert len(left) == 1
    left[0].cancel()
