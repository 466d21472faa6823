"""A Read whose token expires while the broker is about to write, or writing: the write in
progress completes, then the status follows it; a write not yet begun is not begun. Served by a
grpc.aio server of its own: the real auth interceptor over Read handlers of this test's."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import grpc.aio
import pytest

from broker.auth import READ, Claims, KeyedAuth, TokenAuthorizer, client_interceptors
from broker.auth_server import AuthInterceptor
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pbg

KEY = b"the expiring stream's key (32 B)"
SIGNER = KeyedAuth([KEY])
# The token expires EXPIRES_IN_S after a call starts, by the interceptor's clock.
TOKEN_EXPIRES_AT = int(time.time()) + 3600
EXPIRES_IN_S = 0.5
PAST_EXPIRY_S = 1.0  # How long after EXPIRES_IN_S the client waits, or the handler stalls.
READ_WAIT_S = 10.0
# One response far larger than what the client's transport takes in before it reads: its write
# is held until the client reads (the client's message limit is raised for it).
HELD = pb.ReadResponse(status=pb.OK, offset=0, content=b"c" * (48 << 20))
CLIENT_OPTIONS = [("grpc.max_receive_message_length", 64 << 20)]
# How long after the call started each handler's write completed, by journal.
written_after_s: dict[str, float] = {}
IN_FLIGHT = pb.ReadResponse(status=pb.OK, offset=0, content=b"in flight")
NOT_SENT = pb.ReadResponse(status=pb.OK, offset=0, write_head=7)


class NoJournals:
    """A JournalScope without journals (the tokens here have no selector: never asked)."""

    def lookup_spec(self, journal: str) -> pb.JournalSpec | None:
        return None

    def refusal_header(self) -> pb.Header:
        return pb.Header()


def stall_the_event_loop(seconds: float) -> None:
    """Block the event loop's thread (on purpose: a busy broker), as no coroutine should."""
    time.sleep(seconds)


async def read(request: pb.ReadRequest, context: Any) -> None:
    started = time.monotonic()
    if request.journal == "held":
        await context.write(HELD)
        written_after_s["held"] = time.monotonic() - started
    elif request.journal == "in flight":
        # The write is handed to grpc, then the event loop stalls past the expiry: grpc's
        # completion of the write and the expiry are both due when it runs again.
        writing = asyncio.ensure_future(context.write(IN_FLIGHT))
        await asyncio.sleep(0)  # The write is begun.
        stall_the_event_loop(EXPIRES_IN_S + PAST_EXPIRY_S)
        await writing
    else:
        # The event loop stalls past the expiry (a loaded broker): the expiry is due, but has
        # not run, when the handler writes.
        stall_the_event_loop(EXPIRES_IN_S + PAST_EXPIRY_S)
        await context.write(NOT_SENT)
    await asyncio.Event().wait()  # A blocking read at the write head: until the expiry.


@pytest.fixture
async def channel() -> Any:
    def clock() -> float:
        return TOKEN_EXPIRES_AT - EXPIRES_IN_S

    server = grpc.aio.server(interceptors=[AuthInterceptor(SIGNER, NoJournals(), clock=clock)])
    handler = grpc.unary_stream_rpc_method_handler(
        read,
        request_deserializer=pb.ReadRequest.FromString,
        response_serializer=pb.ReadResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("protocol.Journal", {"Read": handler})]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    token = SIGNER.sign(Claims(READ, expires_at=TOKEN_EXPIRES_AT), 2 * 3600)
    interceptors = client_interceptors(TokenAuthorizer(token))
    try:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", interceptors=interceptors, options=CLIENT_OPTIONS
        ) as channel:
            yield channel
    finally:
        await server.stop(None)


async def expired(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(call.read(), READ_WAIT_S)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "expired" in (err.value.details() or "")
    return err.value


async def test_a_first_write_held_past_the_expiry_completes_then_the_status_follows(
    channel: grpc.aio.Channel,
) -> None:
    # Cutting a first write can leave grpc.aio unable to send any status (until the write
    # completes it has not noted the initial metadata as sent; the status then carries them
    # again, and core refuses the batch): the client waits forever.
    call = pbg.JournalStub(channel).Read(pb.ReadRequest(journal="held", block=True))
    await asyncio.sleep(EXPIRES_IN_S + PAST_EXPIRY_S)  # The client reads nothing meanwhile.
    assert await asyncio.wait_for(call.read(), READ_WAIT_S) == HELD
    await expired(call)
    assert written_after_s["held"] > EXPIRES_IN_S  # The write was held past the expiry.


async def test_a_write_in_flight_at_the_expiry_completes_then_the_status_follows(
    channel: grpc.aio.Channel,
) -> None:
    # Cutting the write left grpc.aio unable to send any status (as above).
    call = pbg.JournalStub(channel).Read(pb.ReadRequest(journal="in flight", block=True))
    assert await asyncio.wait_for(call.read(), READ_WAIT_S) == IN_FLIGHT
    await expired(call)


async def test_a_write_begun_after_the_expiry_is_not_begun(channel: grpc.aio.Channel) -> None:
    call = pbg.JournalStub(channel).Read(pb.ReadRequest(journal="stalled", block=True))
    await expired(call)
