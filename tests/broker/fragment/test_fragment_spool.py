"""Spool: one test per transition, the refusals, compression, I/O faults, and a property test
that a primary and a replica fed the same requests stay identical and agree with a model."""

from __future__ import annotations

import errno
import hashlib
import os
import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.fragment.codecs import CompressionCodec, decompress
from broker.fragment.naming import content_name, content_sum, extension_of, sum_from_digest
from broker.fragment.spool import (
    CompletedSpool,
    ContentDeltaError,
    LocalFragment,
    Outcome,
    RollReason,
    Spool,
    SpoolClosedError,
    SpoolInvariantError,
    SpoolPhase,
    SpoolRequestError,
    compress_file,
)
from broker.fragment.spool_blocks import BlockPool, BlockSpoolFile
from broker.fragment.spool_file import MemorySpoolFile, SpoolFile, TempSpoolFile
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.protocol.validate import ValidationError

JOURNAL = "a/journal"
CLOCK_S = 1_700_000_000.0
USABLE_CODECS = [c for c in CompressionCodec if c is not CompressionCodec.INVALID]
COMPRESSING_CODECS = [c for c in USABLE_CODECS if c is not CompressionCodec.NONE]

REG_EMPTY = label_set()
REG_FOO = label_set([("reg", "foo")])
REG_BAR = label_set([("reg", "bar")])


@dataclass
class Recorder:
    """A SpoolObserver that keeps what it is told."""

    commits: list[LocalFragment] = field(default_factory=list)
    completes: list[CompletedSpool] = field(default_factory=list)

    def on_commit(self, fragment: LocalFragment) -> None:
        self.commits.append(fragment)

    def on_complete(self, completed: CompletedSpool) -> None:
        self.completes.append(completed)


def new_spool(
    *,
    new_file: Callable[[], SpoolFile] = MemorySpoolFile,
    batch: int = 0,
) -> tuple[Spool, Recorder]:
    recorder = Recorder()
    spool = Spool(
        JOURNAL,
        recorder,
        new_file=new_file,
        clock=lambda: CLOCK_S,
        compress_batch_bytes_min=batch,
    )
    return spool, recorder


def chunk(data: bytes, delta: int) -> pb.ReplicateRequest:
    return pb.ReplicateRequest(content=data, content_delta=delta)


def propose(fragment: pb.Fragment, registers: pb.LabelSet) -> pb.ReplicateRequest:
    return pb.ReplicateRequest(proposal=fragment, registers=registers, acknowledge=True)


def frag(
    begin: int,
    end: int,
    content: bytes = b"",
    codec: CompressionCodec = CompressionCodec.NONE,
    backing_store: str = "",
) -> pb.Fragment:
    return pb.Fragment(
        journal=JOURNAL,
        begin=begin,
        end=end,
        sum=content_sum(content),
        compression_codec=int(codec),  # type: ignore[arg-type]
        backing_store=backing_store,
    )


def stream(spool: Spool, *pieces: bytes, primary: bool = False) -> None:
    for piece in pieces:
        spool.apply(chunk(piece, spool.delta), primary)


def commit(spool: Spool, registers: pb.LabelSet, primary: bool = False) -> None:
    result = spool.apply(propose(spool.next(), registers), primary)
    assert result.outcome is Outcome.COMMITTED


def read_all(file: SpoolFile) -> bytes:
    return file.pread(file.size(), 0)


def snapshot(spool: Spool) -> tuple[object, ...]:
    """Everything observable about a spool, to show that a refused request changed nothing."""
    local = spool.local_fragment
    return (
        spool.fragment.SerializeToString(),
        spool.registers.SerializeToString(),
        spool.delta,
        spool.next().SerializeToString(),
        spool.phase,
        spool.first_append_time,
        read_all(local.file) if local else None,
    )


def test_new_spool_is_empty_at_offset_zero() -> None:
    spool, recorder = new_spool()
    assert spool.fragment == frag(0, 0)
    assert spool.next() == spool.fragment
    assert spool.registers == REG_EMPTY
    assert (spool.delta, spool.phase, spool.local_fragment) == (0, SpoolPhase.EMPTY, None)
    assert recorder == Recorder()


def test_spool_rejects_an_invalid_journal_name() -> None:
    with pytest.raises(ValidationError, match=r"^journal: "):
        Spool("no", Recorder(), new_file=MemorySpoolFile)


def test_content_appends_at_the_pending_offset() -> None:
    spool, recorder = new_spool()
    first = spool.apply(chunk(b"some", 0), False)
    second = spool.apply(chunk(b" content", 4), False)

    assert (first.outcome, first.response) == (Outcome.CONTENT_APPENDED, None)
    assert (second.outcome, second.response) == (Outcome.CONTENT_APPENDED, None)
    assert (spool.delta, spool.phase) == (12, SpoolPhase.STREAMING)
    assert spool.fragment == frag(0, 0)  # Nothing committed yet.
    assert spool.next() == frag(0, 12, b"some content")
    assert recorder.commits == []


