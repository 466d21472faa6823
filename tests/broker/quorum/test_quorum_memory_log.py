"""Quorum journals on brokers without a data directory (docs/design/quorum.md, "Built (lost
disks)"): each member's log is in memory, so every start of a member's node is a lost disk's.
Three in-process brokers on the embedded keyspace, none with `data_dir`; assignments written as
the allocator writes them.

Before, a restarted member came back with an empty log and voted as if it were whole: with the
follower B down, the leader A and the follower C acknowledged appends, then A and C crashed and
C and B restarted; they elected, and the next append was answered OK at offset 0, every
acknowledged byte gone (the first test). With the leader still alive, C's node instead died on
the leader's first Replicate ("before alignment") and was never started again (the second).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
from broker_testkit import Cluster

from broker.keyspace.embedded import EmbeddedStore
from broker.protocol import protocol_pb2 as pb
from broker.quorum.register import TermRecord
from broker.quorum_shell.member_registry import Joiner, MemberRegistry, memory_incarnation
from broker.quorum_shell.node import QuorumNode
from broker.quorum_shell.term_record import encode_term_record
from broker.server import Broker
from broker.topology import quorum_term_key
from tests.broker.quorum.quorum_brokers_testkit import (
    append_until_ok,
    broker_name,
    create_quorum_journal,
    member_status,
    term_record,
    until,
)

J = "quorum/memory-log"
ROOT = "/gazette/cluster"
# Bound of each wait (an election takes one or two 1-s election timeouts).
wait_s = 30.0
# What an append is answered while no leader is elected (the route the mirror tells may name
# the allocator's primary).
_NO_LEADER = (pb.NO_JOURNAL_PRIMARY_BROKER, pb.NOT_JOURNAL_PRIMARY_BROKER)


async def _start(cluster: Cluster, i: int) -> Broker:
    """Broker i (`zone-i`, `broker-i`) without a data directory: its quorum logs in memory."""
    return await cluster.start_broker(f"zone-{i}", f"broker-{i}")


async def _restart(cluster: Cluster, b: Broker) -> Broker:
    """`b`'s process stopped and started again (same member name): its memory is gone."""
    zone, suffix = b.config.zone, b.config.suffix
    await cluster.stop_broker(b)
    return await cluster.start_broker(zone, suffix)


def _node(b: Broker) -> QuorumNode:
    return b.quorum.nodes[J]


async def _three_with_a_leader(cluster: Cluster) -> tuple[list[Broker], Broker, bytearray]:
    """Three brokers, the journal on them, one append committed on every member. Returns the
    brokers, the leader's broker and the acknowledged content."""
    brokers = [await _start(cluster, i) for i in range(3)]
    await create_quorum_journal(cluster, J, brokers)
    first = await append_until_ok(cluster, brokers[0], J, b"first;", wait_s)
    assert (first.commit.begin, first.commit.end) == (0, 6)
    await until(
        "the register names a leader",
        lambda: (r := term_record(brokers[0], J)) is not None and bool(r.leader),
        wait_s,
    )
    record = term_record(brokers[0], J)
    assert record is not None
    [leader] = [b for b in brokers if broker_name(b) == record.leader]
    await until(
        "every member commits the first append",
        lambda: all(J in b.quorum.nodes and _node(b).commit_offset == 6 for b in brokers),
        wait_s,
    )
    return brokers, leader, bytearray(b"first;")


async def _append(cluster: Cluster, via: Broker, data: bytes, expected: bytearray) -> None:
    """One append, which must land at exactly the acknowledged end."""
    resp = await append_until_ok(cluster, via, J, data, wait_s)
    assert (resp.commit.begin, resp.commit.end) == (len(expected), len(expected) + len(data))
    expected += data


async def test_members_restarted_without_their_logs_do_not_elect_over_acknowledged_appends(
    cluster: Cluster,
) -> None:
    brokers, leader, expected = await _three_with_a_leader(cluster)
    lagging, other = (b for b in brokers if b is not leader)
    await cluster.stop_broker(lagging)  # down from here on
    for i in range(3):
        await _append(cluster, leader, f"ACKED-{i};".encode(), expected)  # leader and other
    assert len(expected) == 30

    # `other` and the leader crash: the acknowledged appends were only in their memory.
    # `other` and the lagging member come back. Each joins as back from a lost disk (its
    # member joined before, with this process's predecessor), so neither votes: no quorum of
    # voters, and the election is blocked, visibly, rather than elect empty logs.
    await cluster.stop_broker(other)
    await cluster.stop_broker(leader)
    other = await _restart_stopped(cluster, other)
    lagging = await _restart_stopped(cluster, lagging)
    live = [other, lagging]
    await cluster.assign(J, live)
    await until("both nodes joined", lambda: all(_joined(b) for b in live), wait_s)
    # No append is answered OK (before: OK at offset 0, where "first;" was) while the election
    # runs into the block.
    await _appends_refused_until(cluster, other, lambda: any(_blocked(b) for b in live))
    for b in live:
        decision = _node(b).join_decision
        assert decision is not None and decision.lost, decision
        assert "in memory" in decision.reason
    names = tuple(sorted(broker_name(b) for b in live))
    await until(
        "the election is blocked by the two restarted members",
        lambda: any(
            (blocked := _node(b).election_blocked) is not None and blocked.non_voters == names
            for b in live
        ),
        wait_s,
    )
    statuses = [await member_status(b, J) for b in live]
    assert all(s.lost for s in statuses), statuses
    assert any(s.blocked is not None and s.blocked.lost == names for s in statuses), statuses
    assert not any(_node(b).is_leader for b in live)

    # The leader's broker comes back too: every member's log was in memory, nothing of the
    # journal survives on any of them, and it still does not start again at offset 0.
    leader = await _restart_stopped(cluster, leader)
    live.append(leader)
    await cluster.assign(J, live)
    await until("the third node joined", lambda: _joined(leader), wait_s)
    decision = _node(leader).join_decision
    assert decision is not None and decision.lost, decision
    resp = await cluster.append(leader, J, [b"after;"])
    assert resp.status in _NO_LEADER, resp
    assert not any(_node(b).is_leader for b in live)
    assert all(_node(b).commit_offset == 0 and _node(b).failure is None for b in live)
    status = await member_status(leader, J)
    assert status.lost and status.leader == ""


