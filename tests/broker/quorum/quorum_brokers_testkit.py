"""What the tests of quorum journals on in-process brokers share (test_quorum_kept_member.py,
test_quorum_previous_member.py, test_quorum_gazctl_state.py): brokers with data directories,
a quorum journal on them, the term register as a broker mirrors it, and a bounded wait."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
from broker_testkit import ROOT, Cluster, journal_spec

from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.quorum.register import TermRecord
from broker.quorum_shell.status import JournalStatus, fetch_status
from broker.quorum_shell.term_record import QuorumTerm
from broker.server import Broker
from broker.topology import quorum_term_key

# Bound of each wait for the cluster (an election takes one or a few 1-s election timeouts).
WAIT_S = 30.0


def broker_name(b: Broker) -> str:
    """The member name of `b` (`zone#suffix`), as term registers and routes name it."""
    return f"{b.config.zone}#{b.config.suffix}"


async def start_broker(cluster: Cluster, tmp_path: Path, i: int) -> Broker:
    """Broker i (`zone-i`, `broker-i`), its data directory under `tmp_path` (kept across its
    restarts: start it again with the same i)."""
    return await cluster.start_broker(f"zone-{i}", f"broker-{i}", data_dir=str(tmp_path / f"b{i}"))


async def start_brokers(cluster: Cluster, tmp_path: Path, count: int) -> list[Broker]:
    """Brokers 0 to count - 1, started in turn."""
    return [await start_broker(cluster, tmp_path, i) for i in range(count)]


async def create_quorum_journal(
    cluster: Cluster, journal: str, brokers: Sequence[Broker], replication: int = 3
) -> None:
    """A quorum journal of `replication`, assigned to `brokers` (the allocator's way)."""
    spec = journal_spec(journal, replication=replication)
    spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
    await cluster.create(spec, brokers)


def term_record(b: Broker, journal: str) -> TermRecord | None:
    """The term register of `journal` as `b`'s mirror holds it, if any."""
    entry = b.ks.get(quorum_term_key(ROOT, journal))
    term = entry.decoded if entry is not None else None
    return term.record if isinstance(term, QuorumTerm) else None


async def member_status(b: Broker, journal: str, wait_s: float = WAIT_S) -> JournalStatus:
    """`journal`'s status as `b` answers Status over gRPC (what gazctl asks each member)."""
    channel = grpc.aio.insecure_channel(b.endpoint.removeprefix("http://"))
    try:
        [answered] = (await fetch_status(channel, [journal], timeout_s=wait_s)).values()
    finally:
        await channel.close()
    return answered


async def until(what: str, condition: Callable[[], bool], wait_s: float = WAIT_S) -> None:
    """Wait (bounded) for a condition of brokers' nodes and mirrors, which offer no single
    event to await: checked every 20 ms."""
    try:
        async with asyncio.timeout(wait_s):
            while not condition():  # noqa: ASYNC110 -- no event spans every broker's nodes.
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {wait_s} s: {what}") from None


async def append_until_ok(
    cluster: Cluster, via: Broker, journal: str, data: bytes, wait_s: float = WAIT_S
) -> pb.AppendResponse:
    """One append of `data` through `via`, tried again (bounded) while it is answered
    UNAVAILABLE or not OK (the journal electing, a leader gone); any other error fails the
    test. The callers check where each record lands: an attempt whose outcome was unknown and
    that committed after all would show there, written twice."""
    async with asyncio.timeout(wait_s):
        while True:
            try:
                resp = await cluster.append(via, journal, [data])
                if resp.status == pb.OK:
                    return resp
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            await asyncio.sleep(0.05)  # a client's backoff, not a synchronisation
