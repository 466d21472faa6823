"""Scans read UUIDs from the lines' tails (uuid_tails.py) instead of decoding every line: they
must see exactly what the full decode (msgspec) sees, or decline.

First piece by piece, against `bulk_batch` on random mixes of the writers' lines and lines
built to mislead a tail reader (duplicate and escaped "UUID" keys, UUIDs nested or inside
strings, other spacings, non-canonical UUIDs); then whole planning walks (`CommittedRange.scan`,
what the streaming planner runs) against the same walks decoding every line, over seeded
random journals read from fragment files: the same end checkpoint, split checkpoints, reached
clocks and resolving messages.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from broker.fragment.naming import content_sum
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message import NIL_UUID
from gazette_consumer.sequencer.types import SequencerCheckpoint
from spark_integration.journal_io import GazetteJournalError
from spark_integration.json_lines import JSONLinesDecoder, bulk_batch, general_batch
from spark_integration.message_batch import MessageBatch
from spark_integration.range_decode import json_decoder
from spark_integration.range_read import CommittedRange
from spark_integration.sources import FragmentRef, JournalSource
from spark_integration.uuid_tails import tail_batch
from tests.gazette_consumer.sequencer.read_iter_testkit import frames
from tests.spark_integration.test_bulk_commit import history

JOURNAL = "tails/j"
V1 = "2f1e0c1a-1d2c-11ef-8000-0242ac120002"  # A Gazette (version 1) UUID.
V1_OTHER = "2f1e0c1b-1d2c-11ef-8001-0242ac120003"
NIL = "00000000-0000-0000-0000-000000000000"
V4 = "9b2f3c1e-8d7a-4e2b-9c1d-2a3b4c5d6e7f"  # Not version 1.


def writer_line(text: str | None, uuid: str) -> bytes:
    """A line as this package's writers frame it: the UUID last (an ACK: the UUID alone)."""
    if text is None:
        return b'{"UUID":"%s"}\n' % uuid.encode()
    return b'{"text":%s,"UUID":"%s"}\n' % (msgspec.json.encode(text), uuid.encode())


# Lines a tail reader could misread, each valid JSON (or not, where noted).
MISLEADING = [
    # Another "UUID" member before the last one: msgspec keeps the last (so may the tails).
    b'{"UUID":"%s","text":"a","UUID":"%s"}\n' % (V1_OTHER.encode(), V1.encode()),
    b'{"\\u0055UID":"%s","UUID":"%s"}\n' % (V1_OTHER.encode(), V1.encode()),
    # The last member is not the UUID: nested, or inside a string, or a UUID-looking value.
    b'{"UUID":"%s","n":{"UUID":"%s"}}\n' % (V1.encode(), V1_OTHER.encode()),
    b'{"UUID":"%s","s":"x,\\"UUID\\":\\"%s\\"}"}\n' % (V1.encode(), V1_OTHER.encode()),
    b'{"UUID":"%s","xUUID":"%s"}\n' % (V1.encode(), V1_OTHER.encode()),
    b'{"a\\"UUID":"%s"}\n' % V1.encode(),  # The key is `a"UUID`: this line has no UUID.
    b'{"UUID":"%s","{\\"UUID":"%s"}\n' % (V1.encode(), V1_OTHER.encode()),
    b'{"UUID":"%s","a":["UUID","%s"]}\n' % (V1.encode(), V1_OTHER.encode()),
    # Other spacing, order or form: declined, the full decode reads them.
    b'{"text": "a", "UUID": "%s"}\n' % V1.encode(),
    b'{"UUID":"%s","text":"a"}\n' % V1.encode(),
    b'{"text":"a","UUID":"%s"} \n' % V1.encode(),
    b'{"text":"a","UUID":"%s"}\r\n' % V1.encode(),
    b'{"text":"a","UUID":"%s"}\n' % V1.upper().encode(),
    b'{"text":"a","UUID":"%s"}\n' % V4.encode(),
    b'{"text":"a"}\n',
    b"{}\n",
    # The nil UUID: no UUID (as the full decode takes it).
    writer_line("nil", NIL),
]


def columns(batch: MessageBatch) -> dict[str, Any]:
    return {
        "begins": batch.begins.tolist(),
        "ends": batch.ends.tolist(),
        "producers": batch.producers.tolist(),
        "clocks": batch.clocks.tolist(),
        "flags": batch.flags.tolist(),
        "uuids": batch.uuids.to_pylist(),
    }


