"""Reader and RetryReader against a real Read RPC server on loopback (the broker's ReadAPI over a
FragmentIndex populated directly), including direct reads of file:// fragments by signed URL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker import metrics
from broker.client.reader import (
    Chunk,
    FragmentContentError,
    FragmentContentReader,
    FragmentIntegrityError,
    Reader,
)
from broker.client.retry_reader import RetryReader, backoff_s
from broker.client.route_cache import JournalClient
from broker.fragment import codecs, naming
from broker.fragment.codecs import CompressionCodec
from broker.fragment.stores.base import BytesReader
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import (
    JournalNotFoundError,
    NotJournalBrokerError,
    OffsetNotYetAvailableError,
)
from tests.broker.read_testkit import (
    FILE_STORE,
    JOURNAL,
    Replica,
    WatchedIndex,
    commit,
    env,
    persist,
    route_header,
)

STORE = FILE_STORE


async def drain(reader: Reader | RetryReader) -> list[Chunk]:
    return [chunk async for chunk in reader]


# --- Reader --------------------------------------------------------------------------------------


async def test_reader_streams_chunks_then_raises_at_the_head(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        commit(e.index, 0, b"0123456789")
        reader = Reader(e.client, pb.ReadRequest(journal=JOURNAL, offset=2))
        chunks = []
        with pytest.raises(OffsetNotYetAvailableError):
            while True:
                chunks.append(await reader.read_chunk())
        assert chunks == [Chunk(2, b"2345"), Chunk(6, b"6789")]
        assert reader.offset == 10
        # The latest metadata is the final answer: nothing yet at the head.
        assert reader.response.status == pb.OFFSET_NOT_YET_AVAILABLE
        assert (reader.response.offset, reader.response.write_head) == (10, 10)
        # The header's route was learned: later requests go straight to this broker.
        route = e.client.routes.get(JOURNAL)
        assert route is not None and list(route.endpoints) == [e.endpoint]


async def test_reader_keeps_the_header_past_later_metadata_responses(tmp_path: Path) -> None:
    """A broker sends the header with its first metadata response only: a read going on into
    the next fragment (or one persisted under it) gets later ones without it. `header` keeps
    the last one sent (found in CI: a test read `response.header` after a fragment was
    persisted under its read; a revision check reading it would see 0)."""
    async with env(tmp_path) as e:
        commit(e.index, 0, b"0123")
        commit(e.index, 4, b"4567")
        reader = Reader(e.client, pb.ReadRequest(journal=JOURNAL, offset=0, end_offset=8))
        assert await drain(reader) == [Chunk(0, b"0123"), Chunk(4, b"4567")]
        assert reader.response.fragment.begin == 4 and not reader.response.HasField("header")
        assert reader.header == route_header(e.endpoint)
        retrying = RetryReader(e.client, pb.ReadRequest(journal=JOURNAL, offset=0, end_offset=8))
        assert await drain(retrying) == [Chunk(0, b"0123"), Chunk(4, b"4567")]
        assert retrying.header == route_header(e.endpoint)


async def test_reader_stops_at_end_offset(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        commit(e.index, 0, b"0123456789")
        reader = Reader(e.client, pb.ReadRequest(journal=JOURNAL, offset=1, end_offset=7))
        assert await drain(reader) == [Chunk(1, b"1234"), Chunk(5, b"56")]
        assert reader.done and await reader.read() == b""


async def test_reader_follows_offset_jumps(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        await persist(e, 100, b"after a gap", CompressionCodec.NONE)
        # Stored hours ago: the index jumps a read over the hole before it at once.
        listed = await e.registry.get(FILE_STORE).list(JOURNAL)
        for fragment in listed:
            fragment.mod_time -= 7 * 3600
        e.index.replace_remote(listed)
        labels = {"journal": JOURNAL}

        def counted() -> tuple[float, float]:
            return (
                metrics.value_of("gazette_client_read_offset_jumps_total", labels),
                metrics.value_of("gazette_client_read_skipped_bytes_total", labels),
            )

        before = counted()
        # From offset 0: the journal's first content, wherever it begins (not a loss).
        reader = Reader(e.client, pb.ReadRequest(journal=JOURNAL, offset=0, end_offset=111))
        chunks = await drain(reader)
        assert chunks[0].offset == 100 and reader.jumps == 1
        assert b"".join(c.content for c in chunks) == b"after a gap"
        assert counted() == before
        # A probe of the write head reads nothing (not a loss either).
        probe = Reader(
            e.client, pb.ReadRequest(journal=JOURNAL, offset=5, block=False, metadata_only=True)
        )
        await drain(probe)
        assert counted() == before
        # From offset 5: [5, 100) was asked for and is gone. Counted in the process's metrics,
        # not only a log line.
        reader = Reader(e.client, pb.ReadRequest(journal=JOURNAL, offset=5, end_offset=111))
        chunks = await drain(reader)
        assert chunks[0].offset == 100 and reader.jumps == 1
        assert counted() == (before[0] + 1, before[1] + 95)


@pytest.mark.parametrize("via_registry", [False, True])
async def test_reader_reads_persisted_fragments_directly(
    tmp_path: Path, via_registry: bool
) -> None:
    content = b"".join(b"record %d\n" % i for i in range(1000))
    async with env(tmp_path) as e:
        await persist(e, 0, content, CompressionCodec.GZIP)
        reader = Reader(
            e.client,
            pb.ReadRequest(journal=JOURNAL, offset=5, do_not_proxy=True),
            registry=e.registry if via_registry else None,
        )
        chunks = await drain(reader)
        assert reader.response.fragment_url.startswith("file://")
        assert b"".join(c.content for c in chunks) == content[5:]
        # Read from the file, not through the broker (whose chunks are 4 bytes).
        assert len(chunks[0].content) > 4 and chunks[0].offset == 5
        assert reader.offset == len(content)


async def test_reader_raises_typed_statuses_and_grpc_errors(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        e.resolver.status = pb.JOURNAL_NOT_FOUND
        with pytest.raises(JournalNotFoundError, match="reading a/journal at offset 0"):
            await Reader(e.client, pb.ReadRequest(journal=JOURNAL)).read()
        with pytest.raises(ValueError, match="offset: must be >= -1"):
            await Reader(e.client, pb.ReadRequest(journal=JOURNAL, offset=-5)).read()


async def test_fragment_content_reader_checks_the_file_against_the_fragment() -> None:
    fragment = pb.Fragment(journal=JOURNAL, begin=10, end=20, compression_codec=pb.GZIP)

    async def read_all(stored: bytes) -> bytes:
        reader = FragmentContentReader(BytesReader(stored), fragment, 12)
        out = b""
        while piece := await reader.read():
            out += piece
        return out

    assert await read_all(codecs.compress(CompressionCodec.GZIP, b"0123456789")) == b"23456789"
    with pytest.raises(FragmentContentError, match="decodes to 5 of the fragment's 10 bytes"):
        await read_all(codecs.compress(CompressionCodec.GZIP, b"short"))
    with pytest.raises(FragmentContentError, match="more than the fragment's 10 bytes"):
        await read_all(codecs.compress(CompressionCodec.GZIP, b"far too long content"))
    with pytest.raises(FragmentContentError, match="gzip"):
        await read_all(b"not gzip at all")


# --- RetryReader -----------------------------------------------------------------------------------


async def test_retry_reader_resumes_on_another_replica(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        commit(e.index, 0, b"hello")
        reader = RetryReader(e.client, pb.ReadRequest(journal=JOURNAL, offset=0, block=True))
        assert await reader.read_chunk() == Chunk(0, b"hell")
        assert await reader.read_chunk() == Chunk(4, b"o")
        blocked = asyncio.ensure_future(reader.read_chunk())
        old = e.index
        await old.waiting.wait()
        # The replica goes away (its stream ends); the next one holds more of the journal.
        successor = WatchedIndex()
        commit(successor, 0, b"hello")
        commit(successor, 5, b" world")
        e.resolver.replica = Replica(successor)
        old.close()
        assert await blocked == Chunk(5, b" wor")
        assert await reader.read_chunk() == Chunk(9, b"ld")
        assert reader.restarts == 1
        await reader.close()


async def test_retry_reader_retries_an_unreachable_broker(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        commit(e.index, 0, b"abc")
        dead = JournalClient("http://127.0.0.1:1")  # Nothing listens there.
        slept: list[float] = []

        async def sleep(delay: float) -> None:
            # While we back off, the cluster tells us where the journal really is.
            slept.append(delay)
            dead.routes.update(JOURNAL, route_header(e.endpoint).route)

        reader = RetryReader(
            dead,
            pb.ReadRequest(journal=JOURNAL, offset=0, end_offset=3),
            sleep=sleep,
            jitter=lambda: 0.0,
        )
        assert b"".join(c.content for c in await drain(reader)) == b"abc"
        assert slept == [backoff_s(1)]
        await dead.close()


async def test_retry_reader_gives_up_after_attempts_max(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        e.resolver.status = pb.NOT_JOURNAL_BROKER  # Retriable, but it never converges.
        slept: list[float] = []

        async def sleep(delay: float) -> None:
            slept.append(delay)

        reader = RetryReader(
            e.client,
            pb.ReadRequest(journal=JOURNAL),
            attempts_max=4,
            sleep=sleep,
            jitter=lambda: 0.0,
        )
        with pytest.raises(NotJournalBrokerError):
            await reader.read()
        assert slept == [backoff_s(1), backoff_s(2), backoff_s(3)]
        assert len(e.resolver.calls) == 4


async def test_retry_reader_surfaces_non_retriable_answers(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        slept: list[float] = []

        async def sleep(delay: float) -> None:
            slept.append(delay)

        reader = RetryReader(e.client, pb.ReadRequest(journal=JOURNAL), sleep=sleep)
        with pytest.raises(OffsetNotYetAvailableError):
            await reader.read()  # Non-blocking, at the head: an answer, not a failure.
        e.resolver.status = pb.JOURNAL_NOT_FOUND
        with pytest.raises(JournalNotFoundError):
            await reader.read()
        # A just-created journal gets a few attempts to propagate first.
        assert len(slept) == 3
        assert len(e.resolver.calls) == 5


async def test_retry_reader_seek(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        commit(e.index, 0, b"0123456789")
        reader = RetryReader(e.client, pb.ReadRequest(journal=JOURNAL, end_offset=10))
        assert await reader.read_chunk() == Chunk(0, b"0123")
        await reader.seek(8)
        assert await drain(reader) == [Chunk(8, b"89")]


async def test_retry_reader_metadata_only_answers_once(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        commit(e.index, 0, b"0123456789")
        reader = RetryReader(
            e.client, pb.ReadRequest(journal=JOURNAL, offset=4, metadata_only=True)
        )
        assert await reader.read_chunk() == Chunk(4, b"")
        assert (reader.response.fragment.end, reader.response.write_head) == (10, 10)
        assert len(e.resolver.calls) == 1


@pytest.mark.parametrize("whole_bytes_max", [1 << 20, 8], ids=["whole", "streamed"])
async def test_fragment_content_reader_verifies_whole_or_as_it_streams(
    whole_bytes_max: int,
) -> None:
    content = b"0123456789" * 3
    fragment = pb.Fragment(
        journal=JOURNAL,
        begin=0,
        end=len(content),
        sum=naming.content_sum(content),
        compression_codec=pb.NONE,
        backing_store=STORE,
    )
    other = content[:-1] + b"!"  # Same length; differs in its last byte.
    reader = FragmentContentReader(
        BytesReader(other),
        fragment,
        4,
        chunk_bytes_max=10,
        verify_whole_bytes_max=whole_bytes_max,
        store=STORE,
    )
    got = b""
    with pytest.raises(FragmentIntegrityError, match=r"not the .* of its name") as caught:
        while piece := await reader.read():
            got += piece
    if whole_bytes_max >= len(content):
        # Small enough to verify before handing anything out: not one byte was delivered.
        assert got == b"" and caught.value.delivered == 0
    else:
        # Streamed: whole pieces before the end were delivered (the last one, short of a whole
        # piece, waits for the end of the file), and the error says how many.
        delivered = caught.value.delivered
        assert got == other[4 : 4 + delivered] and 0 < delivered < len(content) - 4
        assert f"({delivered} bytes of it were already delivered" in str(caught.value)
    assert not reader.verified  # It failed verification.