async def test_a_member_restarted_without_its_log_rejoins_and_votes_once_caught_up(
    cluster: Cluster,
) -> None:
    brokers, leader, expected = await _three_with_a_leader(cluster)
    for i in range(3):
        await _append(cluster, leader, f"a{i};".encode(), expected)
    follower, other = (b for b in brokers if b is not leader)
    # The follower's process restarts while the leader runs: its node joins lost (its empty
    # log does not vote), and the leader's first Replicate is answered LOST rather than
    # stopping the node (before: a ProtocolError, and the node stayed stopped).
    follower = await _restart(cluster, follower)
    brokers = [leader, follower, other]
    await cluster.assign(J, brokers)
    await until("the restarted node joined", lambda: _joined(follower), wait_s)
    node = _node(follower)
    await until(
        "the leader catches the restarted member up, and it votes again",
        lambda: _caught_up(node, len(expected)),
        wait_s,
    )
    assert _node(follower) is node
    assert node.join_decision is not None and node.join_decision.lost
    assert node.read_committed() == bytes(expected)
    assert not (await member_status(follower, J)).lost
    await _append(cluster, leader, b"b0;", expected)

    # It counts again: the leader's broker crashes, and the follower and the other member
    # elect and go on from the acknowledged end, both holding every acknowledged byte.
    await cluster.stop_broker(leader)
    live = [follower, other]
    await _append(cluster, follower, b"c0;", expected)
    await until(
        "both commit through the acknowledged end",
        lambda: all(_node(b).commit_offset == len(expected) for b in live),
        wait_s,
    )
    for b in live:
        assert _node(b).read_committed() == bytes(expected)


async def test_an_in_memory_member_is_lost_only_if_it_joined_and_a_term_was_claimed() -> None:
    """The rule for a log in memory, on a keyspace: a member not recorded joins as a voter; one
    recorded is lost once the journal had a term (it may have acknowledged appends its empty
    log lacks), but not before: while the register is empty nothing was acknowledged, so a
    brand-new journal whose members all restarted before its first election still elects."""
    store = EmbeddedStore()
    backend = store.connect()
    try:
        registry = MemberRegistry(backend, ROOT, J, 7)

        async def join(member: str) -> tuple[bool, str]:
            joiner = Joiner.in_memory(registry, member, memory_incarnation())
            async with asyncio.timeout(wait_s):
                decision = await joiner.join()
            assert joiner.last_error is None, joiner.last_error
            return decision.lost, decision.reason

        assert await join("a") == (False, "joins (first time)")
        lost, reason = await join("a")  # restarted: recorded, but no term yet
        assert not lost and "never had a term" in reason, reason
        record = TermRecord(1, "a!coordinator", ("a", "b", "c"), "a")
        await backend.put(quorum_term_key(ROOT, J).encode(), encode_term_record(record, 7))
        lost, reason = await join("a")  # restarted after a term: lost
        assert lost and "in memory" in reason, reason
        assert await join("b") == (False, "joins (first time)")  # never joined: a voter
        assert (await join("b"))[0]
    finally:
        await backend.close()


async def _appends_refused_until(
    cluster: Cluster, via: Broker, condition: Callable[[], bool]
) -> None:
    """Append through `via` again and again until `condition` holds after an attempt (bounded
    by wait_s): each must be refused (no leader, or UNAVAILABLE), none answered OK."""
    async with asyncio.timeout(wait_s):
        while True:
            try:
                resp = await cluster.append(via, J, [b"after;"])
                assert resp.status in _NO_LEADER, (
                    f"appended at [{resp.commit.begin}, {resp.commit.end}) after members"
                    f" restarted without their logs: {pb.Status.Name(resp.status)}"
                )
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            if condition():
                return
            await asyncio.sleep(0.05)  # a client's backoff, not a synchronisation


def _blocked(b: Broker) -> bool:
    node = b.quorum.nodes.get(J)
    return node is not None and node.election_blocked is not None


def _caught_up(node: QuorumNode, end: int) -> bool:
    """Whether `node` commits through `end` and votes; a node that failed fails the test."""
    assert node.failure is None, f"the node failed: {node.failure!r}"
    return node.commit_offset == end and not node.member.lost_state


def _joined(b: Broker) -> bool:
    node = b.quorum.nodes.get(J)
    return node is not None and node.joined.is_set()


async def _restart_stopped(cluster: Cluster, b: Broker) -> Broker:
    """Start again the (stopped) broker `b` under its member name."""
    return await cluster.start_broker(b.config.zone, b.config.suffix)