def test_non_contiguous_content_delta_is_refused_and_changes_nothing() -> None:
    spool, _ = new_spool()
    spool.apply(chunk(b"foo", 0), False)
    before = snapshot(spool)

    with pytest.raises(ContentDeltaError) as caught:
        spool.apply(chunk(b"bar", 2), False)

    assert (caught.value.expected, caught.value.got) == (3, 2)
    assert str(caught.value) == "content_delta: must equal the pending delta 3 (got 2)"
    assert snapshot(spool) == before


def test_commit_folds_pending_content_into_the_fragment() -> None:
    spool, recorder = new_spool()
    stream(spool, b"an init", b"ial write ")
    proposal = spool.next()

    result = spool.apply(propose(proposal, REG_FOO), False)

    assert result.outcome is Outcome.COMMITTED
    assert result.response == pb.ReplicateResponse(status=pb.OK)
    assert spool.fragment == frag(0, 17, b"an initial write ") == proposal
    assert spool.registers == REG_FOO
    assert (spool.delta, spool.phase) == (0, SpoolPhase.HOLDING)
    assert spool.first_append_time == CLOCK_S
    assert [c.fragment for c in recorder.commits] == [proposal]
    assert read_all(recorder.commits[0].file) == b"an initial write "
    assert recorder.completes == []


def test_committed_sum_is_sha1_of_exactly_the_committed_bytes() -> None:
    spool, _ = new_spool()
    stream(spool, b"first ")
    commit(spool, REG_EMPTY)
    stream(spool, b"ROLLED BACK")
    spool.apply(propose(spool.fragment, REG_EMPTY), False)
    stream(spool, b"second")
    commit(spool, REG_EMPTY)

    expected = hashlib.sha1(b"first second").digest()
    assert spool.fragment.sum == sum_from_digest(expected)
    local = spool.local_fragment
    assert local is not None
    assert local.file.pread(spool.content_length, 0) == b"first second"


def test_rollback_drops_pending_content_and_restores_the_sum() -> None:
    spool, recorder = new_spool()
    stream(spool, b"kept")
    commit(spool, REG_FOO)
    committed = spool.fragment
    stream(spool, b"WHO", b"OPS!")

    result = spool.apply(propose(committed, REG_FOO), False)

    assert (result.outcome, result.response) == (
        Outcome.ROLLED_BACK,
        pb.ReplicateResponse(status=pb.OK),
    )
    assert (spool.fragment, spool.registers) == (committed, REG_FOO)
    assert (spool.delta, spool.phase) == (0, SpoolPhase.HOLDING)
    assert spool.next() == committed
    # The next content lands where the rolled-back bytes were.
    stream(spool, b" more")
    assert spool.next() == frag(0, 9, b"kept more")
    assert len(recorder.commits) == 1


def test_re_proposing_the_committed_fragment_is_a_no_op() -> None:
    spool, recorder = new_spool()
    stream(spool, b"abcd")
    commit(spool, REG_FOO)
    before = snapshot(spool)

    result = spool.apply(propose(spool.fragment, REG_FOO), False)

    assert result.outcome is Outcome.ROLLED_BACK
    assert snapshot(spool) == before
    assert len(recorder.commits) == 1


def test_roll_completes_the_fragment_and_starts_an_empty_one() -> None:
    spool, recorder = new_spool()
    stream(spool, b"an initial write ")
    commit(spool, REG_FOO)
    stream(spool, b"pending, never committed")
    completed_fragment = spool.fragment

    rolled = frag(17, 17, codec=CompressionCodec.ZSTANDARD, backing_store="s3://bucket/")
    result = spool.apply(propose(rolled, REG_FOO), False)

    assert (result.outcome, result.response) == (Outcome.ROLLED, pb.ReplicateResponse(status=pb.OK))
    assert spool.fragment == rolled
    assert (spool.registers, spool.delta, spool.phase) == (REG_FOO, 0, SpoolPhase.EMPTY)
    assert (spool.first_append_time, spool.local_fragment) == (None, None)
    [completed] = recorder.completes
    assert completed.fragment == completed_fragment
    assert completed.registers == REG_FOO
    assert completed.first_append_time == CLOCK_S
    assert completed.primary is False
    # Exactly the committed bytes: pending bytes were cut off before the hand-over.
    assert read_all(completed.content_file) == b"an initial write "
    assert (completed.compressed_file, completed.compressed_length) == (None, 0)


def test_roll_of_an_empty_fragment_does_not_complete() -> None:
    spool, recorder = new_spool()
    stream(spool, b"rolled back")
    spool.apply(propose(spool.fragment, REG_EMPTY), False)
    content_file = spool._file  # The file written (then rolled back) must not leak.
    assert content_file is not None

    result = spool.apply(propose(frag(0, 0, codec=CompressionCodec.GZIP), REG_EMPTY), False)

    assert result.outcome is Outcome.ROLLED
    assert spool.fragment == frag(0, 0, codec=CompressionCodec.GZIP)
    assert recorder.completes == []
    assert content_file.closed


def test_roll_proposal_equal_to_the_empty_fragment_only_drops_pending() -> None:
    spool, recorder = new_spool()
    stream(spool, b"pending")

    result = spool.apply(propose(frag(0, 0), REG_EMPTY), False)

    assert result.outcome is Outcome.ROLLED_BACK
    assert (spool.fragment, spool.delta) == (frag(0, 0), 0)
    assert recorder.completes == []


