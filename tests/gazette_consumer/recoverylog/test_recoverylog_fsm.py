"""The recovery-log FSM (sans-IO): one test per transition and per rejection (a rejected op
changes nothing), hints round trips, the op decoder, and a property test of zombie ops."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol.recorded_op_pb2 import FSMHints, Property, RecordedOp
from gazette_consumer.recoverylog.fsm import (
    FSM,
    SEGMENT_GAP_BYTES,
    SEGMENTS_PER_FNODE_MAX,
    ChecksumMismatchError,
    ExpectedHintedFnodeError,
    InvalidHintsError,
    LinkExistsError,
    NoSuchLinkError,
    NotHintedAuthorError,
    Outcome,
    PropertyExistsError,
    WrongSeqNoError,
)
from gazette_consumer.recoverylog.ops import (
    Content,
    CorruptLogError,
    DecodedOp,
    OpDecoder,
    checksum_update,
    encode_op,
)

LOG = "recovery/log"
A, Z = 0xA, 0x2  # The valid author, and a zombie.


def sequenced(fsm: FSM, author: int, **body: object) -> tuple[RecordedOp, bytes]:
    """An op by `author` that extends `fsm`'s history, and its payload."""
    op = RecordedOp(seq_no=fsm.next_seq_no, checksum=fsm.next_checksum, author=author, **body)  # type: ignore[arg-type]
    payload = op.SerializeToString()
    op.log = LOG
    return op, payload


def step(fsm: FSM, author: int = A, **body: object) -> Outcome:
    op, payload = sequenced(fsm, author, **body)
    return fsm.apply(op, payload)


def snapshot(fsm: FSM) -> tuple[object, ...]:
    return (
        fsm.next_seq_no,
        fsm.next_checksum,
        copy.deepcopy(fsm.live_nodes),
        dict(fsm.links),
        dict(fsm.properties),
    )


def create(path: str) -> dict[str, object]:
    return {"create": RecordedOp.Create(path=path)}


def test_checksum_is_crc32c() -> None:
    # The standard CRC-32C check value, and chaining equals one pass.
    assert checksum_update(0, b"123456789") == 0xE3069283
    assert checksum_update(checksum_update(0, b"1234"), b"56789") == 0xE3069283


def test_create_assigns_fnode_seq_no_and_chains_checksum() -> None:
    fsm = FSM(LOG)
    op, payload = sequenced(fsm, A, create=RecordedOp.Create(path="/a"))
    assert fsm.apply(op, payload) is Outcome.APPLIED
    assert fsm.links == {"/a": 1} and fsm.live_nodes[1].links == {"/a"}
    assert (fsm.next_seq_no, fsm.next_checksum) == (2, checksum_update(0, payload))


def test_link_write_unlink_and_death() -> None:
    fsm = FSM(LOG)
    step(fsm, **create("/a"))
    assert step(fsm, link=RecordedOp.Link(fnode=1, path="/b")) is Outcome.APPLIED
    assert fsm.live_nodes[1].links == {"/a", "/b"}
    assert step(fsm, write=RecordedOp.Write(fnode=1, offset=0, length=3)) is Outcome.APPLIED
    step(fsm, unlink=RecordedOp.Link(fnode=1, path="/a"))
    assert fsm.links == {"/b": 1}
    step(fsm, unlink=RecordedOp.Link(fnode=1, path="/b"))
    assert fsm.live_nodes == {} and fsm.links == {}


def test_property_and_noop() -> None:
    fsm = FSM(LOG)
    assert step(fsm, property=Property(path="/P", content="x")) is Outcome.APPLIED
    assert step(fsm, property=Property(path="/P", content="x")) is Outcome.APPLIED  # Same: ok.
    assert step(fsm) is Outcome.APPLIED  # A hand-off no-op only sequences.
    assert fsm.properties == {"/P": "x"} and fsm.next_seq_no == 4


