"""What the benchmark scripts share: the machine's raw limits, and the brokers they measure.

- Raw limits, measured in the same run as the figures they are compared with (a shared
  machine's speed varies from run to run): ``sha1_bytes_s`` (the fragment-naming hash).
- ``in_process_broker``: one broker (R=1) in this process, on an embedded keyspace with its own
  allocator, the given journals assigned to it; yields a client of it.
- ``gazette_serve`` (serve_process.py): a ``gazette serve`` process, as a user runs it.
- ``free_port``: a loopback port for a server the script starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Sequence

from serve_process import ServeProcess, assign_journals, gazette_serve, process_cpu_s

from broker import client
from broker.allocator import MemberId, broker_is_consistent
from broker.allocator import serve as allocate
from broker.fragment.stores.registry import new_registry
from broker.keyspace.embedded import EmbeddedBackend
from broker.protocol import protocol_pb2 as pb
from broker.server import Broker, BrokerConfig
from broker.testing.ports import free_port

__all__ = [
    "ServeProcess",
    "assign_journals",
    "free_port",
    "gazette_serve",
    "in_process_broker",
    "process_cpu_s",
    "sha1_bytes_s",
]

# The block hashed by sha1_bytes_s.
_SHA1_BLOCK = b"\x5a" * (1 << 20)


def sha1_bytes_s(seconds: float) -> float:
    """SHA1 over 1 MiB blocks for about ``seconds``: bytes hashed per second."""
    h = hashlib.sha1()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        h.update(_SHA1_BLOCK)
        n += 1
    return n * len(_SHA1_BLOCK) / (time.perf_counter() - t0)


@contextlib.asynccontextmanager
async def in_process_broker(
    config: BrokerConfig, specs: Sequence[pb.JournalSpec]
) -> AsyncIterator[client.JournalClient]:
    """A broker of ``config`` on an embedded keyspace in this process, with an allocator, and
    ``specs`` (named bench/...) created and assigned to it: a client of it. Its fragment stores
    are ``file:///`` URLs of the whole file system."""
    backend = EmbeddedBackend()
    broker = Broker(backend, config, stores=new_registry(file_root="/"))
    await broker.start()
    member = MemberId(config.zone, config.suffix)
    allocator = asyncio.create_task(
        allocate(backend, broker.ks, member, is_consistent=broker_is_consistent)
    )
    c = client.JournalClient(broker.endpoint)
    try:
        await assign_journals(c, specs)
        yield c
    finally:
        await c.channels.close()
        allocator.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await allocator
        await broker.stop()
        await backend.close()
