"""Fragments loaded whole and read ahead (sources.py): a JournalSource over fragment files hands
out exactly the journal's content, in order, whatever the codec and range; a fragment that
cannot be read is reported (or skipped) at its turn, after every byte before it, though it
was loaded ahead; a file longer than its fragment can be is not read further; closing a read
early leaves no load running."""

from __future__ import annotations

import asyncio
import itertools
import random
from pathlib import Path
from typing import Any

import pytest

from broker.fragment import codecs
from broker.fragment.naming import content_sum
from broker.protocol import protocol_pb2 as pb
from spark_integration import sources
from spark_integration.sources import FragmentRef, GazetteDataLossError, JournalSource

JOURNAL = "loads/j"


def fragment_files(
    folder: Path, content: bytes, cuts: list[int], codec: Any = pb.NONE
) -> list[FragmentRef]:
    """`content` cut at `cuts` into fragment files in `folder`, stored with `codec`."""
    refs = []
    bounds = [0, *cuts, len(content)]
    for lo, hi in itertools.pairwise(bounds):
        piece = content[lo:hi]
        path = folder / f"{lo:016x}-{hi:016x}"
        path.write_bytes(codecs.compress(codec, piece))
        spec = pb.Fragment(
            journal=JOURNAL,
            begin=lo,
            end=hi,
            sum=content_sum(piece),
            compression_codec=codec,
            backing_store=f"file://{folder}/",
        )
        refs.append(FragmentRef.of(spec, f"file://{path}"))
    return refs


def journal_content(rng: random.Random, lines: int) -> tuple[bytes, list[int]]:
    """JSON-ish lines, and the offsets after each (message boundaries)."""
    out, bounds = bytearray(), []
    for i in range(lines):
        out += b'{"i":%d,"pad":"%s"}\n' % (i, b"x" * rng.randint(0, 300))
        bounds.append(len(out))
    return bytes(out), bounds


async def read(source: JournalSource, begin: int, end: int) -> bytes:
    out = bytearray()
    async for chunk in source.chunks(begin, end):
        assert chunk.offset == begin + len(out)
        out += chunk.content
    return bytes(out)


def source_of(refs: list[FragmentRef], *, fail: bool = True) -> JournalSource:
    return JournalSource(JOURNAL, refs, client=None, registry=None, fail_on_data_loss=fail)


@pytest.mark.parametrize("codec", [pb.NONE, pb.GZIP, pb.SNAPPY, pb.ZSTANDARD])
async def test_ranges_read_exactly_the_content(codec: Any, tmp_path: Path) -> None:
    rng = random.Random(codec)
    content, bounds = journal_content(rng, 3_000)
    cuts = sorted(rng.sample(bounds[:-1], 40))
    refs = fragment_files(tmp_path, content, cuts, codec)
    for _ in range(20):
        begin, end = sorted(rng.sample([0, *bounds], 2))
        assert await read(source_of(refs), begin, end) == content[begin:end]
    assert await read(source_of(refs), 0, len(content)) == content


async def test_a_large_fragment_is_handed_out_in_pieces(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    content, bounds = journal_content(random.Random(1), 2_000)
    refs = fragment_files(tmp_path, content, [bounds[999]])
    monkeypatch.setattr(sources, "fragment_chunk_bytes_max", 4096)
    sizes = [len(c.content) async for c in source_of(refs).chunks(bounds[10], len(content))]
    assert max(sizes) == 4096
    assert await read(source_of(refs), bounds[10], len(content)) == content[bounds[10] :]


def damage(ref: FragmentRef, how: str) -> None:
    path = Path(ref.url.removeprefix("file://"))
    data = path.read_bytes()
    if how == "corrupt":
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 1  # Same length, another SHA1.
        path.write_bytes(bytes(flipped))
    elif how == "missing":
        path.unlink()
    elif how == "long":
        path.write_bytes(data * 2)  # Decodes to more than the fragment.
    else:  # More than a fragment's file can hold: not read to its end.
        path.write_bytes(data * 4 + bytes(sources.stored_slack_bytes))


@pytest.mark.parametrize("how", ["corrupt", "missing", "long", "huge"])
async def test_a_bad_fragment_is_reported_at_its_turn(how: str, tmp_path: Path) -> None:
    content, bounds = journal_content(random.Random(2), 2_000)
    cuts = bounds[99:1999:100]  # 20 fragments, every one loaded ahead of its turn.
    refs = fragment_files(tmp_path, content, cuts)
    bad = refs[7]
    damage(bad, how)

    got = bytearray()
    with pytest.raises(GazetteDataLossError) as failed:
        async for chunk in source_of(refs).chunks(0, len(content)):
            got += chunk.content
    assert bytes(got) == content[: bad.begin]  # Everything before it, nothing of it.
    assert (failed.value.begin, failed.value.end) == (bad.begin, bad.end)

    lenient = source_of(refs, fail=False)
    skipped = await read_skipping(lenient, 0, len(content))
    assert skipped == content[: bad.begin] + content[bad.end :]
    assert lenient.lost_bytes == bad.end - bad.begin


async def read_skipping(source: JournalSource, begin: int, end: int) -> bytes:
    out = bytearray()
    async for chunk in source.chunks(begin, end):
        out += chunk.content
    return bytes(out)


async def test_closing_a_read_early_leaves_no_load_running(tmp_path: Path) -> None:
    # 1 MiB lines, a fragment each: the reads ahead of the first are still loading when it
    # is handed out (those that are done are let go too).
    lines = [b'{"i":%d,"pad":"%s"}\n' % (i, b"x" * (1 << 20)) for i in range(12)]
    content = b"".join(lines)
    cuts = [sum(map(len, lines[:i])) for i in range(1, len(lines))]
    refs = fragment_files(tmp_path, content, cuts)
    chunks = source_of(refs).chunks(0, len(content))
    first = await anext(chunks)
    assert first.content == content[: refs[0].end]
    await chunks.aclose()
    assert asyncio.all_tasks() == {asyncio.current_task()}
