"""Tearing a pipeline down is bounded by ``close_wait_s`` in all, whatever its peers do.

A stopping replica (and every torn-down pipeline, drained in the replica's TaskGroup, which
the replica's stop waits for) closes its peers' streams gracefully: close the send side, let
the readers still owed responses read them, then read every peer's end of stream. A peer
whose connection is alive (HTTP/2 pings answered, so keepalive never fails the call) but
whose handler never answers nor ends its stream held each of those phases for the peer
response timeout (30 s), one peer after another. Here the peer is a real gRPC server on
loopback that reads everything it is sent and says nothing, as a broker whose Replicate handler
waits on a spool another stream holds."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, MutableMapping
from typing import Any

import grpc
import structlog

from broker.fragment.spool import CompletedSpool, LocalFragment, Spool
from broker.fragment.spool_file import MemorySpoolFile
from broker.grpc_transport import PEER_KEEPALIVE_SERVER_OPTIONS, with_options
from broker.journal_service import SERVER_OPTIONS
from broker.peer_dialer import Dialer
from broker.pipeline import Pipeline
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pb_grpc
from broker.replica import Replica, ReplicaEnv, Slot

J = "pipeline/close-bound"
PRIMARY = pb.ProcessSpec.ID(zone="zone-a", suffix="primary")
MUTE = pb.ProcessSpec.ID(zone="zone-b", suffix="mute-peer")
# What a peer may take to answer, as configured by default: far beyond the bound under test.
RESPONSE_TIMEOUT_S = 30.0
CLOSE_WAIT_S = 0.5
# The teardown must end within this (the close bound, plus room for a loaded machine); without
# the bound it takes RESPONSE_TIMEOUT_S at least.
TEARDOWN_BOUND_S = 8.0
# Waits on the test's own events (a peer receiving what was sent).
EVENT_WAIT_S = 10.0


class _Sink:
    def on_commit(self, fragment: LocalFragment) -> None:
        pass

    def on_complete(self, completed: CompletedSpool) -> None:
        pass


class MutePeer(pb_grpc.JournalServicer):
    """Reads every request of a Replicate stream, never answers, never ends the stream."""

    def __init__(self) -> None:
        self.requests: list[pb.ReplicateRequest] = []
        self.received = asyncio.Event()
        self.send_side_closed = asyncio.Event()

    async def Replicate(
        self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.ReplicateResponse]:
        async for req in request_iterator:
            self.requests.append(req)
            self.received.set()
        self.send_side_closed.set()
        await asyncio.Event().wait()  # Mute until the primary cancels the call.
        yield pb.ReplicateResponse()  # pragma: no cover (never reached: a streaming handler)


@contextlib.asynccontextmanager
async def mute_peer() -> AsyncIterator[tuple[str, MutePeer]]:
    # A broker's own server options: its pings are welcome, as by any broker.
    server = grpc.aio.server(options=with_options(SERVER_OPTIONS, PEER_KEEPALIVE_SERVER_OPTIONS))
    peer = MutePeer()
    pb_grpc.add_JournalServicer_to_server(peer, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"http://127.0.0.1:{port}", peer
    finally:
        await server.stop(0)


def _pipeline(endpoint: str, dialer: Dialer, slot: Slot[Spool]) -> Pipeline:
    spool = Spool(J, _Sink(), new_file=MemorySpoolFile)
    header = pb.Header(
        process_id=PRIMARY,
        route=pb.Route(
            members=[PRIMARY, MUTE], primary=0, endpoints=["http://primary:1", endpoint]
        ),
    )
    return Pipeline.start(
        header,
        spool,
        slot,
        dialer,
        response_timeout_s=RESPONSE_TIMEOUT_S,
        send_timeout_s=RESPONSE_TIMEOUT_S,
        close_wait_s=CLOSE_WAIT_S,
    )


async def _synchronise(pln: Pipeline, peer: MutePeer) -> None:
    """Send the pipeline's synchronising proposal, which the peer receives (and ignores)."""
    spool = pln.spool
    await pln.scatter(
        pb.ReplicateRequest(proposal=spool.fragment, registers=spool.registers, acknowledge=True)
    )
    assert pln.send_err() is None
    async with asyncio.timeout(EVENT_WAIT_S):
        await peer.received.wait()


