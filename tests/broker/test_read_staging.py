"""StagingArea (broker/read_staging.py): a stored fragment too long to verify in memory is
decoded into a scratch file and verified whole before a read gets any of it; reads of one
fragment share one copy; the area's room is bounded (no room: no claim, the read verifies in
a first pass instead); nothing is kept past its last read, or after a failure."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Callable

import pytest
from broker_testkit import wait_until

from broker.fragment import naming
from broker.fragment.spool_file import MemorySpoolFile, SpoolFile
from broker.fragment.stores.base import BytesReader, FragmentReader
from broker.fragment.verify import FragmentIntegrityError, IntegrityFailure
from broker.metrics import value_of
from broker.protocol import protocol_pb2 as pb
from broker.read_staging import (
    DiskSpace,
    StagedCopy,
    StagingArea,
    StagingError,
    stage_bytes_max_default,
)
from broker.serve_cli import _parse_args

MiB = 1 << 20
WAIT_S = 10.0


def content_of(size: int, seed: int = 0) -> bytes:
    line = bytes((ord("a") + (seed + i) % 26) for i in range(63)) + b"\n"
    return (line * (size // len(line) + 1))[:size]


def fragment_of(content: bytes, begin: int = 0, codec: int = pb.NONE) -> pb.Fragment:
    return pb.Fragment(
        journal="staging/journal",
        begin=begin,
        end=begin + len(content),
        sum=naming.content_sum(content),
        compression_codec=codec,
        backing_store="memory://bucket/",
    )


class Opener:
    """Opens a stored file of `stored` bytes, counting opens; with `gate`, the first read waits
    for it (a slow store) and reports that reading began."""

    def __init__(self, stored: bytes, gate: asyncio.Event | None = None) -> None:
        self.stored = stored
        self.gate = gate
        self.opens = 0
        self.closed = 0
        self.reading = asyncio.Event()
        self.closed_event = asyncio.Event()

    async def __call__(self) -> FragmentReader:
        self.opens += 1
        return _Gated(self)


class _Gated(FragmentReader):
    def __init__(self, opener: Opener) -> None:
        self._opener = opener
        self._inner = BytesReader(opener.stored)

    async def read(self, size: int = 1 << 16) -> bytes:
        self._opener.reading.set()
        if self._opener.gate is not None:
            await self._opener.gate.wait()
        return await self._inner.read(size)

    async def aclose(self) -> None:
        self._opener.closed += 1
        self._opener.closed_event.set()
        await self._inner.aclose()


def staged(area: StagingArea, fragment: pb.Fragment, opener: Opener) -> StagedCopy:
    claim = area.claim(fragment, opener)
    assert claim is not None, "no room"
    return claim


def new_memory_file() -> SpoolFile:
    return MemorySpoolFile()


async def read_whole(file: SpoolFile, fragment: pb.Fragment) -> bytes:
    return file.pread(fragment.end - fragment.begin, 0)


@pytest.mark.parametrize("codec", [pb.NONE, pb.GZIP], ids=["NONE", "GZIP"])
async def test_a_large_fragment_is_staged_whole_and_verified(codec: int) -> None:
    content = content_of(3 * MiB)
    fragment = fragment_of(content, begin=1000, codec=codec)
    stored = gzip.compress(content) if codec == pb.GZIP else content
    area = StagingArea(new_memory_file)
    before = value_of("gazette_read_verified_whole_fragments_total", {"how": "staged"})
    async with staged(area, fragment, Opener(stored)) as file:
        assert await read_whole(file, fragment) == content
        assert area.used == len(content)
        kept = file
    assert kept.closed and area.used == 0
    assert value_of("gazette_read_verified_whole_fragments_total", {"how": "staged"}) == before + 1


async def test_a_fragment_damaged_in_its_middle_serves_no_byte() -> None:
    content = content_of(3 * MiB)
    fragment = fragment_of(content)
    # One byte changed half-way: as long as the fragment, valid framing, other content.
    damaged = bytearray(content)
    damaged[len(content) // 2] ^= 0x20
    opener = Opener(bytes(damaged))
    area = StagingArea(new_memory_file)
    entered = False
    with pytest.raises(FragmentIntegrityError) as caught:
        async with staged(area, fragment, opener):
            entered = True
    assert not entered
    err = caught.value
    assert err.failure is IntegrityFailure.SHA1_MISMATCH and err.delivered == 0
    assert "delivered" not in str(err)
    assert area.used == 0 and opener.closed == 1
    # A failure is not kept: the next read opens the store again (and fails again).
    with pytest.raises(FragmentIntegrityError):
        async with staged(area, fragment, opener):
            pass
    assert opener.opens == 2


async def test_no_room_no_claim_and_room_comes_back_when_a_copy_closes() -> None:
    a, b = content_of(2 * MiB, 1), content_of(2 * MiB, 2)
    fa, fb = fragment_of(a), fragment_of(b, begin=len(a))
    area = StagingArea(new_memory_file, bytes_max=3 * MiB)
    # Longer than the whole room: never a claim.
    assert area.claim(fragment_of(content_of(3 * MiB + 1)), Opener(b"")) is None
    assert StagingArea(new_memory_file, bytes_max=0).claim(fa, Opener(a)) is None
    opener_b = Opener(b)
    async with staged(area, fa, Opener(a)):
        assert area.used == len(a)
        assert area.claim(fb, opener_b) is None  # No room while a's copy is held.
        # A read of a fragment already staged joins its copy, room or not.
        async with staged(area, fa, Opener(a)) as file:
            assert await read_whole(file, fa) == a
    assert area.used == 0 and opener_b.opens == 0
    async with staged(area, fb, opener_b) as file:
        assert await read_whole(file, fb) == b


async def test_reads_of_one_fragment_share_one_copy() -> None:
    content = content_of(2 * MiB)
    fragment = fragment_of(content)
    gate = asyncio.Event()
    opener = Opener(content, gate)
    area = StagingArea(new_memory_file)
    first_in, first_out, first_left = asyncio.Event(), asyncio.Event(), asyncio.Event()
    files: list[SpoolFile] = []

    async def first() -> None:
        async with staged(area, fragment, opener) as file:
            files.append(file)
            first_in.set()
            await first_out.wait()
        first_left.set()

    async def second() -> bytes:
        async with staged(area, fragment, opener) as file:
            files.append(file)
            await first_in.wait()
            first_out.set()
            await first_left.wait()
            # The first read let go of the copy: it stays open for this one.
            assert not file.closed
            return await read_whole(file, fragment)

    # Created together: the second joins the staging the first started (tasks start in order).
    tasks = [asyncio.create_task(first()), asyncio.create_task(second())]
    async with asyncio.timeout(WAIT_S):
        await opener.reading.wait()
        gate.set()
        _, got = await asyncio.gather(*tasks)
    assert got == content
    assert opener.opens == 1 and files[0] is files[1]
    assert files[0].closed and area.used == 0


async def test_a_read_that_goes_away_cancels_a_staging_no_other_read_wants() -> None:
    content = content_of(2 * MiB)
    fragment = fragment_of(content)
    opener = Opener(content, asyncio.Event())  # Never opens the gate.
    area = StagingArea(new_memory_file)

    async def read() -> None:
        async with staged(area, fragment, opener):
            raise AssertionError("a staging that never completes was entered")

    task = asyncio.create_task(read())
    async with asyncio.timeout(WAIT_S):
        await opener.reading.wait()
        assert area.used == len(content)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The staging task closes its store reader once its cancellation lands; its file (the
        # room) is closed once it has ended: no event to await but the area's count.
        await wait_until(lambda: area.used == 0)
        assert opener.closed == 1
    assert area.used == 0 and area.filling == 0


async def test_a_read_that_goes_away_leaves_the_staging_to_another_read() -> None:
    content = content_of(2 * MiB)
    fragment = fragment_of(content)
    gate = asyncio.Event()
    opener = Opener(content, gate)
    area = StagingArea(new_memory_file)

    async def read() -> bytes:
        async with staged(area, fragment, opener) as file:
            return await read_whole(file, fragment)

    leaving = asyncio.create_task(read())
    staying = asyncio.create_task(read())
    async with asyncio.timeout(WAIT_S):
        await opener.reading.wait()  # Both joined: tasks start in the order they were created.
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        gate.set()
        assert await staying == content
    assert opener.opens == 1 and area.used == 0


async def test_a_copy_left_while_its_staging_writes_is_closed_once_the_write_ends() -> None:
    content = content_of(3 * MiB)
    fragment = fragment_of(content)
    area = StagingArea(new_memory_file)
    opener = Opener(content)
    claim = staged(area, fragment, opener)
    entered = asyncio.create_task(claim.__aenter__())
    async with asyncio.timeout(WAIT_S):
        await opener.reading.wait()
        entered.cancel()
        with pytest.raises(asyncio.CancelledError):
            await entered
        # The room is the file's: freed once the staging task has ended, after its write.
        await wait_until(lambda: area.used == 0)
    assert area.used == 0


async def test_a_failing_scratch_file_is_a_staging_error_not_data_loss() -> None:
    content = content_of(3 * MiB)
    fragment = fragment_of(content)
    area = StagingArea(lambda: MemorySpoolFile(bytes_max=MiB))  # A disk that fills up.
    with pytest.raises(StagingError) as caught:
        async with staged(area, fragment, Opener(content)):
            pass
    assert not isinstance(caught.value, FragmentIntegrityError)
    assert "scratch file" in str(caught.value) and isinstance(caught.value.__cause__, OSError)
    assert area.used == 0


async def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="bytes_max"):
        StagingArea(new_memory_file, bytes_max=-1)


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    yield
    others = [
        t
        for t in asyncio.all_tasks()
        if t is not asyncio.current_task() and t.get_name().startswith("stage ")
    ]
    for task in others:
        await asyncio.wait([task], timeout=WAIT_S)
    assert all(t.done() for t in others)


@pytest.mark.parametrize("value", ["-1", "lots"])
def test_the_serve_flag_refuses_a_bad_size(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse_args(["serve", "--read-stage-bytes-max", value])
    assert "argument --read-stage-bytes-max:" in capsys.readouterr().err


def test_the_serve_flag_sets_the_room() -> None:
    assert _parse_args(["serve"]).stage_bytes_max == stage_bytes_max_default == 4 << 30
    assert _parse_args(["serve", "--read-stage-bytes-max", "0"]).stage_bytes_max == 0


def space(free: int, total: int = 100 * MiB) -> Callable[[], DiskSpace]:
    return lambda: DiskSpace(free, total)


async def test_a_copy_is_staged_only_if_the_disk_keeps_a_quarter_free() -> None:
    content = content_of(2 * MiB)
    fragment = fragment_of(content)
    # 100 MiB disk: a 2 MiB copy needs 27 MiB free (25 MiB left after it).
    assert (
        StagingArea(new_memory_file, disk_space=space(26 * MiB)).claim(fragment, Opener(content))
        is None
    )
    area = StagingArea(new_memory_file, disk_space=space(27 * MiB))
    async with staged(area, fragment, Opener(content)) as file:
        assert await read_whole(file, fragment) == content
    # Zero keeps nothing back; a disk that cannot be asked is taken as full.
    nothing_back = StagingArea(new_memory_file, disk_space=space(2 * MiB), keep_free_fraction=0)
    async with staged(nothing_back, fragment, Opener(content)) as file:
        assert await read_whole(file, fragment) == content

    def unknowable() -> DiskSpace:
        raise FileNotFoundError("no such directory")

    assert (
        StagingArea(new_memory_file, disk_space=unknowable).claim(fragment, Opener(content)) is None
    )
    with pytest.raises(ValueError, match="keep_free_fraction"):
        StagingArea(new_memory_file, keep_free_fraction=1.0)


async def test_a_large_disk_keeps_8_gib_free_not_a_quarter() -> None:
    content = content_of(2 * MiB)
    fragment = fragment_of(content)
    disk = 1 << 40  # 1 TiB: a quarter would be 256 GiB.
    full = StagingArea(new_memory_file, disk_space=space((8 << 30) + MiB, disk))
    assert full.claim(fragment, Opener(content)) is None
    area = StagingArea(new_memory_file, disk_space=space((8 << 30) + 2 * MiB, disk))
    async with staged(area, fragment, Opener(content)) as file:
        assert await read_whole(file, fragment) == content


async def test_copies_still_being_written_count_against_the_free_disk() -> None:
    """Found by review (2026-11-29): the file system's free space does not yet show copies
    being written, so reads arriving together each passed the check and together took the
    spools' reserve. A 100 MiB disk keeps 25 MiB; 28 MiB free fits one 2 MiB copy in
    progress and another only while nothing else is being written."""
    a, b = content_of(2 * MiB, 1), content_of(2 * MiB, 2)
    fa, fb = fragment_of(a), fragment_of(b, begin=len(a))
    area = StagingArea(new_memory_file, disk_space=space(28 * MiB))
    gate = asyncio.Event()
    opener_a = Opener(a, gate)
    claim_a = staged(area, fa, opener_a)
    entering = asyncio.create_task(claim_a.__aenter__())
    try:
        async with asyncio.timeout(WAIT_S):
            await opener_a.reading.wait()  # a's copy is being written: 2 MiB still to take.
        assert area.filling == len(a)
        assert area.claim(fb, Opener(b)) is None  # 28 - (2 + 2) < 25.
        gate.set()
        async with asyncio.timeout(WAIT_S):
            await entering
        assert area.filling == 0
        # Written (the disk's free space would now show it; this one does not move).
        async with staged(area, fb, Opener(b)) as file:
            assert await read_whole(file, fb) == b
    finally:
        gate.set()
        await claim_a.__aexit__(None, None, None)
