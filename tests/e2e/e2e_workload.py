"""Workloads and checks shared by the process-level tests: journal specs, concurrent appenders of
self-describing records, whole-journal reads, and verification of persisted fragment files.

Records are lines ``<writer>:<seq>:<journal>:<padding>\\n``, unique per (writer, seq), so that a
journal's content can be checked record by record: every committed append is found whole at
the offsets its commit named, no line is torn, and duplicates (an append retried after a lost
response) are counted.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.client.appender import append
from broker.client.retry_reader import RetryReader
from broker.client.route_cache import ChannelPool, JournalClient
from broker.fragment.stores.file_store import PARTIAL_PREFIX
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import OffsetNotYetAvailableError
from broker.testing.process_cluster import BrokerProcess, ProcessCluster
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES

requires_etcd = pytest.mark.skipif(
    shutil.which("etcd") is None, reason="etcd not installed: run `make system-deps`"
)

# Four brokers in two zones: a journal of replication 3 keeps both zones after losing any one.
FOUR_BROKERS = [
    ("zone-a", "broker-a1"),
    ("zone-a", "broker-a2"),
    ("zone-b", "broker-b1"),
    ("zone-b", "broker-b2"),
]

# A writer whose append failed waits this long before its next one.
failure_pause_s = 0.05

RECORD = re.compile(rb"(\d{2}):(\d{6}):([a-z0-9/-]+):(x*)\n")


def gazctl(
    *args: str, stdin: str = "", env: dict[str, str] | None = None, timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """``gazctl <args>`` as a process, its output as text (not checked: the caller looks at the
    exit code and stderr)."""
    return subprocess.run(
        [sys.executable, "-m", "broker.cli.gazctl", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout_s,
        check=False,
    )


def journal_spec(
    name: str, replication: int, store: str, *, length: int = 1 << 20, codec: int = pb.GZIP
) -> pb.JournalSpec:
    return pb.JournalSpec(
        name=name,
        replication=replication,
        fragment=pb.JournalSpec.Fragment(
            length=length,
            compression_codec=codec,  # type: ignore[arg-type]
            stores=[store],
            refresh_interval=Duration(seconds=1),
        ),
    )


async def apply_json_journals(cluster: ProcessCluster, names: Sequence[str]) -> None:
    """JSON-lines journals (replication 1, uncompressed: a consumer's source and output),
    applied and ready."""
    specs = [journal_spec(name, 1, cluster.store_url, codec=pb.NONE) for name in names]
    for spec in specs:
        spec.labels.CopyFrom(labels.label_set([(labels.CONTENT_TYPE, CONTENT_TYPE_JSON_LINES)]))
    await cluster.apply(specs)
    await cluster.wait_until(cluster.journals_ready(list(names), 1))


def record(writer: int, seq: int, journal: str, padding: int = 40) -> bytes:
    return f"{writer:02d}:{seq:06d}:{journal}:{'x' * padding}\n".encode()


@dataclass(frozen=True)
class Committed:
    journal: str
    begin: int
    end: int
    data: bytes


@dataclass
class Writers:
    """``count`` concurrent appenders, round-robin over ``journals``, each through ``client``
    with ``append()``'s retries (``attempts_max``). Successes and failures are recorded."""

    client: JournalClient
    journals: Sequence[str]
    count: int
    attempts_max: int = 10
    committed: list[Committed] = field(default_factory=list)
    failed: list[tuple[str, bytes, BaseException]] = field(default_factory=list)
    # Attempts that failed and were retried by append(): an append whose response was lost may
    # have committed anyway, so only a retry can explain a record found twice.
    retries: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _progress: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run(w)) for w in range(self.count)]

    async def _run(self, writer: int) -> None:
        seq = 0
        while not self._stop.is_set():
            journal = self.journals[(writer + seq) % len(self.journals)]
            data = record(writer, seq, journal)
            seq += 1
            try:
                resp = await append(
                    self.client,
                    pb.AppendRequest(journal=journal),
                    data,
                    attempts_max=self.attempts_max,
                    sleep=self._before_retry,
                )
            except Exception as err:
                self.failed.append((journal, data, err))
                # Pace a writer whose appends fail at once (a replica gone until its lease
                # expires), so that it does not spin.
                await asyncio.sleep(failure_pause_s)
            else:
                self.committed.append(Committed(journal, resp.commit.begin, resp.commit.end, data))
            progress, self._progress = self._progress, asyncio.Event()
            progress.set()

    async def _before_retry(self, delay_s: float) -> None:
        self.retries += 1
        await asyncio.sleep(delay_s)

    async def wait_for(self, successes: int, timeout_s: float = 30.0) -> None:
        """Wait until ``successes`` appends in all have committed."""
        async with asyncio.timeout(timeout_s):
            while len(self.committed) < successes:
                await self._progress.wait()

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