def test_op_of_unknown_fnode_steps_untracked() -> None:
    fsm = FSM(LOG)
    assert step(fsm, write=RecordedOp.Write(fnode=7, length=1)) is Outcome.UNTRACKED
    assert fsm.next_seq_no == 2 and fsm.live_nodes == {}


@pytest.mark.parametrize(
    ("setup", "body", "error"),
    [
        ([], {"seq_no_delta": 1}, WrongSeqNoError),
        ([], {"seq_no_delta": -1}, WrongSeqNoError),
        ([], {"checksum_delta": 1}, ChecksumMismatchError),
        ([create("/a")], create("/a"), LinkExistsError),
        ([create("/a")], {"link": RecordedOp.Link(fnode=1, path="/a")}, LinkExistsError),
        ([create("/a")], {"unlink": RecordedOp.Link(fnode=1, path="/b")}, NoSuchLinkError),
        ([{"property": Property(path="/P", content="x")}], create("/P"), PropertyExistsError),
        (
            [{"property": Property(path="/P", content="x")}],
            {"property": Property(path="/P", content="y")},
            PropertyExistsError,
        ),
        ([create("/a")], {"property": Property(path="/a", content="y")}, LinkExistsError),
    ],
)
def test_rejected_op_changes_nothing(
    setup: list[dict[str, object]], body: dict[str, object], error: type[Exception]
) -> None:
    fsm = FSM(LOG)
    for s in setup:
        step(fsm, **s)
    body = dict(body)
    seq_delta = int(body.pop("seq_no_delta", 0))  # type: ignore[call-overload]
    sum_delta = int(body.pop("checksum_delta", 0))  # type: ignore[call-overload]
    op, payload = sequenced(fsm, A, **body)
    op.seq_no += seq_delta
    op.checksum = (op.checksum + sum_delta) & 0xFFFFFFFF
    before = snapshot(fsm)
    with pytest.raises(error):
        fsm.apply(op, payload)
    assert snapshot(fsm) == before


def history() -> tuple[FSM, list[tuple[RecordedOp, bytes]]]:
    """A log: /dead is created and removed early, /live written across a zombie's op."""
    fsm, ops = FSM(LOG), []
    for author, body in [
        (A, create("/dead")),
        (A, {"write": RecordedOp.Write(fnode=1, length=4)}),
        (A, create("/live")),
        (A, {"unlink": RecordedOp.Link(fnode=1, path="/dead")}),
        (A, {"write": RecordedOp.Write(fnode=3, length=4)}),
        (A, {"property": Property(path="/P", content="p")}),
    ]:
        op, payload = sequenced(fsm, author, **body)
        op.first_offset = 10 * op.seq_no
        op.last_offset = 10 * op.seq_no + 10
        fsm.apply(op, payload)
        ops.append((op, payload))
    return fsm, ops


def test_hints_skip_dead_history() -> None:
    fsm, ops = history()
    hints = fsm.build_hints()
    assert [n.fnode for n in hints.live_nodes] == [3]
    assert [(p.path, p.content) for p in hints.properties] == [("/P", "p")]

    replay = FSM.from_hints(hints)
    assert replay.next_hinted_segment is not None
    assert replay.next_hinted_segment.first_offset == 30  # Skips /dead's history.
    outcomes = []
    for op, payload in ops[2:]:
        outcomes.append(replay.apply(op, payload))
    assert outcomes == [Outcome.APPLIED, Outcome.UNTRACKED, Outcome.APPLIED, Outcome.APPLIED]
    assert not replay.has_remaining_hints
    assert (replay.links, replay.properties) == (fsm.links, fsm.properties)
    assert (replay.next_seq_no, replay.next_checksum) == (fsm.next_seq_no, fsm.next_checksum)


def test_hints_reject_other_authors_and_non_creates() -> None:
    fsm, ops = history()
    replay = FSM.from_hints(fsm.build_hints())
    op, payload = ops[2]
    zombie = RecordedOp()
    zombie.CopyFrom(op)
    zombie.author = Z
    with pytest.raises(NotHintedAuthorError):
        replay.apply(zombie, payload)
    not_create = RecordedOp(seq_no=3, checksum=op.checksum, author=A)
    with pytest.raises(ExpectedHintedFnodeError):
        replay.apply(not_create, not_create.SerializeToString())