def test_msgspec_keeps_the_last_of_duplicate_keys() -> None:
    """What the tails rely on (uuid_tails.py): a line's last "UUID" member is its UUID."""
    decoder = msgspec.json.Decoder(dict[str, str])
    assert decoder.decode(MISLEADING[0])["UUID"] == V1
    assert decoder.decode(MISLEADING[1])["UUID"] == V1
    whole = bulk_batch(JOURNAL, 0, MISLEADING[0] + MISLEADING[1], content=False)
    assert whole is not None
    assert whole.uuids.to_pylist() == [V1, V1]


def test_the_writers_lines_are_read_by_their_tails() -> None:
    piece = b"".join(
        writer_line(None if i % 7 == 6 else f't{i}\u00e9"}}', V1 if i % 2 else V1_OTHER)
        for i in range(50)
    )
    got = tail_batch(JOURNAL, 1000, piece)
    want = bulk_batch(JOURNAL, 1000, piece, content=False)
    assert got is not None and want is not None
    assert columns(got) == columns(want)


@pytest.mark.parametrize("seed", range(40))
def test_tails_read_what_the_full_decode_reads_or_decline(seed: int) -> None:
    rng = random.Random(seed)
    taken = 0
    for _ in range(30):
        lines = []
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.15:
                lines.append(rng.choice(MISLEADING))
            else:
                text = rng.choice([None, "", "a", "x\\y", '"}', "UUID", '","UUID":"'])
                lines.append(writer_line(text, rng.choice([V1, V1_OTHER, NIL])))
        piece = b"".join(lines)
        offset = rng.randrange(1 << 40)
        got = tail_batch(JOURNAL, offset, piece)
        if got is None:
            continue
        taken += 1
        want = bulk_batch(JOURNAL, offset, piece, content=False)
        assert want is not None, piece
        assert columns(got) == columns(want), piece
    assert taken > 0


def writer_frames(messages: list[Any], rng: random.Random, *, other_format: float) -> bytes:
    """The messages of one append framed as the writers frame them, or (with probability
    `other_format`, the whole append) as msgspec encodes them, the UUID first."""
    if rng.random() < other_format:
        return frames(*messages)
    out = []
    for m in messages:
        uuid = NIL if m.uuid == NIL_UUID else str(m.uuid)
        out.append(writer_line(m.text or None, uuid))
    return b"".join(out)


def fragment_files(folder: Path, content: bytes, cuts: list[int]) -> list[FragmentRef]:
    """`content` in fragment files cut at `cuts`, as signed file:// URLs name them."""
    refs = []
    for lo, hi in zip([0, *cuts], [*cuts, len(content)], strict=True):
        piece = content[lo:hi]
        path = folder / f"{lo:016x}-{hi:016x}-{hashlib.sha1(piece).hexdigest()}.raw"
        path.write_bytes(piece)
        spec = pb.Fragment(
            journal=JOURNAL,
            begin=lo,
            end=hi,
            sum=content_sum(piece),
            compression_codec=pb.NONE,
            backing_store=f"file://{folder}/",
        )
        refs.append(FragmentRef.of(spec, f"file://{path}"))
    return refs


async def plan(
    refs: list[FragmentRef],
    begin: int,
    head: int,
    checkpoint: SequencerCheckpoint,
    stops: list[int],
    horizon: int,
    *,
    tails: bool,
) -> tuple[dict[int, SequencerCheckpoint], int, SequencerCheckpoint, Any, Any]:
    """A planning walk as stream_read._walk runs it, by the tails or decoding every line (a
    decoder factory other than json_decoder scans with the full decode)."""
    source = JournalSource(JOURNAL, refs, client=None, registry=None, fail_on_data_loss=True)
    walk = CommittedRange(
        source,
        begin,
        head,
        ring_size=16,
        checkpoint=checkpoint,
        replay=False,
        new_decoder=json_decoder if tails else (lambda j, o: JSONLinesDecoder(j, o)),
    )
    out, end = await walk.scan(stops, horizon)
    return out, end, walk.checkpoint_at(end, horizon), walk.reached_at, walk.resolving_at