def test_proposals_match_whether_or_not_a_zero_sum_is_present() -> None:
    # Go always sends Fragment.sum (a non-nullable struct); Python may leave a zero sum unset.
    # Presence carries no meaning, so both forms of the same fragment must match.
    spool, recorder = _holding_and_streaming()
    end = spool.fragment.end
    absent = pb.Fragment(journal=JOURNAL, begin=end, end=end, compression_codec=pb.NONE)
    assert not absent.HasField("sum")

    assert spool.apply(propose(absent, REG_FOO), False).outcome is Outcome.ROLLED
    assert spool.apply(propose(absent, REG_FOO), False).outcome is Outcome.ROLLED_BACK
    assert spool.apply(propose(frag(end, end), REG_FOO), False).outcome is Outcome.ROLLED_BACK
    assert len(recorder.completes) == 1


def test_roll_beyond_the_pending_end_takes_the_proposed_registers() -> None:
    spool, recorder = new_spool()
    stream(spool, b"abc")
    commit(spool, REG_FOO)
    stream(spool, b"de")

    result = spool.apply(propose(frag(100, 100), REG_BAR), False)

    assert (result.outcome, result.response) == (Outcome.ROLLED, pb.ReplicateResponse(status=pb.OK))
    assert (spool.fragment, spool.registers, spool.delta) == (frag(100, 100), REG_BAR, 0)
    assert [c.fragment for c in recorder.completes] == [frag(0, 3, b"abc")]


def test_catch_up_rolls_to_a_greater_offset_and_answers_mismatch() -> None:
    # A peer holds content through offset 9 that this spool never saw: the spool rolls forward
    # to 9 and reports it, so that the primary re-proposes an empty fragment there.
    spool, recorder = new_spool()
    stream(spool, b"abcd")
    commit(spool, REG_FOO)
    stream(spool, b"efgh")

    result = spool.apply(propose(frag(1, 9, b"whatever"), REG_BAR), False)

    assert result.outcome is Outcome.CAUGHT_UP
    assert result.response == pb.ReplicateResponse(
        status=pb.PROPOSAL_MISMATCH, fragment=frag(9, 9), registers=REG_BAR
    )
    assert (spool.fragment, spool.registers, spool.delta) == (frag(9, 9), REG_BAR, 0)
    assert [read_all(c.content_file) for c in recorder.completes] == [b"abcd"]
    # The primary's re-proposal at the new offset now synchronizes.
    assert spool.apply(propose(frag(9, 9), REG_BAR), False).outcome is Outcome.ROLLED_BACK


def _wrong_begin(p: pb.Fragment) -> None:
    p.begin += 1


def _wrong_end(p: pb.Fragment) -> None:
    p.end -= 1  # Shorter: a longer end would be beyond the pending end (a catch-up).


def _wrong_sum(p: pb.Fragment) -> None:
    p.sum.part1 ^= 1


def _wrong_codec(p: pb.Fragment) -> None:
    p.compression_codec = pb.GZIP


def _wrong_store(p: pb.Fragment) -> None:
    p.backing_store = "s3://other/"


WRONG_FIELDS = {
    "begin": _wrong_begin,
    "end": _wrong_end,
    "sum": _wrong_sum,
    "codec": _wrong_codec,
    "backing_store": _wrong_store,
}


def _holding_and_streaming() -> tuple[Spool, Recorder]:
    spool, recorder = new_spool()
    stream(spool, b"committed")
    commit(spool, REG_FOO)
    stream(spool, b" pending")
    return spool, recorder


def _assert_mismatch_changes_nothing(
    spool: Spool, recorder: Recorder, request: pb.ReplicateRequest
) -> None:
    before = snapshot(spool)
    commits, completes = len(recorder.commits), len(recorder.completes)

    result = spool.apply(request, False)

    assert result.outcome is Outcome.MISMATCH
    assert result.response == pb.ReplicateResponse(
        status=pb.PROPOSAL_MISMATCH, fragment=spool.fragment, registers=REG_FOO
    )
    assert snapshot(spool) == before
    assert (len(recorder.commits), len(recorder.completes)) == (commits, completes)


@pytest.mark.parametrize("wrong", WRONG_FIELDS.values(), ids=WRONG_FIELDS.keys())
def test_commit_proposal_with_a_wrong_field_mismatches(
    wrong: Callable[[pb.Fragment], None],
) -> None:
    spool, recorder = _holding_and_streaming()
    proposal = spool.next()
    wrong(proposal)
    _assert_mismatch_changes_nothing(spool, recorder, propose(proposal, REG_BAR))


@pytest.mark.parametrize("wrong", WRONG_FIELDS.values(), ids=WRONG_FIELDS.keys())
def test_rollback_proposal_with_a_wrong_field_mismatches(
    wrong: Callable[[pb.Fragment], None],
) -> None:
    spool, recorder = _holding_and_streaming()
    proposal = spool.fragment
    wrong(proposal)
    _assert_mismatch_changes_nothing(spool, recorder, propose(proposal, REG_FOO))