def test_invalid_hints_are_typed() -> None:
    with pytest.raises(InvalidHintsError, match="log"):
        FSM.from_hints(FSMHints())
    fsm, _ = history()
    hints = fsm.build_hints()
    hints.live_nodes[0].fnode = 4  # Its first segment begins at seq_no 3.
    with pytest.raises(InvalidHintsError, match="live_nodes\\[0\\]"):
        FSM.from_hints(hints)


def test_decoder_splits_ops_and_content_across_any_chunking() -> None:
    fsm = FSM(LOG)
    op1, _ = sequenced(fsm, A, **create("/a"))
    step(fsm, **create("/a"))
    op2, _ = sequenced(fsm, A, write=RecordedOp.Write(fnode=1, offset=5, length=3))
    op1.log = op2.log = ""
    stream = encode_op(op1) + encode_op(op2) + b"xyz"
    for cut in range(len(stream) + 1):
        decoder = OpDecoder(LOG, 100)
        events = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        decoder.finish()
        ops = [e for e in events if isinstance(e, DecodedOp)]
        content = b"".join(e.data for e in events if isinstance(e, Content))
        assert [o.op.seq_no for o in ops] == [1, 2] and content == b"xyz"
        assert ops[1].op.first_offset == 100 + len(encode_op(op1))
        assert ops[1].op.last_offset == 100 + len(stream) and decoder.offset == 100 + len(stream)


@pytest.mark.parametrize(
    ("garbage", "reason"),
    [
        (b"not a frame at all", "magic word"),
        (b"\x66\x33\x93\x36\xff\xff\xff\x7f", "exceeds op_bytes_max"),
        (b"\x66\x33\x93\x36\x02\x00\x00\x00\xff\xff", "malformed RecordedOp"),
    ],
)
def test_decoder_names_the_offset_of_garbage(garbage: bytes, reason: str) -> None:
    good = encode_op(RecordedOp(seq_no=1, author=A))
    decoder = OpDecoder(LOG, 1000)
    with pytest.raises(CorruptLogError, match=reason) as caught:
        decoder.feed(good + garbage)
    assert caught.value.offset == 1000 + len(good) and caught.value.log == LOG
    with pytest.raises(CorruptLogError):
        decoder.feed(b"")  # The decoder stays failed.


def test_decoder_finish_inside_an_op() -> None:
    decoder = OpDecoder(LOG, 0)
    decoder.feed(encode_op(RecordedOp(seq_no=1, write=RecordedOp.Write(fnode=1, length=9))))
    with pytest.raises(CorruptLogError, match="ends inside"):
        decoder.finish()


# --- Property: a zombie's interleaved ops never change the valid author's files ----------------

PATHS = ["/a", "/b", "/c"]
actions = st.lists(
    st.tuples(
        st.booleans(),  # By the zombie?
        st.sampled_from(["create", "link", "unlink", "write"]),
        st.sampled_from(PATHS),
        st.sampled_from(PATHS),
    ),
    max_size=40,
)


class Writer:
    """An author's view of the log: its own FSM, from which it sequences its ops."""

    def __init__(self, author: int) -> None:
        self.author, self.fsm = author, FSM(LOG)

    def next_op(self, kind: str, path: str, other: str) -> tuple[RecordedOp, bytes] | None:
        links = self.fsm.links
        body: dict[str, object]
        if kind == "create":
            if path in links:
                return None
            body = create(path)
        elif kind == "link":
            if path not in links or other in links:
                return None
            body = {"link": RecordedOp.Link(fnode=links[path], path=other)}
        elif kind == "unlink":
            if path not in links:
                return None
            body = {"unlink": RecordedOp.Link(fnode=links[path], path=path)}
        else:
            if path not in links:
                return None
            body = {"write": RecordedOp.Write(fnode=links[path], length=1)}
        op, payload = sequenced(self.fsm, self.author, **body)
        assert self.fsm.apply(op, payload) is Outcome.APPLIED
        return op, payload