@pytest.mark.parametrize("seed", range(12))
async def test_planning_walks_by_tails_end_where_full_decodes_do(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    appends = history(seed, old_acks=True)
    framed = [writer_frames(a, rng, other_format=0.1 if seed % 3 == 0 else 0.0) for a in appends]
    content = b"".join(framed)
    bounds = np.cumsum([len(f) for f in framed]).tolist()[:-1]
    cuts = sorted(rng.sample(bounds, min(len(bounds), rng.randint(1, 8))))
    refs = fragment_files(tmp_path, content, cuts)
    head = len(content)
    checkpoint = SequencerCheckpoint(read_through={JOURNAL: 0})
    begin = 0
    # Micro-batches one after the other, each from the last one's end checkpoint.
    while begin < head:
        later = [b for b in bounds if b > begin]
        end = rng.choice(later) if later and rng.random() < 0.6 else head
        inside = [b for b in later if b < end]
        stops = sorted(rng.sample(inside, min(3, len(inside))))
        # Producers' clocks start at 1,000 (history): a horizon among them forgets some.
        horizon = 0 if rng.random() < 0.5 else rng.choice(range(1000, 1200, 10))
        got = await plan(refs, begin, end, checkpoint, stops, horizon, tails=True)
        want = await plan(refs, begin, end, checkpoint, stops, horizon, tails=False)
        assert got == want, f"[{begin}, {end}) stops {stops} horizon {horizon}"
        checkpoint, begin = got[2], end


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("content", [True, False])
def test_chunks_cut_anywhere_decode_as_one_piece(seed: int, content: bool) -> None:
    """The decoder holds fed chunks and joins them once a piece is due: chunks cut anywhere
    (inside lines, several lines, empty), pieces of any size, give the batches of one piece."""
    rng = random.Random(seed)
    lines = [writer_line(f"t{i}" * rng.randint(0, 30), V1) for i in range(300)]
    if seed % 2:
        lines[rng.randrange(300)] = MISLEADING[6]  # One piece declined by the tails.
    whole = b"".join(lines)
    decoder = JSONLinesDecoder(JOURNAL, 0, piece_bytes=rng.randint(1, 3000), content=content)
    out, at = [], 0
    while at < len(whole):
        step = rng.choice([0, 1, rng.randint(1, 400), rng.randint(1, 4000)])
        out += decoder.feed(whole[at : at + step], at)
        at += step
    out += decoder.flush()
    want = bulk_batch(JOURNAL, 0, whole, content=content)
    assert want is not None
    got = MessageBatch.concat(out)
    assert columns(got) == columns(want)
    if content:
        assert got.content.to_pylist() == want.content.to_pylist()


# Lines whose tails read as a writer's but that the full decode refuses (not one JSON object):
# the content path, reading UUIDs from the tails, must still refuse them.
NOT_OBJECTS = [
    b'{"text":,"UUID":"%s"}\n' % V1.encode(),
    b'{"a":1}{"UUID":"%s"}\n' % V1.encode(),
    b'{"a":1} {"text":"b","UUID":"%s"}\n' % V1.encode(),
    b'"s","UUID":"%s"}\n' % V1.encode(),
    b'{"text":"\\x","UUID":"%s"}\n' % V1.encode(),
    b'{"text":"a","UUID":"%s"}}\n' % V1.encode(),
    b'{"text":"a\xff","UUID":"%s"}\n' % V1.encode(),  # Not UTF-8.
    b'{"UUID":5,"UUID":"%s"}\n' % V1.encode(),  # A "UUID" that is not a string, then one.
    b"\n",
]


def delivered(piece: bytes, offset: int, *, tails: bool) -> Any:
    """What a partition's decoder makes of `piece`: the bulk path's batch, else the general
    path's, else its error."""
    batch = bulk_batch(JOURNAL, offset, piece, tails=tails)
    path = "bulk"
    if batch is None:
        path = "general"
        try:
            batch = general_batch(JOURNAL, offset, piece, final=True)
        except GazetteJournalError as err:
            return "error", str(err)
    return path, columns(batch), batch.content.to_pylist()


@pytest.mark.parametrize("seed", range(40))
def test_content_read_by_tails_is_what_the_full_decode_delivers(seed: int) -> None:
    """A partition's decode (with content) takes the UUIDs from the tails, msgspec then only
    checking each line is one JSON object: the same batches, the same pieces sent down the
    general path, the same errors as decoding every line's UUID."""
    rng = random.Random(seed)
    by_tails = 0
    for _ in range(30):
        lines = []
        for _ in range(rng.randint(1, 12)):
            draw = rng.random()
            if draw < 0.1:
                lines.append(rng.choice(MISLEADING))
            elif draw < 0.15:
                lines.append(rng.choice(NOT_OBJECTS))
            else:
                text = rng.choice([None, "", "a", "x\\y", '"}', "UUID", '","UUID":"', "\u00e9"])
                lines.append(writer_line(text, rng.choice([V1, V1_OTHER, NIL])))
        piece = b"".join(lines)
        offset = rng.randrange(1 << 40)
        got = delivered(piece, offset, tails=True)
        assert got == delivered(piece, offset, tails=False), piece
        by_tails += tail_batch(JOURNAL, offset, piece) is not None and got[0] == "bulk"
    assert by_tails > 0
