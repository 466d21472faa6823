"""``gazette demo``: the embedded default, end to end, in one process.

An in-process keyspace (etcd's semantics, no etcd needed), a broker serving gRPC on loopback,
the allocator assigning journals to it, and a ``file://`` fragment store under the data
directory. The demo creates a journal, appends to it through the gRPC client, reads the content
back, and stops the broker, which persists its fragments: the fragment files it prints are the
same files a Gazette broker would write.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path

from google.protobuf.duration_pb2 import Duration

from broker import client
from broker import logging as gazette_logging
from broker.allocator import MemberId, broker_is_consistent
from broker.allocator import serve as allocate
from broker.fragment.naming import parse_content_name
from broker.fragment.stores.registry import new_registry
from broker.keyspace.embedded import EmbeddedBackend
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import OffsetNotYetAvailableError
from broker.server import Broker, BrokerConfig

JOURNAL = "demo/greetings"
LINES = [b"hello, gazette\n", b"appends are atomic\n", b"and replicated before they succeed\n"]
# The demo waits at most this long for the allocator to assign the journal.
assign_wait_s = 30.0


def _spec(store_url: str) -> pb.JournalSpec:
    return pb.JournalSpec(
        name=JOURNAL,
        replication=1,
        labels=pb.LabelSet(labels=[pb.Label(name="content-type", value="text/plain")]),
        fragment=pb.JournalSpec.Fragment(
            length=1 << 20,
            compression_codec=pb.ZSTANDARD,
            stores=[store_url],
            refresh_interval=Duration(seconds=30),
        ),
    )


async def _wait_assigned(c: client.JournalClient) -> pb.Route:
    """The journal's route once it has a primary (watched, not polled)."""
    async with asyncio.timeout(assign_wait_s):
        async for snapshot in client.watch_journals(c, f"name={JOURNAL}"):
            for j in snapshot.journals:
                if j.route.primary >= 0:
                    return j.route
    raise RuntimeError("journal listing ended before the journal was assigned")


async def _write_head(c: client.JournalClient) -> int:
    """The end of the journal's persisted fragments (0 for a new journal)."""
    listing = await client.list_all_fragments(c, pb.FragmentsRequest(journal=JOURNAL))
    return max((f.spec.end for f in listing.fragments), default=0)


async def run(data_dir: Path) -> int:
    fragments = (data_dir / "fragments").resolve()
    fragments.mkdir(parents=True, exist_ok=True)
    backend = EmbeddedBackend()
    broker = Broker(
        backend,
        BrokerConfig(zone="local", suffix="demo", spool_dir=str(data_dir)),
        stores=new_registry(file_root="/"),
    )
    await broker.start()
    print(f"broker serving on {broker.endpoint} (embedded keyspace)")
    allocator = asyncio.create_task(
        allocate(backend, broker.ks, MemberId("local", "demo"), is_consistent=broker_is_consistent)
    )
    c = client.JournalClient(broker.endpoint)
    start = 0
    try:
        await client.apply_journals(c, [client.upsert(_spec(f"file://{fragments}/"))])
        route = await _wait_assigned(c)
        print(f"created {JOURNAL}; primary is {route.members[route.primary].suffix}")

        start = await _write_head(c)
        if start:
            # An earlier run left fragments in the store. The broker will not re-write their
            # offsets (INDEX_HAS_GREATER_OFFSET) unless told explicitly where to continue:
            # exactly what an operator does, here with the head the store shows.
            print(f"continuing after {start} bytes persisted by an earlier run")
        for i, line in enumerate(LINES):
            request = pb.AppendRequest(journal=JOURNAL, offset=start if i == 0 else 0)
            response = await client.append(c, request, line)
            print(f"appended [{response.commit.begin:>3}, {response.commit.end:>3}) {line!r}")

        reader = client.RetryReader(c, pb.ReadRequest(journal=JOURNAL, offset=start, block=False))
        content = b""
        with contextlib.suppress(OffsetNotYetAvailableError):
            while chunk := await reader.read():
                content += chunk
        print(f"read back {len(content)} bytes:")
        sys.stdout.write(content.decode())
        if content != b"".join(LINES):
            print("demo: content read back differs from what was appended", file=sys.stderr)
            return 1
    finally:
        await c.channels.close()
        allocator.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await allocator
        await broker.stop()  # Persists the completed fragments to the store.
        await backend.close()

    # The journal's fragments (the store root also holds the brokers' health-check object).
    persisted = sorted(
        p.relative_to(fragments) for p in (fragments / JOURNAL).rglob("*") if p.is_file()
    )
    print(f"fragments persisted under {fragments}:")
    for path in persisted:
        print(f"  {path}")
    spans = [parse_content_name(p.name)[:2] for p in persisted]
    covered = sum(end - begin for begin, end in spans)
    if covered != start + len(content):
        print(f"demo: fragments cover {covered} of {start + len(content)} bytes", file=sys.stderr)
        return 1
    return 0


def main(data_dir: str | None = None) -> int:
    gazette_logging.configure("console", os.environ.get("GAZETTE_LOG_LEVEL", "warning"))
    path = Path(data_dir or os.environ.get("GAZETTE_DEMO_DIR", "demo-data"))
    return asyncio.run(run(path))