def live_files(fsm: FSM) -> dict[str, int]:
    return dict(fsm.links)


@given(actions, st.integers(min_value=0, max_value=5))
def test_zombie_ops_are_never_applied(script: list[tuple[bool, str, str, str]], fork: int) -> None:
    valid = Writer(A)
    # The zombie shares the first `fork` ops of history, then diverges (a primary that lost
    # its shard, still appending to the log it thinks it owns).
    log: list[tuple[RecordedOp, bytes]] = []
    for i in range(fork):
        produced = valid.next_op("create", f"/shared{i}", "")
        assert produced is not None
        log.append(produced)
    zombie = Writer(Z)
    for op, payload in log:
        zombie.fsm.apply(op, payload)
    # The valid author's hand-off no-op lands first: everything the zombie appends after was
    # sequenced against the history without it.
    handoff, payload = sequenced(valid.fsm, A)
    valid.fsm.apply(handoff, payload)
    log.append((handoff, payload))
    for by_zombie, kind, path, other in script:
        produced = (zombie if by_zombie else valid).next_op(kind, path, other)
        if produced is not None:
            log.append(produced)
    # Zombie ops also appear duplicated (a retried append): still never applied.
    log += [entry for entry in log if entry[0].author == Z][:3]

    reader = FSM(LOG)
    for op, payload in log:
        try:
            outcome = reader.apply(op, payload)
        except (WrongSeqNoError, ChecksumMismatchError):
            continue
        assert op.author == A and outcome is Outcome.APPLIED
    assert live_files(reader) == live_files(valid.fsm)
    assert (reader.next_seq_no, reader.next_checksum) == (
        valid.fsm.next_seq_no,
        valid.fsm.next_checksum,
    )


# --- Segments of a long-lived file --------------------------------------------------------------

MIB = 1 << 20
B = 0xB  # The author after a hand-off.


class OffsetLog:
    """A log whose ops carry exact offsets (as a player reads them): each op takes `size`."""

    def __init__(self) -> None:
        self.fsm, self.ops, self.offset = FSM(LOG), list[tuple[RecordedOp, bytes]](), 0

    def add(self, size: int, author: int = A, **body: object) -> RecordedOp:
        op, payload = sequenced(self.fsm, author, **body)
        op.first_offset, op.last_offset = self.offset, self.offset + size
        self.offset += size
        assert self.fsm.apply(op, payload) is Outcome.APPLIED
        self.ops.append((op, payload))
        return op

    def replay(self) -> tuple[FSM, list[RecordedOp]]:
        """An FSM from this log's hints, fed every op in log order as a player is (skipping
        those outside the hinted segments), and the ops it applied."""
        replay, applied = FSM.from_hints(self.fsm.build_hints()), []
        for op, payload in self.ops:
            try:
                replay.apply(op, payload)
            except (WrongSeqNoError, NotHintedAuthorError):
                continue
            applied.append(op)
        return replay, applied


def write(fnode: int) -> dict[str, object]:
    return {"write": RecordedOp.Write(fnode=fnode, length=1)}


def test_a_long_lived_file_gets_a_segment_per_distant_run_and_replay_skips_between() -> None:
    log = OffsetLog()
    manifest = log.add(100, **create("/MANIFEST")).seq_no
    log.add(100, **write(manifest))
    dead: list[int] = []
    for i in range(3):  # A compaction's output, later compacted away: 6 MiB of dead history.
        sst = log.add(100, **create(f"/{i}.sst")).seq_no
        dead += [sst] + [log.add(MIB, **write(sst)).seq_no for _ in range(6)]
        log.add(100, **write(manifest))
        dead.append(log.add(100, unlink=RecordedOp.Link(fnode=sst, path=f"/{i}.sst")).seq_no)
    kept = log.add(100, **create("/kept")).seq_no
    log.add(100, **write(kept))

    segments = log.fsm.live_nodes[manifest].segments
    assert [(s.first_seq_no, s.last_seq_no) for s in segments] == [
        (manifest, manifest + 1),
        *[(seq_no, seq_no) for seq_no in (manifest + 9, manifest + 18, manifest + 27)],
    ]
    assert all(s.author == A and s.last_offset > s.first_offset for s in segments)
    replay, applied = log.replay()
    assert not {op.seq_no for op in applied} & set(dead)  # No byte of dead history read.
    assert replay.links == log.fsm.links and not replay.has_remaining_hints
    assert (replay.next_seq_no, replay.next_checksum) == (
        log.fsm.next_seq_no,
        log.fsm.next_checksum,
    )