async def read_journal(client: JournalClient, journal: str, timeout_s: float = 30.0) -> bytes:
    """The journal's whole content, from offset 0 to its write head (no offset jumps)."""
    reader = RetryReader(client, pb.ReadRequest(journal=journal, offset=0, block=False))
    out = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    chunk = await reader.read_chunk()
                except OffsetNotYetAvailableError:
                    break
                assert chunk.offset == len(out), f"{journal}: read jumped to {chunk.offset}"
                out += chunk.content
    finally:
        await reader.close()
    assert reader.jumps == 0
    return bytes(out)


def check_records(journal: str, content: bytes, committed: Sequence[Committed]) -> Counter[bytes]:
    """Assert ``content`` is whole records only and holds every committed one of ``journal``
    at its offsets; returns how often each record occurs."""
    pos = 0
    counts: Counter[bytes] = Counter()
    while pos < len(content):
        m = RECORD.match(content, pos)
        assert m is not None, f"{journal}: torn or foreign bytes at offset {pos}"
        assert m.group(3).decode() == journal, f"{journal}: a record of {m.group(3)!r}"
        counts[m.group(0)] += 1
        pos = m.end()
    for c in committed:
        if c.journal == journal:
            assert content[c.begin : c.end] == c.data, f"{journal}: commit [{c.begin}, {c.end})"
    return counts


@dataclass(frozen=True)
class FragmentFile:
    begin: int
    end: int
    digest: str
    content: bytes


def fragment_files(fragments_dir: Path, journal: str) -> list[FragmentFile]:
    """The journal's persisted fragment files, decompressed and checked against their names
    (begin and end offsets, SHA1 of the uncompressed content), sorted by offsets. Files still
    being written (by brokers that are running) are left out."""
    out: list[FragmentFile] = []
    directory = fragments_dir / journal
    for path in sorted(directory.iterdir()) if directory.exists() else []:
        if path.name.startswith(PARTIAL_PREFIX):
            continue  # Being written by a running broker: linked into place once complete.
        name, _, ext = path.name.partition(".")
        begin_hex, end_hex, digest = name.split("-")
        raw = path.read_bytes()
        data = gzip.decompress(raw) if ext == "gz" else raw
        assert ext in ("gz", "raw"), path
        begin, end = int(begin_hex, 16), int(end_hex, 16)
        assert end - begin == len(data), f"{path.name}: holds {len(data)} bytes"
        expected = hashlib.sha1(data).hexdigest() if data else "0" * 40
        assert digest == expected, f"{path.name}: content SHA1 is {expected}"
        out.append(FragmentFile(begin, end, digest, data))
    return sorted(out, key=lambda f: (f.begin, f.end))


def stored_prefix(files: Sequence[FragmentFile]) -> bytes:
    """The content the files cover contiguously from offset 0. Files may overlap (replicas that
    rolled at different offsets), but wherever they do, their bytes must agree."""
    out = bytearray()
    for f in files:
        if f.begin > len(out):
            break
        overlap = out[f.begin : f.end]
        assert f.content[: len(overlap)] == overlap, f"[{f.begin}, {f.end}) disagrees"
        out += f.content[len(overlap) :]
    return bytes(out)


