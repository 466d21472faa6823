"""gRPC failures of the transport, as opposed to answers of the peer; ending stream calls.

grpc.aio reports a message it could not send on a stream whose connection just broke (a peer
killed or restarting) as INTERNAL with the details "Internal error from Core" — not UNAVAILABLE.
No server sends that: it is the local transport failing, and retrying on a new connection is as
safe as after UNAVAILABLE (an append that was not acknowledged is sent again whole)."""

from __future__ import annotations

import asyncio
from typing import Any, Final

import grpc
import grpc.aio

CORE_SEND_FAILED: Final = "Internal error from Core"


def send_failed(err: BaseException) -> bool:
    """Whether ``err`` is grpc's own failure to send a message on a broken connection."""
    return (
        isinstance(err, grpc.aio.AioRpcError)
        and err.code() == grpc.StatusCode.INTERNAL
        and err.details() == CORE_SEND_FAILED
    )


# Why finishing a stream call's request side matters. grpc.aio feeds a client-streaming call
# made through an interceptor (auth, etcd's token) from an async generator of its own, consumed
# by a task that waits for the next write. `cancel()` stops that task only while the call runs:
# a call the peer ended (killed, restarting) keeps it waiting forever, and once the call is
# dropped the collected task and generator are logged ("Task was destroyed but it is pending!",
# "aclose(): asynchronous generator is already running") instead of ever ending.
_REQUEST_SIDE_FINISHED: Final = (
    asyncio.InvalidStateError,
    grpc.aio.AioRpcError,
    grpc.aio.UsageError,
)
# Calls whose request side `close_stream_call_soon` is finishing (a task must be referenced).
_closing: Final[set[asyncio.Task[None]]] = set()


async def close_stream_call(call: Any) -> None:
    """End ``call`` (a grpc.aio stream-request call using the write() API) on every exit path:
    cancel it if it still runs (the peer rolls back what it did not commit), then finish its
    request side, which lets grpc's request-consuming task end. Idempotent."""
    call.cancel()
    try:
        await call.done_writing()
    except _REQUEST_SIDE_FINISHED:
        pass  # Its interceptor never ran, or the call has no request side left: nothing waits.


def close_stream_call_soon(call: Any) -> asyncio.Task[None]:
    """``close_stream_call`` from synchronous code: cancels at once, finishes in a task
    (returned, for whoever wants to wait; kept referenced meanwhile)."""
    call.cancel()
    task = asyncio.get_running_loop().create_task(close_stream_call(call))
    _closing.add(task)
    task.add_done_callback(_closing.discard)
    return task
