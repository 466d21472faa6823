"""A `gazette serve` process restarted on its own data directory loses nothing it acknowledged
(issue #12): after kill -9 the acknowledged bytes of a journal whose fragment was not yet
persisted read back, and the next append lands at the old end; after SIGTERM the journal
continues at its persisted end. Torn commit records, content cut short and bytes past the
last commit (an append in flight) are recovered to the last good commit.

Each run applies the same journal spec (once the embedded keyspace persisted it, a change of
nothing but its revision), so that these tests hold on etcd's semantics too."""

from __future__ import annotations

import asyncio
import shutil
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.client.appender import append
from broker.client.list_apply import apply_journals, upsert
from broker.client.reader import Reader
from broker.client.retry_reader import RetryReader
from broker.client.route_cache import JournalClient
from broker.fragment.spool_dir import journal_dir_name
from broker.fragment.spool_record import decode_file, slot_bytes_min, slot_offset
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import IndexHasGreaterOffsetError, OffsetNotYetAvailableError
from tests.broker.serve_testkit import gazette_serve, stop_timeout_s
from tests.e2e.e2e_workload import fragment_files, stored_prefix

JOURNAL = "t/one"
STORE = "file:///fragments/"
ACKED = b"nineteen bytes here"
# Bound on a read of recovered content (the replica settles at its first pulse).
read_timeout_s = 30.0


def spec() -> pb.JournalSpec:
    return pb.JournalSpec(
        name=JOURNAL,
        replication=1,
        fragment=pb.JournalSpec.Fragment(
            length=1 << 20,
            compression_codec=pb.NONE,
            stores=[STORE],
            refresh_interval=Duration(seconds=30),
            flush_interval=Duration(seconds=3600),  # Nothing is persisted by time.
        ),
    )


@asynccontextmanager
async def serving(root: Path, *args: str) -> AsyncIterator[tuple[JournalClient, object]]:
    """A broker on `root` with the journal (re-)applied; yields its client and process."""
    with gazette_serve(root, *args) as (port, proc):
        client = JournalClient(f"http://127.0.0.1:{port}")
        try:
            await apply_journals(client, [upsert(spec(), expect_mod_revision=-1)])
            yield client, proc
        finally:
            await client.close()


@contextmanager
def root_dir(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "fragments").mkdir()
    yield tmp_path


async def commit(client: JournalClient, data: bytes) -> tuple[int, int]:
    resp = await append(client, pb.AppendRequest(journal=JOURNAL), data)
    return resp.commit.begin, resp.commit.end


async def read_exactly(client: JournalClient, length: int, journal: str = JOURNAL) -> bytes:
    """`journal`'s first `length` bytes, waiting for them (a blocking read)."""
    reader = RetryReader(client, pb.ReadRequest(journal=journal, offset=0, block=True))
    out = bytearray()
    try:
        async with asyncio.timeout(read_timeout_s):
            while len(out) < length:
                chunk = await reader.read_chunk()
                assert chunk.offset == len(out)
                out += chunk.content
    finally:
        await reader.close()
    return bytes(out)


def kill9(proc: object) -> None:
    proc.kill()  # type: ignore[attr-defined]
    proc.wait(timeout=stop_timeout_s)  # type: ignore[attr-defined]


def sigterm(proc: object) -> int:
    proc.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
    return int(proc.wait(timeout=stop_timeout_s))  # type: ignore[attr-defined]


def stored(root: Path) -> bytes:
    return stored_prefix(fragment_files(root / "fragments", JOURNAL))


def spool_files(root: Path) -> Path:
    return root / "spools" / journal_dir_name(JOURNAL)


async def test_kill9_then_restart_reads_back_acknowledged_bytes_and_continues_at_the_end(
    tmp_path: Path,
) -> None:
    with root_dir(tmp_path) as root:
        async with serving(root) as (client, proc):
            assert await commit(client, ACKED) == (0, 19)
            kill9(proc)
        assert stored(root) == b""  # Only the spool held them.

        async with serving(root) as (client, proc):
            assert await read_exactly(client, 19) == ACKED
            assert await commit(client, b"hello") == (19, 24)
            assert await read_exactly(client, 24) == ACKED + b"hello"
            assert sigterm(proc) == 0
        # Persisted once, each offset by exactly one fragment's bytes.
        assert stored(root) == ACKED + b"hello"


async def test_sigterm_then_restart_continues_at_the_persisted_end(tmp_path: Path) -> None:
    with root_dir(tmp_path) as root:
        async with serving(root) as (client, proc):
            assert await commit(client, b"abc") == (0, 3)
            assert sigterm(proc) == 0
        assert stored(root) == b"abc"
        # What is left is the record of the empty spool at 3: the journal's offset.
        assert sorted(p.name for p in spool_files(root).iterdir()) == ["0000000000000003.rec"]

        async with serving(root) as (client, proc):
            # No INDEX_HAS_GREATER_OFFSET: the spool continues at 3.
            assert await commit(client, b"defg") == (3, 7)
            assert sigterm(proc) == 0
        assert stored(root) == b"abcdefg"