def test_rollback_proposal_with_other_registers_mismatches() -> None:
    spool, recorder = _holding_and_streaming()
    _assert_mismatch_changes_nothing(spool, recorder, propose(spool.fragment, REG_BAR))


def test_commit_proposal_without_pending_content_and_other_registers_mismatches() -> None:
    # Register updates ride on appended bytes only; without them the proposal is a rollback.
    spool, recorder = new_spool()
    stream(spool, b"abcd")
    commit(spool, REG_FOO)
    _assert_mismatch_changes_nothing(spool, recorder, propose(spool.next(), REG_BAR))


def test_roll_proposal_at_the_end_with_other_registers_mismatches() -> None:
    spool, recorder = _holding_and_streaming()
    end = spool.fragment.end
    _assert_mismatch_changes_nothing(spool, recorder, propose(frag(end, end), REG_BAR))


def test_roll_proposal_at_the_end_with_a_non_zero_sum_mismatches() -> None:
    spool, recorder = _holding_and_streaming()
    end = spool.fragment.end
    bad = frag(end, end)
    bad.sum.part3 = 7
    _assert_mismatch_changes_nothing(spool, recorder, propose(bad, REG_FOO))


def test_proposal_inside_the_pending_range_mismatches() -> None:
    spool, recorder = _holding_and_streaming()  # Committed [0, 9), pending through 17.
    _assert_mismatch_changes_nothing(spool, recorder, propose(frag(12, 12), REG_FOO))


def test_stale_proposal_behind_the_fragment_mismatches() -> None:
    spool, recorder = _holding_and_streaming()
    _assert_mismatch_changes_nothing(spool, recorder, propose(frag(0, 4, b"comm"), REG_FOO))


INVALID_REQUESTS = {
    "empty chunk": (pb.ReplicateRequest(content_delta=0), r"^expected content or a proposal"),
    "registers without proposal": (
        pb.ReplicateRequest(content=b"x", registers=REG_FOO),
        r"^registers: unexpected without a proposal",
    ),
    "proposal without registers": (
        pb.ReplicateRequest(proposal=frag(0, 0)),
        r"^registers: expected with a proposal",
    ),
    "other journal": (
        propose(pb.Fragment(journal="other/journal", compression_codec=pb.NONE), REG_FOO),
        r"^proposal\.journal: must be the spool's journal 'a/journal'",
    ),
    "begin after end": (propose(frag(5, 4), REG_FOO), r"^proposal\.end: "),
    "negative offsets": (propose(frag(-4, -4), REG_FOO), r"^proposal\.begin: must be >= 0"),
    "invalid codec": (
        propose(pb.Fragment(journal=JOURNAL, compression_codec=pb.INVALID), REG_FOO),
        r"^proposal\.compression_codec: ",
    ),
    "content with proposal": (
        pb.ReplicateRequest(proposal=frag(0, 0), registers=REG_FOO, content=b"x"),
        r"^content: unexpected with a proposal",
    ),
    "content_delta with proposal": (
        pb.ReplicateRequest(proposal=frag(0, 0), registers=REG_FOO, content_delta=3),
        r"^content_delta: unexpected with a proposal",
    ),
    "invalid registers": (
        propose(frag(0, 0), pb.LabelSet(labels=[pb.Label(name="b!", value="x")])),
        r"^registers\.labels\[0\]\.name: ",
    ),
}


@pytest.mark.parametrize(
    ("request_", "message"), INVALID_REQUESTS.values(), ids=INVALID_REQUESTS.keys()
)
def test_invalid_request_raises_and_changes_nothing(
    request_: pb.ReplicateRequest, message: str
) -> None:
    spool, recorder = _holding_and_streaming()
    before = snapshot(spool)
    completes = len(recorder.completes)

    with pytest.raises(ValidationError, match=message):
        spool.apply(request_, False)

    assert snapshot(spool) == before
    assert len(recorder.completes) == completes


def test_content_beyond_the_last_int64_offset_is_refused() -> None:
    spool, _ = new_spool()
    last = (1 << 63) - 1
    spool.apply(propose(frag(last - 2, last - 2), REG_EMPTY), False)
    stream(spool, b"ab")
    before = snapshot(spool)

    with pytest.raises(SpoolRequestError, match=r"^content: would extend the journal to offset"):
        spool.apply(chunk(b"c", 2), False)

    assert snapshot(spool) == before


def test_closed_spool_refuses_requests_and_closed_its_files() -> None:
    spool, _ = _holding_and_streaming()
    content_file = spool._file
    assert content_file is not None

    spool.close()
    spool.close()  # Idempotent.

    assert spool.phase is SpoolPhase.CLOSED
    assert content_file.closed
    with pytest.raises(SpoolClosedError):
        spool.apply(chunk(b"x", 0), False)


def test_content_file_cut_underneath_the_spool_trips_an_invariant() -> None:
    # Invariants are checked with explicit raises, so `python -O` keeps them.
    spool, _ = _holding_and_streaming()
    local = spool.local_fragment
    assert local is not None
    local.file.truncate(2)  # Fewer bytes than the fragment commits to.

    with pytest.raises(SpoolInvariantError, match="content file holds 2 bytes, fewer than 9"):
        spool.apply(propose(spool.fragment, REG_FOO), False)


