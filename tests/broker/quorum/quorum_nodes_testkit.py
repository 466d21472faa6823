"""Quorum nodes of one journal as a broker hosts them, in-process: each on its own loopback
gRPC server and data directory (member log files, the broker's incarnation, member marks),
joining through the member registry, with the term register in an embedded keyspace. Nodes are
started and killed by name; a lost disk is its data directory deleted. The tests take a
`Cluster` from the `quorum_nodes` fixture (conftest.py)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from broker.keyspace.embedded import EmbeddedStore
from broker.quorum.errors import NotLeaderError
from broker.quorum_shell.journals import open_member_log
from broker.quorum_shell.member_dir import load_incarnation
from broker.quorum_shell.member_registry import MemberRegistry
from broker.quorum_shell.node import COORDINATOR_SUFFIX, QuorumNode, Register
from broker.quorum_shell.term_register import KeyspaceTermRegister
from broker.quorum_shell.transport import GrpcTransport, Receiver, deliver_handler

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
    journal_revision: int = JOURNAL_REVISION
    ports: dict[str, int] = field(default_factory=dict)
    live: dict[str, Node] = field(default_factory=dict)

    def data_dir(self, name: str) -> Path:
        return self.tmp / name

    def endpoints(self) -> dict[str, str]:
        return {n: f"http://127.0.0.1:{p}" for n, p in self.ports.items()}

    async def start(
        self,
        name: str,
        *,
        mark_lost: bool = True,
        ensemble: tuple[str, ...] = NAMES,
        unknown: frozenset[str] = frozenset(),
        register: Callable[[Register], Register] = lambda r: r,
    ) -> QuorumNode:
        """Start `name`'s node on its data directory. `mark_lost=False` builds it as brokers
        did before lost disks were marked: no joiner, so its member always votes. `ensemble`:
        the one its broker would start it with (its route). `unknown`: message types its
        server refuses as a broker of an earlier version, without them, does. `register`
        wraps its term register (faults between the node and etcd)."""
        server = grpc.aio.server()
        port = server.add_insecure_port(f"127.0.0.1:{self.ports.get(name, 0)}")
        self.ports[name] = port
        backend = self.store.connect()
        data_dir = str(self.data_dir(name))
        registry = MemberRegistry(backend, ROOT, J, self.journal_revision)
        log_file, joiner = open_member_log(data_dir, J, name, load_incarnation(data_dir), registry)
        transport = GrpcTransport(self.endpoints())
        node = QuorumNode(
            J,
            name,
            ensemble,
            register(KeyspaceTermRegister(backend, ROOT, J, ensemble, self.journal_revision)),
            transport,
            seed=len(self.ports),
            log_file=log_file,
            joiner=joiner if mark_lost else None,
        )

        def route(journal: str, to: str) -> Receiver | None:
            ok = journal == J and to.removesuffix(COORDINATOR_SUFFIX) == name
            return node.receive if ok else None

        server.add_generic_rpc_handlers([deliver_handler(route, unknown=unknown)])
        await server.start()
        for other in self.live.values():  # its port may be new to them
            other.transport.endpoints[name] = self.endpoints()[name]
        self.live[name] = Node(node, server, transport)
        await node.start()
        return node

    async def kill(self, name: str) -> None:
        await self.live.pop(name).kill()

    async def close(self) -> None:
        """Kill every live node (the end of a test)."""
        for name in list(self.live):
            await self.kill(name)

    def member_dir(self, name: str) -> Path:
        return self.data_dir(name) / "quorum" / J

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


async def append_all(c: Cluster, tag: str, count: int, expected: bytearray) -> None:
    """Append `count` records; each must land at exactly the end of `expected`."""
    for i in range(count):
        data = f"{tag}{i};".encode()
        begin, end = await c.append(data)
        assert (begin, end) == (len(expected), len(expected) + len(data)), tag
        expected += data
