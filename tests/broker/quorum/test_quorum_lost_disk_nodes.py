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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from broker import metrics
from broker.keyspace.backend import KeyValue
from broker.keyspace.embedded import EmbeddedStore
from broker.quorum.errors import NotLeaderError
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
from broker.quorum_shell.node import COORDINATOR_SUFFIX, QuorumNode
from broker.quorum_shell.term_register import KeyspaceTermRegister
from broker.quorum_shell.transport import GrpcTransport, Receiver, deliver_handler
from broker.topology import TopologyDecodeError, make_decoder

J = "quorum/lost-disk"
ROOT = "/gazette/cluster"
NAMES = ("m0", "m1", "m2")
JOURNAL_REVISION = 7
# Upper bound of any one wait (never a synchronisation device: each wait polls a condition).
wait_s = 15.0


@dataclass
class Node:
    node: QuorumNode
    server: grpc.aio.Server
    transport: GrpcTransport

    async def kill(self) -> None:
        await self.server.stop(None)
        await self.node.stop()
        await self.transport.close()


@dataclass
class Cluster:
    """Nodes started and killed by name, each on its own data directory and port."""

    tmp: Path
    store: EmbeddedStore
    ports: dict[str, int] = field(default_factory=dict)
    live: dict[str, Node] = field(default_factory=dict)

    def data_dir(self, name: str) -> Path:
        return self.tmp / name

    def endpoints(self) -> dict[str, str]:
        return {n: f"http://127.0.0.1:{p}" for n, p in self.ports.items()}

    async def start(self, name: str, *, mark_lost: bool = True) -> QuorumNode:
        """Start `name`'s node on its data directory. `mark_lost=False` builds it as brokers
        did before lost disks were marked: no joiner, so its member always votes."""
        server = grpc.aio.server()
        port = server.add_insecure_port(f"127.0.0.1:{self.ports.get(name, 0)}")
        self.ports[name] = port
        backend = self.store.connect()
        data_dir = str(self.data_dir(name))
        registry = MemberRegistry(backend, ROOT, J, JOURNAL_REVISION)
        log_file, joiner = open_member_log(data_dir, J, name, load_incarnation(data_dir), registry)
        transport = GrpcTransport(self.endpoints())
        node = QuorumNode(
            J,
            name,
            NAMES,
            KeyspaceTermRegister(backend, ROOT, J, NAMES),
            transport,
            seed=len(self.ports),
            log_file=log_file,
            joiner=joiner if mark_lost else None,
        )

        def route(journal: str, to: str) -> Receiver | None:
            ok = journal == J and to.removesuffix(COORDINATOR_SUFFIX) == name
            return node.receive if ok else None

        server.add_generic_rpc_handlers([deliver_handler(route)])
        await server.start()
        for other in self.live.values():  # its port may be new to them
            other.transport.endpoints[name] = self.endpoints()[name]
        self.live[name] = Node(node, server, transport)
        await node.start()
        return node

    async def kill(self, name: str) -> None:
        await self.live.pop(name).kill()

    def lose_disk(self, name: str) -> None:
        shutil.rmtree(self.data_dir(name))

    async def progress(self) -> None:
        events = [n.node.progress for n in self.live.values()]
        for event in events:
            event.clear()
        waits = [asyncio.ensure_future(event.wait()) for event in events]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def until(self, condition: Callable[[], bool], what: str) -> None:
        try:
            async with asyncio.timeout(wait_s):
                while not condition():
                    await self.progress()
        except TimeoutError:
            raise AssertionError(f"timed out waiting until {what}") from None

    def leader(self) -> QuorumNode | None:
        leaders = [n.node for n in self.live.values() if n.node.is_leader]
        return max(leaders, key=lambda n: n.member.term) if leaders else None

    async def append(self, data: bytes) -> tuple[int, int]:
        async with asyncio.timeout(wait_s):
            while True:
                leader = self.leader()
                if leader is not None:
                    try:
                        return await leader.append(data)
                    except NotLeaderError:
                        pass
                await self.progress()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    store = EmbeddedStore()
    c = Cluster(tmp_path, store)
    yield c
    for name in list(c.live):
        await c.kill(name)


async def _append_all(c: Cluster, tag: str, count: int, expected: bytearray) -> None:
    for i in range(count):
        data = f"{tag}{i};".encode()
        begin, end = await c.append(data)
        assert (begin, end) == (len(expected), len(expected) + len(data)), tag
        expected += data


async def _lose_x_while_y_down(c: Cluster, *, mark_lost: bool) -> tuple[str, str, bytearray]:
    """A entries everywhere, B entries on X and Y only; then X loses its disk, Y is down,
    and X and m2 are started. Returns (X, Y, acknowledged content)."""
    for name in NAMES:
        await c.start(name)
    expected = bytearray()
    await _append_all(c, "a", 3, expected)
    await c.kill("m2")  # m2 lags from here on
    await _append_all(c, "b", 3, expected)  # committed by X and Y alone
    x, y = "m0", "m1"
    await c.kill(x)
    await c.kill(y)
    c.lose_disk(x)
    await c.start(x, mark_lost=mark_lost)
    await c.start("m2")
    return x, y, expected


async def test_a_lost_disk_does_not_vote_until_caught_up(cluster: Cluster) -> None:
    c = cluster
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
    await _append_all(c, "c", 2, expected)
    for node in (xnode, m2, c.live[y].node):
        await c.until(lambda n=node: n.commit_offset == len(expected), "every member commits")
        assert node.read_committed() == bytes(expected)
    # X is caught up: a voter again, and its mark is gone (a restart finds it a voter).
    await c.until(lambda: not xnode.member.lost_state, "X votes again")
    await c.until(lambda: read_mark(c.data_dir(x) / "quorum" / J) is None, "mark removed")


async def test_with_the_marking_disabled_the_acknowledged_appends_are_lost(
    cluster: Cluster,
) -> None:
    """The scenario's power: X's node built without its joiner (as before) votes with its empty
    log, and X and m2 elect m2: the next append lands where B began."""
    c = cluster
    _, _, expected = await _lose_x_while_y_down(c, mark_lost=False)
    a_end = expected.index(b"b0;")
    begin, _ = await c.append(b"after;")
    assert begin == a_end < len(expected)


async def test_a_restart_before_catching_up_stays_lost(cluster: Cluster) -> None:
    c = cluster
    x, _, _ = await _lose_x_while_y_down(c, mark_lost=True)
    await c.until(lambda: c.live[x].node.joined.is_set(), "X joined")
    await c.kill(x)  # before any leader caught it up: its log file now exists
    assert (c.data_dir(x) / "quorum" / J / "log").stat().st_size > 0
    xnode = await c.start(x)
    await c.until(lambda: xnode.joined.is_set(), "X joined again")
    assert xnode.join_decision is not None and xnode.join_decision.lost
    assert xnode.member.lost_state


async def test_two_lost_disks_block_the_election_with_a_reason(cluster: Cluster) -> None:
    c = cluster
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


async def test_a_fresh_journal_elects_with_a_late_starter(cluster: Cluster) -> None:
    """Members joining a fresh journal are not lost, the late one included (its new log is not
    a lost disk: it never joined), and the first election does not wait for it."""
    c = cluster
    await c.start("m0")
    await c.start("m1")
    expected = bytearray()
    await _append_all(c, "early", 2, expected)
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