def test_must_apply_raises_when_a_request_mismatches() -> None:
    spool, _ = _holding_and_streaming()
    spool.must_apply(propose(spool.fragment, REG_FOO))  # A rollback: fine.
    with pytest.raises(SpoolInvariantError, match="mismatched"):
        spool.must_apply(propose(spool.fragment, REG_BAR))


# --- Compression ------------------------------------------------------------------------------


def _write_fragment_with_rollbacks(spool: Spool, primary: bool) -> bytes:
    committed = b""
    for index in range(12):
        piece = (b"record %d of the fragment\n" % index) * (index + 1)
        stream(spool, piece[:7], piece[7:], primary=primary)
        if index % 4 == 3:
            spool.apply(propose(spool.fragment, spool.registers), primary)  # Roll back.
        else:
            commit(spool, REG_FOO, primary)
            committed += piece
    return committed


@pytest.mark.parametrize("batch", [0, 100, 1 << 20], ids=["each-commit", "batched", "at-roll"])
@pytest.mark.parametrize("codec", USABLE_CODECS, ids=lambda c: c.name)
def test_primary_compresses_committed_content(codec: CompressionCodec, batch: int) -> None:
    spool, recorder = new_spool(batch=batch)
    spool.apply(propose(frag(0, 0, codec=codec), REG_EMPTY), True)
    committed = _write_fragment_with_rollbacks(spool, primary=True)
    end = spool.fragment.end

    spool.apply(propose(frag(end, end, codec=codec), REG_FOO), True)

    [completed] = recorder.completes
    assert completed.primary is True
    assert read_all(completed.content_file) == committed
    if codec is CompressionCodec.NONE:
        assert completed.compressed_file is None
    else:
        assert completed.compressed_file is not None
        stored = completed.compressed_file.pread(completed.compressed_length, 0)
        assert completed.compressed_length == completed.compressed_file.size()
        assert decompress(codec, stored) == committed


@pytest.mark.parametrize("codec", COMPRESSING_CODECS, ids=lambda c: c.name)
def test_replica_does_not_compress_but_can_on_demand(codec: CompressionCodec) -> None:
    spool, recorder = new_spool()
    spool.apply(propose(frag(0, 0, codec=codec), REG_EMPTY), False)
    committed = _write_fragment_with_rollbacks(spool, primary=False)
    end = spool.fragment.end
    spool.apply(propose(frag(end, end, codec=codec), REG_FOO), False)

    [completed] = recorder.completes
    assert completed.compressed_file is None
    file, length = compress_file(
        codec, completed.content_file, completed.end - completed.begin, MemorySpoolFile
    )
    assert decompress(codec, file.pread(length, 0)) == committed


def test_compression_restarts_from_the_start_when_a_replica_becomes_primary() -> None:
    codec = CompressionCodec.GZIP
    spool, recorder = new_spool()
    spool.apply(propose(frag(0, 0, codec=codec), REG_EMPTY), False)
    stream(spool, b"as a replica; ")
    commit(spool, REG_EMPTY, primary=False)
    stream(spool, b"then as primary", primary=True)
    commit(spool, REG_EMPTY, primary=True)
    spool.apply(propose(frag(29, 29, codec=codec), REG_EMPTY), True)

    [completed] = recorder.completes
    assert completed.compressed_file is not None
    stored = completed.compressed_file.pread(completed.compressed_length, 0)
    assert decompress(codec, stored) == b"as a replica; then as primary"


# --- I/O faults -------------------------------------------------------------------------------


class FlakyFile(MemorySpoolFile):
    """A memory file whose next `fail_writes` writes and truncations fail like a broken disk."""

    def __init__(self, fail_writes: int = 0) -> None:
        super().__init__()
        self.fail_writes = fail_writes

    def _maybe_fail(self) -> None:
        if self.fail_writes:
            self.fail_writes -= 1
            raise OSError(errno.EIO, "injected I/O error")

    def pwrite(self, data: bytes, offset: int) -> None:
        self._maybe_fail()
        super().pwrite(data, offset)

    def truncate(self, length: int) -> None:
        self._maybe_fail()
        super().truncate(length)


def test_failed_content_write_changes_nothing() -> None:
    spool, _ = new_spool(new_file=lambda: MemorySpoolFile(bytes_max=8))
    stream(spool, b"12345")
    before = snapshot(spool)

    with pytest.raises(OSError) as caught:
        spool.apply(chunk(b"6789", 5), False)

    assert caught.value.errno == errno.ENOSPC
    assert snapshot(spool) == before
    stream(spool, b"678")  # What fits still goes.
    assert spool.next() == frag(0, 8, b"12345678")


