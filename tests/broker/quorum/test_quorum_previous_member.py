"""The way back of a blocked ensemble change on real brokers (docs/design/quorum.md, "Built
(branch f16-prev)"): four in-process brokers over loopback gRPC, each with its data directory,
on one embedded keyspace; assignments are written as the allocator writes them.

The double fault the simulation survives since f16-live: a remove-first step {L,X,Y} -> {L,Y}
is claimed (X silent, its replica moved to a fourth broker), and before its election Y, which
stays, loses its disk. {L,Y} then has one voter, so the next claim goes back to {L,X,Y}, which
elects with L and X, but only if X's broker runs a node of the journal, though the journal is
no longer assigned to it. Before this branch it ran none (a broker ran nodes only for its
assigned journals): the journal never elected again.

The claim is written into the term register as the leader's coordinator computes it
(`Rules.next_ensemble`) with the three members' brokers down: the state a coordinator leaves
when its broker crashes right after the claim. With the brokers up the same state arises only
through a race (the step decided before Y's loss is known: seeds 5533, 7949, 9439), which a
test cannot order.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path

from broker_testkit import Cluster, journal_spec

from broker import metrics
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.quorum.register import TermRecord
from broker.quorum.rules import CORRECT_RULES
from broker.quorum_shell.log_file import log_path
from broker.quorum_shell.node import COORDINATOR_SUFFIX
from broker.quorum_shell.status import journal_status
from broker.quorum_shell.term_record import QuorumTerm
from broker.quorum_shell.term_register import KeyspaceTermRegister
from broker.server import Broker
from broker.topology import DEFAULT_ROOT, lookup_item, quorum_term_key

J = "quorum/previous"
ROOT = DEFAULT_ROOT
# Bound of each wait for the cluster (elections take a few 1-s election timeouts).
wait_s = 30.0
# Attempts of one append while the journal elects (each answered at once, then retried).
append_attempts_max = 400
append_retry_s = 0.05


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


async def _append(cluster: Cluster, brokers: list[Broker], data: bytes) -> pb.AppendResponse:
    """Append `data` through the broker whose node leads, retried while none does (an
    election) or the one believed to lead refuses."""
    last = "no leader"
    for _ in range(append_attempts_max):
        leader = next(
            (b for b in brokers if J in b.quorum.nodes and b.quorum.nodes[J].is_leader), None
        )
        if leader is not None:
            resp = await cluster.append(leader, J, [data])
            if resp.status == pb.OK:
                return resp
            last = f"{_name(leader)}: {pb.Status.Name(resp.status)}"
        await asyncio.sleep(append_retry_s)  # a client's retry interval, not a synchronisation
    raise AssertionError(
        f"append of {data!r} not acknowledged: {last}; register {_record(brokers[0])}"
    )


async def test_a_removed_member_keeps_its_node_for_the_way_back(
    cluster: Cluster, tmp_path: Path
) -> None:
    def start(i: int) -> asyncio.Future[Broker]:
        return asyncio.ensure_future(
            cluster.start_broker(f"zone-{i}", f"broker-{i}", data_dir=str(tmp_path / f"b{i}"))
        )

    brokers = [await start(i) for i in range(4)]
    spare = brokers[3]
    spec = journal_spec(J, replication=3)
    spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
    await cluster.create(spec, brokers[:3])
    expected = bytearray()
    for i in range(3):
        data = f"before-{i}\n".encode()
        resp = await _append(cluster, brokers[:3], data)
        assert (resp.commit.begin, resp.commit.end) == (len(expected), len(expected) + len(data))
        expected += data
    await _until(
        "the register settled with a leader",
        lambda: (r := _record(spare)) is not None and bool(r.leader) and r.settled,
    )
    settled = _record(spare)
    assert settled is not None
    index = {_name(b): i for i, b in enumerate(brokers)}
    leader = settled.leader
    x, y = (m for m in settled.ensemble if m != leader)  # X is removed, Y loses its disk
    item = lookup_item(spare.ks, ROOT, J)
    assert item is not None
    revision = item.kv.create_revision

    # The three members' brokers go down; the leader's coordinator had just claimed the
    # remove-first step (X silent, its replica moved to the spare).
    for name in (leader, x, y):
        await cluster.stop_broker(brokers[index[name]])
    wanted = tuple(sorted((leader, y, _name(spare))))
    ensemble, previous = CORRECT_RULES.next_ensemble(settled, wanted, frozenset({x}))
    assert (ensemble, previous) == (tuple(sorted((leader, y))), settled.ensemble)
    register = KeyspaceTermRegister(cluster.admin, ROOT, J, settled.ensemble, revision)
    current = await register.read()
    claim = TermRecord(current.record.term + 1, leader + COORDINATOR_SUFFIX, ensemble, "", previous)
    assert (await register.compare_and_swap(current.revision, claim)).ok
    # ... and Y lost its disk.
    shutil.rmtree(tmp_path / f"b{index[y]}")
    for name in (leader, x, y):
        brokers[index[name]] = await start(index[name])
    b_leader, b_x, b_y = (brokers[index[n]] for n in (leader, x, y))
    await cluster.assign(J, [b_leader, b_y, spare])  # X's replica moved to the spare
    assert J not in b_x.resolver.replicas  # not assigned to X's broker

    # {L,Y} cannot elect (Y is back from a lost disk: no vote until caught up): the next
    # claim goes back to {L,X,Y}, which needs X's node.
    await _until(
        "the register went back to the ensemble the change left",
        lambda: (
            (r := _record(spare)) is not None
            and r.ensemble == settled.ensemble
            and r.previous == ensemble
        ),
    )
    await _until(
        f"{x}'s broker runs a node of {J}, though not assigned", lambda: J in b_x.quorum.nodes
    )
    node_x = b_x.quorum.nodes[J]
    assert J in b_x.quorum.kept
    labels = {"journal": J, "member": x}
    assert metrics.value_of("gazette_quorum_kept_for_change", labels) == 1
    status = journal_status(b_x.ks, ROOT, J, node_x)
    assert status.member == x and status.kept

    # The way back elects: appends commit again, after every byte acknowledged before.
    live = [b_leader, b_x, b_y, spare]
    data = b"after-the-way-back\n"
    resp = await _append(cluster, live, data)
    assert (resp.commit.begin, resp.commit.end) == (len(expected), len(expected) + len(data))
    expected += data

    # The move then completes (the spare in, X out), X's node stops once nothing names X
    # in an unsettled change, and X's member files stay (an operator removes them).
    moved = tuple(sorted((leader, y, _name(spare))))
    await _until(
        "the register settled on the moved ensemble",
        lambda: (r := _record(spare)) is not None and r.ensemble == moved and r.settled,
    )
    await _until(f"{x}'s node stopped", lambda: J not in b_x.quorum.nodes)
    assert J not in b_x.quorum.kept
    assert metrics.value_of("gazette_quorum_kept_for_change", labels) == 0
    assert log_path(str(tmp_path / f"b{index[x]}"), J).exists()
    data = b"after-the-move\n"
    resp = await _append(cluster, [b_leader, b_y, spare], data)
    assert (resp.commit.begin, resp.commit.end) == (len(expected), len(expected) + len(data))
    expected += data
    for b in (b_leader, b_y, spare):
        node = b.quorum.nodes[J]
        await _until(
            f"{_name(b)} knows the commit", lambda n=node: n.commit_offset >= len(expected)
        )  # type: ignore[misc]
        assert node.read_committed(0) == bytes(expected), _name(b)
