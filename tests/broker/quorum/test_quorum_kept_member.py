"""A broker the term register names in its ensemble runs its member's node, assigned or not
(docs/design/quorum.md, "Built (branch f-quorum)"), across its restarts too: the ensemble's
quorum counts its vote. Three in-process brokers with data directories on the embedded
keyspace; assignments written as the allocator writes them.

The allocator takes X's replica away and has no broker to put it on yet (the route is not
whole, so no ensemble change is wanted: the register keeps {L, X, Y}, settled). X's node
stays, and comes back when X's broker restarts; then L's broker stops, and Y and X elect and
commit. Before, X's node stopped with its assignment (and a kept node did not come back after
a restart): Y alone, one of three, could never elect again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import grpc
from broker_testkit import ROOT, Cluster, journal_spec

from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.quorum.register import TermRecord
from broker.quorum_shell.node import QuorumNode
from broker.quorum_shell.status import journal_status
from broker.quorum_shell.term_record import QuorumTerm
from broker.server import Broker
from broker.topology import quorum_term_key

J = "quorum/kept"
# Bound of each wait (an election takes one or two 1-s election timeouts).
wait_s = 30.0


def _name(b: Broker) -> str:
    return f"{b.config.zone}#{b.config.suffix}"


def _record(b: Broker) -> TermRecord | None:
    entry = b.ks.get(quorum_term_key(ROOT, J))
    term = entry.decoded if entry is not None else None
    return term.record if isinstance(term, QuorumTerm) else None


async def _until(what: str, condition: Callable[[], bool]) -> None:
    """Wait (bounded) for a condition of brokers' nodes and mirrors, which offer no single
    event to await: checked every 20 ms."""
    try:
        async with asyncio.timeout(wait_s):
            while not condition():  # noqa: ASYNC110 -- no event spans every broker's nodes.
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {wait_s} s: {what}") from None


async def _append(cluster: Cluster, via: Broker, data: bytes) -> pb.AppendResponse:
    """One append through `via`, tried again while the journal elects (bounded). Each
    attempt's outcome is known: the record is the same, and the test checks it lands once."""
    async with asyncio.timeout(wait_s):
        while True:
            try:
                resp = await cluster.append(via, J, [data])
                if resp.status == pb.OK:
                    return resp
            except grpc.aio.AioRpcError as err:
                # Proxied to a leader that is gone (not reached: nothing sent) until the
                # next one is elected.
                assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            await asyncio.sleep(0.05)  # a client's backoff, not a synchronisation


async def test_a_member_named_by_the_register_keeps_its_node_unassigned_and_restarted(
    cluster: Cluster, tmp_path: Path
) -> None:
    def start(i: int) -> asyncio.Future[Broker]:
        return asyncio.ensure_future(
            cluster.start_broker(f"zone-{i}", f"broker-{i}", data_dir=str(tmp_path / f"b{i}"))
        )

    brokers = [await start(i) for i in range(3)]
    spec = journal_spec(J, replication=3)
    spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
    await cluster.create(spec, brokers)
    first = await _append(cluster, brokers[0], b"before\n")
    await _until(
        "the register settled with a leader",
        lambda: (r := _record(brokers[0])) is not None and bool(r.leader) and r.settled,
    )
    settled = _record(brokers[0])
    assert settled is not None
    index = {_name(b): i for i, b in enumerate(brokers)}
    leader = brokers[index[settled.leader]]
    x, y = (b for b in brokers if b is not leader)

    # X's replica taken away, none added yet: the register keeps naming X.
    await cluster.assign(J, [leader, y])
    assert J not in x.resolver.replicas
    await _until(f"{_name(x)} keeps its node", lambda: J in x.quorum.nodes)
    assert J in x.quorum.kept
    status = journal_status(x.ks, ROOT, J, x.quorum.nodes[J])
    assert status.member == _name(x) and status.kept

    # X's broker restarts: its node comes back (the register still names X, settled).
    i_x = index[_name(x)]
    await cluster.stop_broker(x)
    x = brokers[i_x] = await start(i_x)
    await _until(f"{_name(x)}'s node is back after its restart", lambda: J in x.quorum.nodes)
    assert J in x.quorum.kept
    record = _record(x)
    assert record is not None and record.ensemble == settled.ensemble and record.settled

    # L's broker stops: Y and X are two of three, and elect.
    await cluster.stop_broker(leader)
    resp = await _append(cluster, y, b"after\n")
    assert resp.commit.begin == first.commit.end
    record = _record(y)
    assert record is not None and record.term > settled.term
    assert record.leader in (_name(x), _name(y)) and record.ensemble == settled.ensemble
    for b in (x, y):
        node = b.quorum.nodes[J]

        def knows_commit(n: QuorumNode = node) -> bool:
            return n.commit_offset >= resp.commit.end

        await _until(f"{_name(b)} knows the commit", knows_commit)
        assert node.read_committed(0) == b"before\nafter\n"