def by_journal(committed: Sequence[Committed]) -> dict[str, list[Committed]]:
    out: dict[str, list[Committed]] = {}
    for c in committed:
        out.setdefault(c.journal, []).append(c)
    return out


def most(items: Sequence[str], key: Callable[[str], str | None]) -> str:
    """The most common ``key(item)`` (ties: the first seen)."""
    counts = Counter(k for k in map(key, items) if k is not None)
    return counts.most_common(1)[0][0]


async def journals_and_victim(
    cluster: ProcessCluster, names: Sequence[str]
) -> tuple[BrokerProcess, list[str], JournalClient]:
    """Create ``names`` (replication 3, over both zones) and pick the broker a fault test takes
    down: the primary of the most of them. Returns it, the journals it serves, and a client
    whose default broker is another."""
    await cluster.apply(journal_spec(n, 3, cluster.store_url) for n in names)
    await cluster.wait_until(cluster.journals_ready(names, 3, zones_min=2))
    victim = cluster.broker(most(names, lambda n: p.suffix if (p := cluster.primary(n)) else None))
    held = [n for n in names if victim.id in cluster.route(n).members]
    client = cluster.client(next(b for b in cluster.brokers if b is not victim))
    return victim, held, client


async def count_duplicates(
    client: JournalClient, names: Sequence[str], committed: dict[str, list[Committed]]
) -> int:
    """Check that each journal holds every record committed to it (``check_records``), and
    return how many records are there more than once in all."""
    duplicates = 0
    for journal in names:
        content = await read_journal(client, journal)
        counts = check_records(journal, content, committed.get(journal, []))
        assert len(counts) == len(committed.get(journal, []))
        duplicates += sum(n - 1 for n in counts.values())
    return duplicates


async def replica_head(channels: ChannelPool, b: BrokerProcess, journal: str) -> int:
    """The write head of ``journal`` as broker ``b`` (a member of its route) knows it: a
    metadata-only read at offset -1 that ``b`` answers from its own index, never proxied."""
    request = pb.ReadRequest(
        journal=journal, offset=-1, block=False, do_not_proxy=True, metadata_only=True
    )
    responses = [r async for r in channels.stub(b.endpoint).Read(request)]
    assert len(responses) == 1, f"{b.suffix}: {responses}"
    resp = responses[0]
    assert resp.header.process_id == b.id, f"{b.suffix}: answered by {resp.header.process_id}"
    assert resp.status == pb.OFFSET_NOT_YET_AVAILABLE, pb.Status.Name(resp.status)
    return resp.write_head


async def replica_content(
    channels: ChannelPool, b: BrokerProcess, journal: str, offset: int = 0, *, local: bool = False
) -> bytes:
    """``journal``'s content from ``offset`` to the write head, as broker ``b`` (a member of its
    route) serves it itself. With ``local``, a ``do_not_proxy`` read that must be served from
    ``b``'s own spool files (it fails on a fragment that is only in the store); otherwise
    persisted fragments are read by ``b`` from the store."""
    request = pb.ReadRequest(journal=journal, offset=offset, block=False, do_not_proxy=local)
    out = bytearray()
    head = -1
    async for resp in channels.stub(b.endpoint).Read(request):
        if resp.HasField("header"):
            assert resp.header.process_id == b.id, f"{b.suffix}: proxied to another broker"
        assert resp.offset == offset + len(out), f"{b.suffix}: read jumped to {resp.offset}"
        if resp.status == pb.OFFSET_NOT_YET_AVAILABLE:
            head = resp.write_head
            continue  # The last response: the broker ends the stream after it.
        assert resp.status == pb.OK, f"{b.suffix}: {pb.Status.Name(resp.status)}"
        if local and resp.HasField("fragment"):
            f = resp.fragment
            assert not resp.fragment_url, f"{b.suffix}: [{f.begin}, {f.end}) is not local"
        out += resp.content
    assert head == offset + len(out), f"{b.suffix}: read ended at {offset + len(out)} != {head}"
    return bytes(out)