def _teardown_warnings(
    logs: list[MutableMapping[str, Any]],
) -> Iterator[MutableMapping[str, Any]]:
    return (e for e in logs if e["log_level"] == "warning" and e.get("journal") == J)


async def test_a_peer_that_never_ends_its_stream_is_aborted_after_the_close_bound() -> None:
    dialer = Dialer()
    async with mute_peer() as (endpoint, peer):
        slot: Slot[Spool] = Slot.empty("spool")
        pln = _pipeline(endpoint, dialer, slot)
        await _synchronise(pln, peer)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with structlog.testing.capture_logs() as logs:
            pln.begin_shutdown()
            async with asyncio.timeout(TEARDOWN_BOUND_S):
                await pln.finish_shutdown(expect_err=False)
        elapsed_s = loop.time() - started
        assert elapsed_s < TEARDOWN_BOUND_S
        # The close itself reached the peer: the stream was closed gracefully first.
        assert peer.send_side_closed.is_set()
        # Whoever waits on the spool has it back at once.
        assert slot.available()
        # Not only a wait: the warning says which journal and which peer did not answer.
        warnings = list(_teardown_warnings(logs))
        assert len(warnings) == 1, logs
        assert warnings[0]["peers"] == ["zone-b#mute-peer"], warnings
        assert warnings[0]["close_wait_s"] == CLOSE_WAIT_S
    await dialer.close()


async def test_a_reader_owed_acknowledgements_fails_instead_of_holding_the_stop() -> None:
    """An append that sent its commit and waits for the peer's acknowledgement is told that
    the peer failed once the bound passes: nothing was acknowledged to its client, and the
    peer (its stream cancelled) rolls the uncommitted content back."""
    dialer = Dialer()
    async with mute_peer() as (endpoint, peer):
        slot: Slot[Spool] = Slot.empty("spool")
        pln = _pipeline(endpoint, dialer, slot)
        await _synchronise(pln, peer)
        # An append's reader, as append_content's READ_ACKNOWLEDGEMENTS does it.
        wait_for, close_after = pln.barrier()

        async def read_acknowledgements() -> None:
            try:
                await wait_for.wait()
                await pln.gather_ok()
            finally:
                close_after.set()

        reader = asyncio.create_task(read_acknowledgements())
        loop = asyncio.get_running_loop()
        started = loop.time()
        with structlog.testing.capture_logs() as logs:
            pln.begin_shutdown()
            async with asyncio.timeout(TEARDOWN_BOUND_S):
                await pln.finish_shutdown(expect_err=False)
                await reader
        assert loop.time() - started < TEARDOWN_BOUND_S
        err = pln.recv_err()
        assert err is not None and "zone-b#mute-peer" in str(err)
        assert [w["peers"] for w in _teardown_warnings(logs)] == [["zone-b#mute-peer"]]
    await dialer.close()


async def test_a_stopping_replica_is_not_held_by_a_mute_peer_of_its_pipeline() -> None:
    """Replica stop (the resolver's, on SIGTERM) takes its pipeline and tears it down: bounded."""
    dialer = Dialer()
    async with mute_peer() as (endpoint, peer):
        env = ReplicaEnv(
            lookup_spec=lambda _: None,
            new_spool_file=MemorySpoolFile,
            stores=None,
            persister=None,
            pulse=None,
            clock=lambda: 0.0,
            shutdown_wait_s=EVENT_WAIT_S,
        )
        replica = Replica(J, env)
        serving = asyncio.create_task(replica.serve())
        never = asyncio.Event()
        spool = await replica.spool_slot.take(never)
        assert await replica.pipeline_slot.take(never) is None
        pln = Pipeline.start(
            pb.Header(
                process_id=PRIMARY,
                route=pb.Route(
                    members=[PRIMARY, MUTE], primary=0, endpoints=["http://primary:1", endpoint]
                ),
            ),
            spool,
            replica.spool_slot,
            dialer,
            response_timeout_s=RESPONSE_TIMEOUT_S,
            send_timeout_s=RESPONSE_TIMEOUT_S,
            close_wait_s=CLOSE_WAIT_S,
        )
        await _synchronise(pln, peer)
        replica.pipeline_slot.put(pln)
        loop = asyncio.get_running_loop()
        started = loop.time()
        replica.stop()
        async with asyncio.timeout(TEARDOWN_BOUND_S):
            await replica.wait_stopped()
        assert loop.time() - started < TEARDOWN_BOUND_S
        await serving
    await dialer.close()