def test_near_ops_of_a_file_stay_one_segment() -> None:
    log = OffsetLog()
    manifest = log.add(100, **create("/MANIFEST")).seq_no
    for _ in range(10):  # Other files' ops between, but never SEGMENT_GAP_BYTES of them.
        log.add(SEGMENT_GAP_BYTES // 2)
        log.add(100, **write(manifest))
    assert len(log.fsm.live_nodes[manifest].segments) == 1


def test_a_large_op_is_no_gap() -> None:
    # Gaps are measured from the end of the file's previous op: one large write (a Go
    # recorder's, say) followed by the next op of the file skips nothing, so it is one segment.
    log = OffsetLog()
    manifest = log.add(100, **create("/MANIFEST")).seq_no
    log.add(2 * SEGMENT_GAP_BYTES, **write(manifest))
    log.add(100, **write(manifest))
    assert len(log.fsm.live_nodes[manifest].segments) == 1


def test_segments_of_a_file_are_bounded_keeping_the_largest_gaps() -> None:
    log = OffsetLog()
    manifest = log.add(100, **create("/MANIFEST")).seq_no
    gaps = [SEGMENT_GAP_BYTES + (i * 7919 % 97) * MIB for i in range(1, 2 * SEGMENTS_PER_FNODE_MAX)]
    starts = []
    for gap in gaps:
        log.add(gap)  # A no-op standing for other files' history.
        starts.append((gap, log.add(100, **write(manifest)).seq_no))
    segments = log.fsm.live_nodes[manifest].segments
    assert len(segments) == SEGMENTS_PER_FNODE_MAX
    # The merges took the smallest gaps: the segments left begin after the largest ones.
    widest = sorted(starts, reverse=True)[: SEGMENTS_PER_FNODE_MAX - 1]
    assert [s.first_seq_no for s in segments[1:]] == sorted(seq_no for _, seq_no in widest)
    replay, applied = log.replay()
    assert {op.seq_no for op in applied} >= {seq_no for _, seq_no in starts}
    assert (replay.next_seq_no, replay.next_checksum) == (
        log.fsm.next_seq_no,
        log.fsm.next_checksum,
    )


def test_bounding_segments_never_merges_across_a_hand_off() -> None:
    log = OffsetLog()
    manifest = log.add(100, **create("/MANIFEST")).seq_no
    for author in (A, B):
        if author == B:
            # B takes the log over: its hand-off, then at once a write. The gap between A's
            # last segment and B's first is the smallest of all, yet theirs never merge.
            log.add(100, author=B)
            log.add(100, author=B, **write(manifest))
        for _ in range(SEGMENTS_PER_FNODE_MAX):
            log.add(2 * SEGMENT_GAP_BYTES, author=author)
            log.add(100, author=author, **write(manifest))
    segments = log.fsm.live_nodes[manifest].segments
    assert len(segments) == SEGMENTS_PER_FNODE_MAX
    authors = [s.author for s in segments]
    assert authors == sorted(authors) and set(authors) == {A, B}  # A's run, then B's.
    replay, applied = log.replay()
    assert sum(op.author == B for op in applied) >= SEGMENTS_PER_FNODE_MAX
    assert (replay.next_seq_no, replay.next_checksum) == (
        log.fsm.next_seq_no,
        log.fsm.next_checksum,
    )
