"""Appender and append() against a fake broker: a real grpc.aio Append handler on loopback that
records what it receives, commits on the empty chunk, and can refuse like a non-primary."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest

from broker.client.appender import Appender, AppenderStateError, append, maybe_landed
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pb_grpc
from broker.protocol.status import (
    NoJournalPrimaryBrokerError,
    NotJournalPrimaryBrokerError,
    WrongAppendOffsetError,
)
from broker.protocol.validate import ValidationError

JOURNAL = "a/journal"
PRIMARY = pb.ProcessSpec.ID(zone="zone-a", suffix="primary")


@dataclass
class Received:
    request: pb.AppendRequest
    chunks: list[bytes] = field(default_factory=list)
    committed: bool = False
    aborted: bool = False
    refused: bool = False


class FakeAppendBroker(pb_grpc.JournalServicer):  # type: ignore[misc]
    """Appends to an in-memory journal. `refusals` statuses answer the next RPCs instead."""

    def __init__(self) -> None:
        self.endpoint = ""
        self.content = b""
        self.received: list[Received] = []
        self.refusals: list[int] = []
        # RPCs whose append commits, then whose response is lost (the call fails UNAVAILABLE).
        self.lost_responses = 0
        self.aborted = asyncio.Event()

    def header(self) -> pb.Header:
        out = pb.Header(
            route=pb.Route(members=[PRIMARY], primary=0, endpoints=[self.endpoint]),
            etcd=pb.Header.Etcd(cluster_id=1, revision=7),
        )
        out.process_id.CopyFrom(PRIMARY)
        return out

    async def Append(self, requests: Any, context: Any) -> pb.AppendResponse:
        got = Received(pb.AppendRequest())
        self.received.append(got)
        try:
            return await self._append(got, requests, context)
        finally:
            # However the client's stream ended without a commit (a cancellation seen as
            # CancelledError, an RPC error from the request iterator, or a plain end of the
            # stream), the append was aborted.
            if not (got.committed or got.refused):
                got.aborted = True
                self.aborted.set()

    async def _append(self, got: Received, requests: Any, context: Any) -> pb.AppendResponse:
        first = await anext(aiter(requests))
        got.request = first
        if self.refusals and not self.lost_responses:  # Responses are lost first.
            got.refused = True
            return pb.AppendResponse(status=self.refusals.pop(0), header=self.header())
        if first.offset and first.offset != len(self.content):
            got.refused = True
            return pb.AppendResponse(status=pb.WRONG_APPEND_OFFSET, header=self.header())
        async for request in requests:
            if not request.content:
                got.committed = True
            else:
                got.chunks.append(request.content)
        if not got.committed:
            await context.abort(grpc.StatusCode.ABORTED, "stream ended without a commit")
        begin = len(self.content)
        self.content += b"".join(got.chunks)
        if self.lost_responses:
            self.lost_responses -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "connection lost after the commit")
        commit = pb.Fragment(
            journal=JOURNAL, begin=begin, end=len(self.content), compression_codec=pb.NONE
        )
        return pb.AppendResponse(
            status=pb.OK, header=self.header(), commit=commit, registers=pb.LabelSet()
        )


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[tuple[FakeAppendBroker, JournalClient]]:
    broker = FakeAppendBroker()
    server = grpc.aio.server()
    pb_grpc.add_JournalServicer_to_server(broker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    broker.endpoint = f"http://127.0.0.1:{port}"
    client = JournalClient(broker.endpoint)
    try:
        yield broker, client
    finally:
        await client.close()
        await server.stop(None)


async def test_streams_in_chunks_and_commits_on_close() -> None:
    async with serving() as (broker, client):
        appender = Appender(client, pb.AppendRequest(journal=JOURNAL), chunk_bytes_max=4)
        await appender.write(b"0123456789")
        await appender.write(b"")  # Nothing is sent: an empty chunk would mean "commit".
        await appender.write(bytearray(b"ab"))
        commit = await appender.commit()
        assert (commit.begin, commit.end) == (0, 12)
        (got,) = broker.received
        assert got.chunks == [b"0123", b"4567", b"89", b"ab"] and got.committed
        assert broker.content == b"0123456789ab"
        assert appender.response is not None and appender.response.status == pb.OK
        # The response's route was learned: appends now go to the primary directly.
        assert client.endpoint_for(JOURNAL, require_primary=True) == broker.endpoint
        with pytest.raises(AppenderStateError):
            await appender.write(b"more")


async def test_context_manager_commits_or_aborts() -> None:
    async with serving() as (broker, client):
        async with Appender(client, pb.AppendRequest(journal=JOURNAL)) as appender:
            await appender.write(b"kept")
        with pytest.raises(RuntimeError, match="application failure"):
            async with Appender(client, pb.AppendRequest(journal=JOURNAL)) as appender:
                await appender.write(b"rolled back")
                raise RuntimeError("application failure")
        await broker.aborted.wait()
        assert [(r.committed, r.aborted) for r in broker.received] == [(True, False), (False, True)]
        assert broker.content == b"kept"


async def test_an_empty_append_commits_nothing() -> None:
    async with serving() as (broker, client):
        commit = await Appender(client, pb.AppendRequest(journal=JOURNAL)).commit()
        assert (commit.begin, commit.end) == (0, 0)
        assert broker.received[0].committed


async def test_refusals_raise_typed_errors() -> None:
    async with serving() as (broker, client):
        await append(client, pb.AppendRequest(journal=JOURNAL), b"abc")
        with pytest.raises(WrongAppendOffsetError):
            async with Appender(client, pb.AppendRequest(journal=JOURNAL, offset=1)) as appender:
                await appender.write(b"x" * 100)
        assert appender.response is not None
        assert appender.response.status == pb.WRONG_APPEND_OFFSET
        assert broker.content == b"abc"


async def test_append_retries_stale_routes_then_succeeds() -> None:
    async with serving() as (broker, client):
        broker.refusals = [pb.NOT_JOURNAL_PRIMARY_BROKER, pb.NOT_JOURNAL_PRIMARY_BROKER]
        slept: list[float] = []

        async def sleep(delay: float) -> None:
            slept.append(delay)

        response = await append(
            client, pb.AppendRequest(journal=JOURNAL), [b"one ", b"two"], sleep=sleep
        )
        assert response.status == pb.OK
        assert broker.content == b"one two"
        assert slept == [0.05, 0.1]
        assert len(broker.received) == 3


async def test_append_gives_up_after_attempts_max() -> None:
    async with serving() as (broker, client):
        broker.refusals = [pb.NOT_JOURNAL_PRIMARY_BROKER] * 5

        async def sleep(delay: float) -> None:
            pass

        with pytest.raises(NotJournalPrimaryBrokerError):
            await append(
                client, pb.AppendRequest(journal=JOURNAL), b"x", attempts_max=3, sleep=sleep
            )
        assert len(broker.received) == 3 and broker.content == b""


async def test_unreachable_broker_is_retried_by_append() -> None:
    async with serving() as (broker, _):
        dead = JournalClient("http://127.0.0.1:1")

        async def sleep(delay: float) -> None:
            dead.routes.update(JOURNAL, broker.header().route)  # Learn where the primary is.

        response = await append(dead, pb.AppendRequest(journal=JOURNAL), b"hello", sleep=sleep)
        assert response.commit.end == 5 and broker.content == b"hello"
        await dead.close()


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({"journal": "x"}, "journal"),
        ({"journal": JOURNAL, "offset": -1}, "offset: must be >= 0"),
        ({"journal": JOURNAL, "content": b"x"}, "content: must be empty"),
    ],
)
async def test_bad_requests_are_refused_before_any_rpc(
    request_fields: dict[str, Any], message: str
) -> None:
    client = JournalClient("http://127.0.0.1:1")
    with pytest.raises(ValidationError, match=message):
        Appender(client, pb.AppendRequest(**request_fields))
    await client.close()


def test_a_call_broken_as_it_closes_is_a_typed_retriable_error() -> None:
    """grpc can fail the half-close of an Append call whose broker went away with an error of
    its core (`cygrpc.ExecuteBatchError`), unknown to every retry policy: the soak saw one at
    a kill -9 of two brokers fail its AppendService's journal for good ("an earlier append to
    it failed" for every later append). The Appender turns it into AppendCallBrokenError when
    the call gives no answer, which append() and the AppendService both retry."""
    from grpc._cython import cygrpc

    from broker.client.append_errors import is_transient
    from broker.client.appender import AppendCallBrokenError, retriable

    raw = cygrpc.ExecuteBatchError('Failed "execute_batch": (SendCloseFromClientOperation,)')
    assert not retriable(raw) and not is_transient(raw)  # Why it must not escape raw.
    err = AppendCallBrokenError(JOURNAL, raw)
    assert retriable(err) and is_transient(err)
    assert isinstance(err, ConnectionError)
    assert str(err) == (
        f"appending to {JOURNAL}: the Append call broke as it closed:"
        ' Failed "execute_batch": (SendCloseFromClientOperation,)'
    )


async def _no_sleep(_s: float) -> None:
    return None


async def test_an_append_refused_after_a_lost_response_may_have_landed() -> None:
    """Found by review (2026-11-29): the last attempt's status (a failover's
    NO_JOURNAL_PRIMARY_BROKER) said nothing of an earlier attempt that committed and lost its
    response. `maybe_landed` tells a caller deciding whether to write again (the Spark batch
    commit): true once any attempt went unanswered; false when every attempt was refused."""
    async with serving() as (broker, client):
        broker.lost_responses = 1
        broker.refusals = [pb.NO_JOURNAL_PRIMARY_BROKER] * 2
        with pytest.raises(NoJournalPrimaryBrokerError) as caught:
            await append(
                client, pb.AppendRequest(journal=JOURNAL), b"x", attempts_max=3, sleep=_no_sleep
            )
        assert broker.content == b"x"  # It did land, on the first attempt.
        assert maybe_landed(caught.value)

        broker.refusals = [pb.NO_JOURNAL_PRIMARY_BROKER] * 3
        with pytest.raises(NoJournalPrimaryBrokerError) as refused:
            await append(
                client, pb.AppendRequest(journal=JOURNAL), b"y", attempts_max=3, sleep=_no_sleep
            )
        assert not maybe_landed(refused.value) and broker.content == b"x"