@pytest.mark.parametrize("damage", ["in_flight", "torn_record", "short_content"])
async def test_a_damaged_spool_recovers_to_its_last_good_commit(
    tmp_path: Path, damage: str
) -> None:
    with root_dir(tmp_path) as root:
        async with serving(root) as (client, proc):
            # The journal's first content is rolled at once (to be persisted promptly): the
            # open fragment is [6, 17), of two commits.
            assert await commit(client, b"first ") == (0, 6)
            assert await commit(client, b"second") == (6, 12)
            assert await commit(client, b"third") == (12, 17)
            kill9(proc)
        directory = spool_files(root)
        content = directory / "0000000000000006.spool"
        assert content.read_bytes() == b"secondthird"
        if damage == "in_flight":
            # What an append streaming when the broker died leaves: bytes past the commit.
            with content.open("ab") as f:
                f.write(b"never committed")
            good = b"first secondthird"
        elif damage == "torn_record":
            # The newest commit's slot torn by a power cut: the previous commit stands.
            record = directory / "0000000000000006.rec"
            data = bytearray(record.read_bytes())
            newest = decode_file(bytes(data))[0]
            data[slot_offset(newest.seq, slot_bytes_min) + 20] ^= 0xFF
            record.write_bytes(bytes(data))
            good = b"first second"
        else:
            # Content the OS lost (a power cut without --fsync): the previous commit holds.
            content.write_bytes(content.read_bytes()[:8])
            good = b"first second"

        async with serving(root) as (client, proc):
            assert await read_exactly(client, len(good)) == good
            end = len(good)
            assert await commit(client, b"next") == (end, end + 4)
            assert sigterm(proc) == 0
        assert stored(root) == good + b"next"


async def test_a_lost_data_directory_still_needs_reset_head(tmp_path: Path) -> None:
    with root_dir(tmp_path) as root:
        async with serving(root) as (client, proc):
            assert await commit(client, b"abc") == (0, 3)
            assert sigterm(proc) == 0
        shutil.rmtree(root / "spools")  # Every replica lost its spools: nothing knows 3.

        async with serving(root) as (client, proc):
            # Gazette's answer stands: an operator must confirm the store's end.
            with pytest.raises(IndexHasGreaterOffsetError):
                await commit(client, b"defg")
            resp = await append(client, pb.AppendRequest(journal=JOURNAL, offset=3), b"defg")
            assert (resp.commit.begin, resp.commit.end) == (3, 7)
            assert sigterm(proc) == 0
        assert stored(root) == b"abcdefg"


async def test_a_journal_without_a_store_keeps_only_its_open_fragment(tmp_path: Path) -> None:
    """README, "Data directory": with no fragment store, a completed fragment lives only as long
    as the broker process (as in Gazette). A journal's first append completes a fragment of its
    own (Gazette rolls a journal's first write at the next append), so after kill -9 the
    restarted broker serves the journal from the end of that append: offset 0 is a hole."""
    no_store = spec()
    del no_store.fragment.stores[:]
    with gazette_serve(tmp_path) as (port, proc):
        client = JournalClient(f"http://127.0.0.1:{port}")
        try:
            await apply_journals(client, [upsert(no_store)])
            assert await commit(client, b"first\n") == (0, 6)
            assert await commit(client, b"second\n") == (6, 13)
            kill9(proc)
        finally:
            await client.close()

    with gazette_serve(tmp_path) as (port, proc):
        client = JournalClient(f"http://127.0.0.1:{port}")
        try:
            await apply_journals(client, [upsert(no_store, expect_mod_revision=-1)])
            resp = await append(client, pb.AppendRequest(journal=JOURNAL), b"third\n")
            assert (resp.commit.begin, resp.commit.end) == (13, 19)
            reader = Reader(client, pb.ReadRequest(journal=JOURNAL, offset=0, block=False))
            with pytest.raises(OffsetNotYetAvailableError):
                await reader.read_chunk()
            await reader.close()
            reader = Reader(client, pb.ReadRequest(journal=JOURNAL, offset=6, block=True))
            content = bytearray()
            async with asyncio.timeout(read_timeout_s):
                while len(content) < 13:
                    chunk = await reader.read_chunk()
                    assert chunk.offset == 6 + len(content)
                    content += chunk.content
            await reader.close()
            assert content == b"second\nthird\n"
        finally:
            await client.close()