def test_failed_compression_fails_the_commit_and_is_rebuilt_on_retry() -> None:
    files: list[FlakyFile] = []

    def new_file() -> SpoolFile:
        # The content file is created first; the first compressed file fails its first write.
        files.append(FlakyFile(fail_writes=1 if len(files) == 1 else 0))
        return files[-1]

    # Snappy writes a frame per call, so the failing write happens during the commit.
    codec = CompressionCodec.SNAPPY
    spool, recorder = new_spool(new_file=new_file)
    spool.apply(propose(frag(0, 0, codec=codec), REG_EMPTY), True)
    stream(spool, b"some content", primary=True)
    proposal = spool.next()
    before = snapshot(spool)

    with pytest.raises(OSError, match="injected"):
        spool.apply(propose(proposal, REG_FOO), True)

    assert snapshot(spool) == before
    assert files[1].closed  # The broken compression was dropped.
    assert recorder.commits == []
    commit(spool, REG_FOO, primary=True)  # A retry rebuilds compression from the content file.
    spool.apply(propose(frag(12, 12, codec=codec), REG_FOO), True)
    [completed] = recorder.completes
    assert completed.compressed_file is files[2]
    assert decompress(codec, files[2].pread(completed.compressed_length, 0)) == b"some content"


def test_failed_truncation_at_roll_changes_nothing() -> None:
    content = FlakyFile()
    spool, recorder = new_spool(new_file=lambda: content)
    stream(spool, b"abc")
    commit(spool, REG_EMPTY)
    stream(spool, b"pending")
    before = snapshot(spool)
    content.fail_writes = 1

    with pytest.raises(OSError, match="injected"):
        spool.apply(propose(frag(3, 3), REG_EMPTY), False)

    assert snapshot(spool) == before
    assert recorder.completes == []
    assert spool.apply(propose(frag(3, 3), REG_EMPTY), False).outcome is Outcome.ROLLED
    assert read_all(recorder.completes[0].content_file) == b"abc"


# --- Roll decisions of a primary ---------------------------------------------------------------


def spec(
    length: int = 1024,
    codec: CompressionCodec = CompressionCodec.NONE,
    flush_interval_s: int = 0,
) -> pb.JournalSpec.Fragment:
    out = pb.JournalSpec.Fragment(length=length, compression_codec=int(codec))  # type: ignore[arg-type]
    out.flush_interval.seconds = flush_interval_s
    return out


def _holding(content: bytes) -> Spool:
    spool, _ = new_spool()
    spool.apply(propose(frag(1000, 1000), REG_EMPTY), True)
    stream(spool, content, primary=True)
    commit(spool, REG_EMPTY, primary=True)
    return spool


def test_roll_reason_of_an_empty_fragment_is_empty() -> None:
    spool, _ = new_spool()
    assert spool.roll_reason(spec(), CLOCK_S) is RollReason.EMPTY
    # Same codec: the proposal is the current fragment, so nothing need be sent.
    assert spool.roll_proposal(spec(), CLOCK_S) == spool.fragment
    assert spool.roll_proposal(spec(codec=CompressionCodec.SNAPPY), CLOCK_S) == frag(
        0, 0, codec=CompressionCodec.SNAPPY
    )


def test_fragment_below_target_length_is_extended() -> None:
    spool = _holding(b"x" * 1023)
    assert spool.roll_reason(spec(length=1024), CLOCK_S) is None
    assert spool.roll_proposal(spec(length=1024), CLOCK_S) == spool.fragment


def test_fragment_at_target_length_rolls() -> None:
    spool = _holding(b"x" * 1024)
    assert spool.roll_reason(spec(length=1024), CLOCK_S) is RollReason.LENGTH
    assert spool.roll_proposal(spec(length=1024), CLOCK_S) == frag(2024, 2024)


