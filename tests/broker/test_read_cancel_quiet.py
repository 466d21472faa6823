"""A reader that goes away mid-stream ends its Read quietly on the broker.

A real in-process broker serves blocking reads of a journal with plenty of content to clients on
their own loopback channels, which cancel their calls after the first few responses and close
their channels, many times over. The broker's write of the next response then sometimes fails in
gRPC core before grpc.aio has seen the client's cancellation; unhandled, grpc.aio logs that as an
ERROR with a traceback (`ExecuteBatchError raised in core by servicer method`). Nothing may be
logged at ERROR, by gRPC or by the broker, and the broker must go on serving appends and reads.
"""

from __future__ import annotations

import asyncio
import base64
import logging

import grpc
import grpc.aio
import pytest
import structlog
from broker_testkit import Cluster, journal_spec

from broker.auth import AUTHORIZATION, READ, Claims, KeyedAuth
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pbg

JOURNAL = "cancel/quiet-reads"
# 4 MiB of content: a read of it from offset 0 is ~32 responses of 128 KiB, so a client that
# cancels after a few leaves the broker writing.
APPEND_CHUNK = b"x" * (1 << 16)
APPENDS = 8
CHUNKS_PER_APPEND = 8
# Rounds of concurrent readers, each cancelling after 1..RESPONSES_MAX responses. The failing
# write is a race, hit more often the more reads are in flight: on loopback, 4800 reads of 32 at
# a time hit it a few times per run on the unfixed broker (none with 8 at a time, often).
ROUNDS = 150
READERS_PER_ROUND = 32
RESPONSES_MAX = 12
# Bounds of each round and of the wait for the broker to finish the cancelled reads.
ROUND_TIMEOUT_S = 10.0
HANDLERS_WAIT_S = 10.0
# grpc.aio names each served call's task so (an implementation detail: if it changes, the wait
# finds nothing, and the broker's stop at the end still flushes the handlers before the check).
READ_TASK_NAME = "HandleExceptions[/protocol.Journal/Read]"
ERROR_LEVELS = {"error", "critical", "exception"}
# With keys, Read is served through the auth interceptor (broker/auth_server.py), whose wrapper
# must write as quietly; the readers' token outlives the test.
KEY = b"the quiet readers' key, 32 bytes"
TOKEN_TTL_S = 600


async def _read_then_cancel(endpoint: str, responses: int, metadata: grpc.aio.Metadata) -> None:
    async with grpc.aio.insecure_channel(endpoint.removeprefix("http://")) as channel:
        request = pb.ReadRequest(journal=JOURNAL, offset=0, block=True)
        call = pbg.JournalStub(channel).Read(request, metadata=metadata)
        received = 0
        async for _ in call:
            received += 1
            if received >= responses:
                break
        call.cancel()
    assert received == responses


async def _broker_read_handlers_done() -> None:
    """Wait (boundedly) until the broker's handlers of the cancelled reads have finished, so
    that whatever they log is logged before the checks."""
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current and t.get_name() == READ_TASK_NAME]
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=HANDLERS_WAIT_S)
        assert not pending, f"{len(pending)} cancelled reads still served after {HANDLERS_WAIT_S}s"


async def _read_all(stub: pbg.JournalStub, offset: int) -> bytes:
    """The journal's content from `offset` to its write head, by a non-blocking read."""
    content = b""
    async for response in stub.Read(pb.ReadRequest(journal=JOURNAL, offset=offset)):
        if response.status == pb.OFFSET_NOT_YET_AVAILABLE:
            break
        assert response.status == pb.OK
        content += response.content
    return content


@pytest.mark.parametrize("keyed", [False, True], ids=["open", "auth"])
async def test_cancelled_reads_end_without_errors(
    cluster: Cluster, caplog: pytest.LogCaptureFixture, keyed: bool
) -> None:
    metadata = grpc.aio.Metadata()
    if keyed:
        broker = await cluster.start_broker(
            "zone-a", "broker-a", auth_keys=base64.b64encode(KEY).decode()
        )
        bearer = KeyedAuth([KEY]).sign(Claims(READ), TOKEN_TTL_S)
        metadata.add(AUTHORIZATION, f"Bearer {bearer}")
    else:
        broker = await cluster.start_broker("zone-a", "broker-a")
    await cluster.create(journal_spec(JOURNAL), [broker])
    for _ in range(APPENDS):
        await cluster.append(broker, JOURNAL, [APPEND_CHUNK] * CHUNKS_PER_APPEND)
    head = APPENDS * CHUNKS_PER_APPEND * len(APPEND_CHUNK)

    caplog.set_level(logging.WARNING, logger="grpc")
    with structlog.testing.capture_logs() as ours:
        for round_ in range(ROUNDS):
            async with asyncio.timeout(ROUND_TIMEOUT_S):
                await asyncio.gather(
                    *(
                        _read_then_cancel(
                            broker.endpoint, 1 + (round_ + r) % RESPONSES_MAX, metadata
                        )
                        for r in range(READERS_PER_ROUND)
                    )
                )
            await _broker_read_handlers_done()

        # The broker still serves: an append, then a read of exactly it.
        stub = cluster.stub(broker)
        resp = await cluster.append(broker, JOURNAL, [b"after the cancellations"])
        assert (resp.commit.begin, resp.commit.end) == (head, head + 23)
        assert await _read_all(stub, head) == b"after the cancellations"
        # Stopping the broker finishes whatever it still serves, so that all is logged.
        await cluster.stop_broker(broker)

    grpc_errors = [
        f"{r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.name.startswith("grpc") and r.levelno >= logging.ERROR
    ]
    assert not grpc_errors, f"{len(grpc_errors)} gRPC errors, first: {grpc_errors[0]}"
    our_errors = [e for e in ours if e.get("log_level") in ERROR_LEVELS]
    assert not our_errors, our_errors[:3]
