"""A broker's side of a lost disk (docs/design/quorum.md, "Built (lost disks)"): three quorum
nodes of one journal on loopback gRPC, each with a data directory (member log files, the
broker's incarnation, the member marks) and the member registry in an embedded keyspace.

The scenario that loses an acknowledged append if a lost disk votes: entries B are held only by
X and Y (m2 was down); X loses its disk and Y is down; X and m2 come back. Counted as a voter,
X's empty log and m2's lagging one form a majority that elects m2, and B is gone (shown below
with the marking disabled: X's node built as before, without its joiner). Marked lost, X does
not vote: nothing is elected until Y is back, and then every acknowledged append is kept.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from broker import metrics
from broker.keyspace.backend import KeyValue
from broker.keyspace.embedded import EmbeddedStore
from broker.quorum_shell.journals import open_member_log
from broker.quorum_shell.log_file import log_path
from broker.quorum_shell.member_dir import (
    MARK_FILE_NAME,
    Mark,
    load_incarnation,
    read_mark,
)
from broker.quorum_shell.member_registry import MemberRegistry, decide
from broker.quorum_shell.members_record import (
    MembersRecord,
    QuorumMembers,
    encode_members_record,
    quorum_members_key,
)
from broker.quorum_shell.node import LogWriteError, QuorumNode
from broker.quorum_shell.term_register import KeyspaceTermRegister
from broker.quorum_shell.transport import GrpcTransport
from broker.topology import TopologyDecodeError, make_decoder
from tests.broker.quorum.quorum_nodes_testkit import (
    JOURNAL_REVISION,
    NAMES,
    ROOT,
    Cluster,
    J,
    append_all,
    wait_s,
)


async def _lose_x_while_y_down(c: Cluster, *, mark_lost: bool) -> tuple[str, str, bytearray]:
    """A entries everywhere, B entries on X and Y only; then X loses its disk, Y is down,
    and X and m2 are started. Returns (X, Y, acknowledged content)."""
    for name in NAMES:
        await c.start(name)
    expected = bytearray()
    await append_all(c, "a", 3, expected)
    await c.kill("m2")  # m2 lags from here on
    await append_all(c, "b", 3, expected)  # committed by X and Y alone
    x, y = "m0", "m1"
    await c.kill(x)
    await c.kill(y)
    c.lose_disk(x)
    await c.start(x, mark_lost=mark_lost)
    await c.start("m2")
    return x, y, expected


async def test_a_lost_disk_does_not_vote_until_caught_up(quorum_nodes: Cluster) -> None:
    c = quorum_nodes
    x, y, expected = await _lose_x_while_y_down(c, mark_lost=True)
    xnode, m2 = c.live[x].node, c.live["m2"].node
    await c.until(lambda: xnode.joined.is_set(), "X joined")
    assert xnode.join_decision is not None and xnode.join_decision.lost
    assert read_mark(c.data_dir(x) / "quorum" / J) is Mark.LOST
    # X answers NewTerm as a non-voter; m2 alone cannot elect: elections fail, term after term.
    term = m2.member.term
    await c.until(lambda: m2.member.term >= term + 2, "two more terms fenced")
    assert c.leader() is None
    assert m2.coordinator.election_blocked is None  # one lost disk of three: not blocked
    # Y (the other holder of B) comes back: Y and m2 elect Y, every acknowledged append kept.
    await c.start(y)
    await append_all(c, "c", 2, expected)
    for node in (xnode, m2, c.live[y].node):
        await c.until(lambda n=node: n.commit_offset == len(expected), "every member commits")
        assert node.read_committed() == bytes(expected)
    # X is caught up: a voter again, and its mark is gone (a restart finds it a voter).
    await c.until(lambda: not xnode.member.lost_state, "X votes again")
    await c.until(lambda: read_mark(c.data_dir(x) / "quorum" / J) is None, "mark removed")


async def test_with_the_marking_disabled_the_acknowledged_appends_are_lost(
    quorum_nodes: Cluster,
) -> None:
    """The scenario's power: X's node built without its joiner (as before) votes with its empty
    log, and X and m2 elect m2: the next append lands where B began."""
    c = quorum_nodes
    _, _, expected = await _lose_x_while_y_down(c, mark_lost=False)
    a_end = expected.index(b"b0;")
    begin, _ = await c.append(b"after;")
    assert begin == a_end < len(expected)


async def test_a_restart_before_catching_up_stays_lost(quorum_nodes: Cluster) -> None:
    c = quorum_nodes
    x, _, _ = await _lose_x_while_y_down(c, mark_lost=True)
    await c.until(lambda: c.live[x].node.joined.is_set(), "X joined")
    first_nonce = c.live[x].node.member.lost_nonce
    await c.kill(x)  # before any leader caught it up: its log file now exists
    assert (c.data_dir(x) / "quorum" / J / "log").stat().st_size > 0
    xnode = await c.start(x)
    await c.until(lambda: xnode.joined.is_set(), "X joined again")
    assert xnode.join_decision is not None and xnode.join_decision.lost
    assert xnode.member.lost_state
    assert 0 < xnode.member.lost_nonce != first_nonce  # a nonce of this start


async def test_a_lost_member_starts_in_the_term_registers_term(quorum_nodes: Cluster) -> None:
    # Its lost log forgot the term it was fenced into; the register holds it (or a later
    # one). Started below it, a leader deposed before the loss could align it and commit
    # with it. The term is in its log file before it takes part (a restart keeps it).
    c = quorum_nodes
    register = KeyspaceTermRegister(c.store.connect(), ROOT, J, NAMES, c.journal_revision)
    for name in NAMES:
        await c.start(name)
    await append_all(c, "a", 3, bytearray())
    x = "m0"
    await c.kill(x)
    c.lose_disk(x)
    registered = (await register.read()).record.term  # X reads this one or a later one
    xnode = await c.start(x)
    await c.until(lambda: xnode.joined.is_set(), "X joined")
    assert registered > 0 and xnode.member.term >= registered
    assert xnode.member.lost_nonce > 0
    await c.kill(x)
    assert (await c.start(x)).member.term >= registered  # from its log file, before joining


async def test_two_lost_disks_block_the_election_with_a_reason(quorum_nodes: Cluster) -> None:
    c = quorum_nodes
    x, y, _ = await _lose_x_while_y_down(c, mark_lost=True)
    await c.kill("m2")
    c.lose_disk(y)  # Y's disk too: only m2 (lagging) kept its log
    blocked_before = metrics.value_of("gazette_quorum_elections_blocked")
    await c.start(y)
    await c.start("m2")
    coordinators = [n.node for n in c.live.values()]
    await c.until(
        lambda: any(n.election_blocked is not None for n in coordinators), "election blocked"
    )
    blocked = next(n.election_blocked for n in coordinators if n.election_blocked is not None)
    assert blocked is not None and blocked.non_voters == (x, y)
    assert blocked.voters_needed == 2
    assert metrics.value_of("gazette_quorum_elections_blocked") > blocked_before
    assert c.leader() is None
    # The operator's way out (docs/design/quorum.md, Built (lost disks)): accept the loss of
    # what only the lost disks held by removing one lost member's mark and restarting it. It
    # votes with its (empty) log: it and m2 elect m2, whose log is what survives.
    await c.kill(y)
    (c.member_dir(y) / MARK_FILE_NAME).unlink()
    ynode = await c.start(y)
    await c.until(lambda: ynode.joined.is_set(), "Y joined")
    assert ynode.join_decision is not None and not ynode.join_decision.lost
    m2_end = c.live["m2"].node.member.log.head_end
    begin, _ = await c.append(b"after;")
    assert begin == m2_end
    await c.until(
        lambda: all(n.node.election_blocked is None for n in c.live.values()), "unblocked"
    )


async def test_a_fresh_journal_elects_with_a_late_starter(quorum_nodes: Cluster) -> None:
    """Members joining a fresh journal are not lost, the late one included (its new log is not
    a lost disk: it never joined), and the first election does not wait for it."""
    c = quorum_nodes
    await c.start("m0")
    await c.start("m1")
    expected = bytearray()
    await append_all(c, "early", 2, expected)
    late = await c.start("m2")
    await c.until(lambda: late.joined.is_set(), "m2 joined")
    assert late.join_decision is not None and not late.join_decision.lost
    assert not late.member.lost_state
    await c.until(lambda: late.commit_offset == len(expected), "m2 catches up")
    for name in NAMES:
        assert not (c.data_dir(name) / "quorum" / J / MARK_FILE_NAME).exists()


async def test_a_joining_mark_left_by_a_crash_is_resolved(tmp_path: Path) -> None:
    """A start that wrote `joining` and stopped before clearing it: the member answered nothing,
    so it joins (recorded with this disk or not at all); recorded with another disk: lost."""
    store = EmbeddedStore()
    backend = store.connect()
    data_dir = str(tmp_path / "b")
    incarnation = load_incarnation(data_dir)
    registry = MemberRegistry(backend, ROOT, J, JOURNAL_REVISION)
    log_file, joiner = open_member_log(data_dir, J, "m0", incarnation, registry)
    log_file.close()  # "crash" before joining: file and `joining` mark left
    member_dir = log_path(data_dir, J).parent
    assert read_mark(member_dir) is Mark.JOINING
    log_file, joiner = open_member_log(data_dir, J, "m0", incarnation, registry)
    assert not joiner.log_new and joiner.mark_found is Mark.JOINING
    decision = await joiner.join()
    log_file.close()
    assert not decision.lost and read_mark(member_dir) is None
    record, _ = await registry.read()
    assert record.members == {"m0": incarnation}
    # The same member on another disk, after the registry recorded the first one.
    other = str(tmp_path / "c")
    log_file, joiner = open_member_log(other, J, "m0", load_incarnation(other), registry)
    decision = await joiner.join()
    log_file.close()
    assert decision.lost
    assert read_mark(log_path(other, J).parent) is Mark.LOST
    await backend.close()


def test_decide() -> None:
    mine, old = "a" * 16, "b" * 16
    cases = [
        # (log_new, mark, recorded, lost)
        (True, None, None, False),  # a first join (a fresh journal's late starter too)
        (True, None, old, True),  # joined with another disk: lost
        (True, None, mine, True),  # joined with this disk, but its log file is gone
        (False, None, old, False),  # has its log
        (False, None, None, False),
        (False, Mark.LOST, mine, True),  # restarted before catching up
        (True, Mark.LOST, mine, True),
        (False, Mark.JOINING, None, False),  # stopped while joining
        (False, Mark.JOINING, mine, False),
        (False, Mark.JOINING, old, True),
    ]
    for log_new, mark, recorded, lost in cases:
        got = decide(log_new=log_new, mark=mark, recorded=recorded, incarnation=mine)
        assert got.lost is lost, (log_new, mark, recorded, got)


def test_the_incarnation_is_kept_and_a_new_disk_gets_another(tmp_path: Path) -> None:
    first = load_incarnation(tmp_path / "d")
    assert load_incarnation(tmp_path / "d") == first
    shutil.rmtree(tmp_path / "d")
    assert load_incarnation(tmp_path / "d") != first


def test_the_members_record_is_decoded_by_the_topology() -> None:
    decode = make_decoder(ROOT)
    record = MembersRecord(JOURNAL_REVISION, {"zone-a#b1": "0123456789abcdef"})
    key = quorum_members_key(ROOT, J).encode()
    decoded = decode(KeyValue(key, encode_members_record(record), 1, 1, 1))
    assert decoded == QuorumMembers(J, record)
    for bad in (b"{", b'{"format":2}', b'{"format":1,"journal_revision":-1,"members":{}}'):
        with pytest.raises(TopologyDecodeError, match="quorum-members"):
            decode(KeyValue(key, bad, 1, 1, 1))


async def test_a_mark_that_cannot_be_written_stops_the_node(tmp_path: Path) -> None:
    """A member that must be marked lost but cannot be: the node takes no part and keeps the
    error (never a voter on a failed write)."""
    store = EmbeddedStore()
    backend = store.connect()
    registry = MemberRegistry(backend, ROOT, J, JOURNAL_REVISION)
    record, revision = await registry.read()
    assert await registry.record(record, revision, "m0", "f" * 16)  # joined with another disk
    data_dir = str(tmp_path / "b")
    log_file, joiner = open_member_log(data_dir, J, "m0", load_incarnation(data_dir), registry)
    (log_path(data_dir, J).parent / (MARK_FILE_NAME + ".tmp")).mkdir()  # writes there fail
    node = QuorumNode(
        J,
        "m0",
        NAMES,
        KeyspaceTermRegister(backend, ROOT, J, NAMES, JOURNAL_REVISION),
        GrpcTransport({}),
        log_file=log_file,
        joiner=joiner,
    )
    await node.start()
    try:
        async with asyncio.timeout(wait_s):
            while node.failure is None:
                await node.progress.wait()
                node.progress.clear()
    finally:
        await node.stop()
    assert isinstance(node.failure, LogWriteError) and "mark" in str(node.failure)
    assert not node.joined.is_set()
    await backend.close()