def test_fragment_rolls_when_its_flush_interval_ends() -> None:
    spool = _holding(b"x")  # First appended at CLOCK_S.
    interval_s = 3600
    boundary = (int(CLOCK_S) // interval_s + 1) * interval_s
    s = spec(flush_interval_s=interval_s)
    assert spool.roll_reason(s, boundary - 0.5) is None
    assert spool.roll_reason(s, boundary) is RollReason.FLUSH_INTERVAL
    assert spool.roll_proposal(s, boundary) == frag(1001, 1001)


def test_fragment_rolls_when_the_codec_changes() -> None:
    spool = _holding(b"x")
    s = spec(codec=CompressionCodec.GZIP)
    assert spool.roll_reason(s, CLOCK_S) is RollReason.CODEC
    assert spool.roll_proposal(s, CLOCK_S) == frag(1001, 1001, codec=CompressionCodec.GZIP)


def test_roll_to_offset_rolls_there_and_must_not_go_back() -> None:
    spool = _holding(b"x")
    assert spool.roll_reason(spec(), CLOCK_S, roll_to_offset=5000) is RollReason.ROLL_TO_OFFSET
    assert spool.roll_proposal(spec(), CLOCK_S, roll_to_offset=5000) == frag(5000, 5000)
    with pytest.raises(ValueError, match=r"^roll_to_offset: must be >= the spool's end 1001"):
        spool.roll_reason(spec(), CLOCK_S, roll_to_offset=1000)


def test_roll_proposal_is_accepted_by_a_synchronized_spool() -> None:
    spool = _holding(b"x" * 2048)
    proposal = spool.roll_proposal(spec(codec=CompressionCodec.ZSTANDARD), CLOCK_S)
    assert spool.apply(propose(proposal, spool.registers), True).outcome is Outcome.ROLLED


# --- Spool files ----------------------------------------------------------------------------------


def _spool_file(kind: str, tmp_path: pathlib.Path) -> SpoolFile:
    if kind == "memory":
        return MemorySpoolFile()
    if kind == "temp":
        return TempSpoolFile(str(tmp_path))
    # Blocks of 7 bytes: the writes and reads below cross block boundaries.
    pool = BlockPool(block_bytes=7) if kind == "blocks-7" else BlockPool()
    return BlockSpoolFile(pool)


@pytest.mark.parametrize("kind", ["memory", "temp", "blocks-7", "blocks-default"])
def test_spool_file_positional_io(kind: str, tmp_path: pathlib.Path) -> None:
    file = _spool_file(kind, tmp_path)
    file.pwrite(b"world", 6)  # Past the end: the gap reads as zeros.
    file.pwrite(b"hello", 0)
    assert (file.size(), file.pread(100, 0)) == (11, b"hello\x00world")
    assert file.pread(3, 8) == b"rld"
    assert file.pread(5, 20) == b""
    file.truncate(4)
    assert (file.size(), file.pread(10, 0)) == (4, b"hell")
    with pytest.raises(ValueError, match="offset: must be >= 0"):
        file.pwrite(b"x", -1)
    file.close()
    file.close()
    assert file.closed
    with pytest.raises(ValueError, match="after close"):
        file.pread(1, 0)


def test_temp_spool_file_leaves_no_directory_entry(tmp_path: pathlib.Path) -> None:
    file = TempSpoolFile(os.fspath(tmp_path))
    file.pwrite(b"content", 0)
    assert os.listdir(tmp_path) == []
    file.close()


def test_memory_spool_file_is_bounded() -> None:
    file = MemorySpoolFile(bytes_max=4)
    with pytest.raises(OSError) as caught:
        file.pwrite(b"12345", 0)
    assert caught.value.errno == errno.ENOSPC
    assert file.size() == 0


def test_spool_over_temp_files(tmp_path: pathlib.Path) -> None:
    spool, recorder = new_spool(new_file=lambda: TempSpoolFile(os.fspath(tmp_path)))
    spool.apply(propose(frag(0, 0, codec=CompressionCodec.SNAPPY), REG_EMPTY), True)
    stream(spool, b"on ", b"disk", primary=True)
    commit(spool, REG_FOO, primary=True)
    stream(spool, b" and rolled back", primary=True)
    spool.apply(propose(frag(7, 7), REG_FOO), True)

    [completed] = recorder.completes
    assert read_all(completed.content_file) == b"on disk"
    assert completed.compressed_file is not None
    stored = completed.compressed_file.pread(completed.compressed_length, 0)
    assert decompress(CompressionCodec.SNAPPY, stored) == b"on disk"
    completed.content_file.close()
    completed.compressed_file.close()
    assert os.listdir(tmp_path) == []


def test_spool_over_block_files() -> None:
    # Tiny blocks, recycled between the content and compressed files and across fragments.
    pool = BlockPool(block_bytes=3, free_blocks_max=64)
    spool, recorder = new_spool(new_file=lambda: BlockSpoolFile(pool))
    spool.apply(propose(frag(0, 0, codec=CompressionCodec.SNAPPY), REG_EMPTY), True)
    stream(spool, b"in ", b"blocks", primary=True)
    commit(spool, REG_FOO, primary=True)
    stream(spool, b" and rolled back", primary=True)
    spool.apply(propose(frag(9, 9), REG_FOO), True)
    stream(spool, b"next", primary=True)
    commit(spool, REG_FOO, primary=True)
    spool.apply(propose(frag(13, 13), REG_FOO), True)

    first, second = recorder.completes
    assert read_all(first.content_file) == b"in blocks"
    assert first.compressed_file is not None
    stored = first.compressed_file.pread(first.compressed_length, 0)
    assert decompress(CompressionCodec.SNAPPY, stored) == b"in blocks"
    assert read_all(second.content_file) == b"next"


# --- Property: primary and replica stay identical and agree with a model ------------------------


@dataclass
class Model:
    """What the spools must hold, computed without them."""

    begin: int = 0
    codec: CompressionCodec = CompressionCodec.NONE
    registers: pb.LabelSet = field(default_factory=label_set)
    committed: bytes = b""
    pending: bytes = b""
    completed: list[tuple[int, bytes, CompressionCodec]] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.begin + len(self.committed)

    def roll_to(self, offset: int, codec: CompressionCodec) -> None:
        if self.committed:
            self.completed.append((self.begin, self.committed, self.codec))
        self.begin, self.codec, self.committed, self.pending = offset, codec, b"", b""


REGISTER_CHOICES = [REG_EMPTY, REG_FOO, REG_BAR]

operations = st.lists(
    st.one_of(
        st.tuples(st.just("content"), st.binary(min_size=1, max_size=48)),
        st.tuples(st.just("commit"), st.sampled_from(REGISTER_CHOICES)),
        st.tuples(st.just("rollback")),
        st.tuples(st.just("roll"), st.sampled_from(USABLE_CODECS), st.integers(0, 40)),
        st.tuples(st.just("catch_up"), st.integers(1, 40), st.sampled_from(REGISTER_CHOICES)),
        st.tuples(st.just("bad_sum")),
    ),
    max_size=40,
)


def _request_and_expectation(
    op: tuple[object, ...], primary: Spool, model: Model
) -> tuple[pb.ReplicateRequest, Outcome]:
    """The request a primary's append machinery would send, and the outcome the model
    predicts for it."""
    kind = op[0]
    pending_end = model.end + len(model.pending)
    if kind == "content":
        data = op[1]
        assert isinstance(data, bytes)
        return chunk(data, len(model.pending)), Outcome.CONTENT_APPENDED
    if kind == "commit":
        registers = op[1]
        assert isinstance(registers, pb.LabelSet)
        if model.pending:
            expected = Outcome.COMMITTED
        else:  # Proposes the current fragment: a rollback, if registers agree.
            expected = Outcome.ROLLED_BACK if registers == model.registers else Outcome.MISMATCH
        return propose(primary.next(), registers), expected
    if kind == "rollback":
        return propose(primary.fragment, model.registers), Outcome.ROLLED_BACK
    if kind == "roll":
        codec, gap = op[1], op[2]
        assert isinstance(codec, CompressionCodec) and isinstance(gap, int)
        offset = model.end + gap
        if offset > pending_end:
            expected = Outcome.ROLLED
        elif gap:
            expected = Outcome.MISMATCH  # Inside the pending range.
        elif not model.committed and codec is model.codec:
            expected = Outcome.ROLLED_BACK  # The current empty fragment.
        else:
            expected = Outcome.ROLLED
        return propose(frag(offset, offset, codec=codec), model.registers), expected
    if kind == "catch_up":
        beyond, registers = op[1], op[2]
        assert isinstance(beyond, int) and isinstance(registers, pb.LabelSet)
        proposal = frag(model.begin, pending_end + beyond, b"content held elsewhere")
        return propose(proposal, registers), Outcome.CAUGHT_UP
    proposal = primary.next()
    proposal.sum.part2 ^= 1
    return propose(proposal, REG_FOO), Outcome.MISMATCH


def _advance(
    model: Model, op: tuple[object, ...], request: pb.ReplicateRequest, outcome: Outcome
) -> None:
    if outcome is Outcome.CONTENT_APPENDED:
        model.pending += request.content
    elif outcome is Outcome.COMMITTED:
        model.committed += model.pending
        model.pending = b""
        model.registers = request.registers
    elif outcome is Outcome.ROLLED_BACK:
        model.pending = b""
    elif outcome is Outcome.ROLLED or outcome is Outcome.CAUGHT_UP:
        if request.proposal.end > model.end + len(model.pending):
            model.registers = request.registers
        model.roll_to(request.proposal.end, CompressionCodec(request.proposal.compression_codec))


def _check_completion(
    completed: CompletedSpool, expected: tuple[int, bytes, CompressionCodec]
) -> None:
    begin, content, codec = expected
    assert read_all(completed.content_file) == content
    # A fragment's name is a function of its content (and where it begins).
    assert content_name(completed.fragment) == "%016x-%016x-%s%s" % (  # noqa: UP031
        begin,
        begin + len(content),
        hashlib.sha1(content).hexdigest(),
        extension_of(codec),
    )
    if completed.compressed_file is not None:
        stored = completed.compressed_file.pread(completed.compressed_length, 0)
        assert decompress(codec, stored) == content


@given(ops=operations, batch=st.sampled_from([0, 32, 1 << 20]))
def test_primary_and_replica_stay_identical_and_match_the_model(
    ops: list[tuple[object, ...]], batch: int
) -> None:
    primary, primary_seen = new_spool(batch=batch)
    replica, replica_seen = new_spool()
    model = Model()

    for op in ops:
        request, expected = _request_and_expectation(op, primary, model)
        on_primary = primary.apply(request, True)
        on_replica = replica.apply(request, False)

        assert on_primary.outcome is expected, op
        assert on_primary == on_replica
        _advance(model, op, request, expected)

        for spool in (primary, replica):
            assert spool.fragment == frag(model.begin, model.end, model.committed, model.codec)
            assert spool.fragment.sum == content_sum(model.committed)
            assert spool.registers == model.registers
            assert spool.delta == len(model.pending)
            assert spool.next().sum == content_sum(model.committed + model.pending)
            local = spool.local_fragment
            if model.committed:
                assert local is not None
                assert local.file.pread(len(model.committed), 0) == model.committed
            else:
                assert local is None

    for seen in (primary_seen, replica_seen):
        assert len(seen.completes) == len(model.completed)
        for completed, expected_completion in zip(seen.completes, model.completed, strict=True):
            _check_completion(completed, expected_completion)
    # Only the primary compresses, and it does so for every codec but NONE.
    for completed in primary_seen.completes:
        compressing = completed.fragment.compression_codec != pb.NONE
        assert (completed.compressed_file is not None) is compressing
    assert all(c.compressed_file is None for c in replica_seen.completes)
    assert [c.fragment for c in primary_seen.commits] == [c.fragment for c in replica_seen.commits]
