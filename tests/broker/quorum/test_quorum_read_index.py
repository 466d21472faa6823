"""The read index (broker/quorum/read_index.py, quorum_shell/read_barrier.py) on quorum nodes
over loopback gRPC with the term register in an embedded keyspace: a follower learns the
leader's commit offset in one round trip, concurrent reads share the question, a deposed leader
(the register moved on to a newer term without it knowing) does not answer, and a member that
cannot learn the read index fails typed within its bound."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from broker.quorum.register import TermRecord
from broker.quorum_shell import read_barrier
from broker.quorum_shell.read_barrier import QuorumReadUnavailableError
from broker.quorum_shell.term_register import KeyspaceTermRegister
from tests.broker.quorum.quorum_nodes_testkit import (
    JOURNAL_REVISION,
    NAMES,
    ROOT,
    Cluster,
    J,
    append_all,
)

# Concurrent reads through one follower in the coalescing test.
readers = 50
# The read index's bound in the tests that wait it out (the broker's is longer).
short_wait_s = 0.5


async def _registered_leader(c: Cluster) -> str:
    """The leader, once the term register names it too (what the leader confirms against)."""
    register = KeyspaceTermRegister(c.store.connect(), ROOT, J, NAMES, JOURNAL_REVISION)

    def named() -> bool:
        leader = c.leader()
        return leader is not None and leader.coordinator.leader == leader.name

    await c.until(named, "a leader is appointed")
    leader = c.leader()
    assert leader is not None
    async with asyncio.timeout(15.0):
        while (await register.read()).record.leader != leader.name:
            await c.progress()
    return leader.name


async def test_a_follower_learns_the_leaders_commit_and_concurrent_reads_share_one_ask(
    quorum_nodes: Cluster,
) -> None:
    c = quorum_nodes
    for name in NAMES:
        await c.start(name)
    expected = bytearray()
    await append_all(c, "a", 3, expected)
    leader = await _registered_leader(c)
    follower = c.live[next(n for n in NAMES if n != leader)].node

    _, end = await c.append(b"the last append;")
    assert end == len(expected) + len(b"the last append;")
    # At once, through the follower: its own commit may still be behind, the read index not.
    asks = follower.reads.asks
    indexes = await asyncio.gather(*(follower.reads.read_index() for _ in range(readers)))
    assert min(indexes) >= end
    # One question for all of them, or two: those arriving while the first was in flight
    # wait for the next, which starts after it (never one question per read).
    assert 1 <= follower.reads.asks - asks <= 2, follower.reads.asks - asks
    # And the leader answers its own reads with its commit offset.
    assert await c.live[leader].node.reads.read_index() >= end


async def test_a_deposed_leader_does_not_answer(
    quorum_nodes: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = quorum_nodes
    for name in NAMES:
        await c.start(name)
    expected = bytearray()
    await append_all(c, "a", 3, expected)
    leader_name = await _registered_leader(c)
    leader = c.live[leader_name].node
    assert await leader.reads.read_index() == len(expected)  # it answers while it leads

    # The others go away; another coordinator claims a newer term (as one that elects a new
    # leader elsewhere would, first thing). The old leader does not know: it still leads.
    for name in NAMES:
        if name != leader_name:
            await c.kill(name)
    register = KeyspaceTermRegister(c.store.connect(), ROOT, J, NAMES, JOURNAL_REVISION)
    current = await register.read()
    newer: TermRecord = dataclasses.replace(
        current.record, term=current.record.term + 1, owner="elsewhere!coordinator", leader=""
    )
    assert (await register.compare_and_swap(current.revision, newer)).ok
    monkeypatch.setattr(read_barrier, "read_index_wait_s", short_wait_s)
    started = time.monotonic()
    with pytest.raises(QuorumReadUnavailableError, match=r"not confirmed|no leader"):
        await leader.reads.read_index()
    assert time.monotonic() - started < short_wait_s + 2.0  # bounded


async def test_a_member_without_a_leader_fails_typed_within_its_bound(
    quorum_nodes: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = quorum_nodes
    for name in NAMES:
        await c.start(name)
    expected = bytearray()
    await append_all(c, "a", 2, expected)
    leader = await _registered_leader(c)
    follower = next(n for n in NAMES if n != leader)
    for name in NAMES:
        if name != follower:
            await c.kill(name)  # the leader and the other follower: no majority, no answer
    monkeypatch.setattr(read_barrier, "read_index_wait_s", short_wait_s)
    started = time.monotonic()
    with pytest.raises(QuorumReadUnavailableError, match="read_index_wait_s"):
        await c.live[follower].node.reads.read_index()
    assert time.monotonic() - started < short_wait_s + 2.0
    # An unreachable leader is not one that predates the read index (no stale serving).
    assert c.live[follower].node.reads.predates is None
