"""Spool.apply_content, the primary's fast path for content chunks: it does exactly what apply()
of the equivalent ReplicateRequest does, refuses what apply() refuses (changing nothing), and
takes slices of larger buffers without copies."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.fragment.naming import content_sum
from broker.fragment.spool import (
    CompletedSpool,
    ContentDeltaError,
    LocalFragment,
    Outcome,
    Spool,
    SpoolClosedError,
    SpoolRequestError,
)
from broker.fragment.spool_file import MemorySpoolFile
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set

JOURNAL = "a/journal"
REGS = label_set([("reg", "x")])


class _Sink:
    def on_commit(self, fragment: LocalFragment) -> None:
        pass

    def on_complete(self, completed: CompletedSpool) -> None:
        completed.content_file.close()


def new_spool() -> Spool:
    return Spool(JOURNAL, _Sink(), new_file=MemorySpoolFile, clock=lambda: 1.0)


def state(spool: Spool) -> tuple[object, ...]:
    local = spool.local_fragment
    content = local.file.pread(local.end - local.begin, 0) if local else b""
    return (spool.fragment, spool.registers, spool.delta, spool.next(), spool.phase, content)


@given(
    appends=st.lists(
        st.tuples(st.lists(st.binary(min_size=1, max_size=64), max_size=4), st.booleans()),
        max_size=8,
    )
)
def test_apply_content_is_apply_of_a_content_request(
    appends: list[tuple[list[bytes], bool]],
) -> None:
    fast, slow = new_spool(), new_spool()
    for chunks, commit in appends:
        for data in chunks:
            buffer = memoryview(b"<" + data + b">")[1:-1]  # A slice of a larger buffer.
            assert fast.apply_content(buffer, fast.delta).outcome is Outcome.CONTENT_APPENDED
            request = pb.ReplicateRequest(content=data, content_delta=slow.delta)
            assert slow.apply(request, primary=True).outcome is Outcome.CONTENT_APPENDED
        end = fast.next() if commit else fast.fragment
        for spool in (fast, slow):
            spool.apply(pb.ReplicateRequest(proposal=end, registers=REGS), primary=True)
        assert state(fast) == state(slow)


def test_committed_sum_covers_content_given_as_slices() -> None:
    spool = new_spool()
    data = bytearray(b"0123456789" * 100)
    spool.apply_content(memoryview(data)[:500], 0)
    spool.apply_content(memoryview(data)[500:], 500)
    proposal = spool.next()
    assert proposal.sum == content_sum(bytes(data))
    spool.apply(pb.ReplicateRequest(proposal=proposal, registers=REGS), primary=True)
    local = spool.local_fragment
    assert local is not None and local.file.pread(1000, 0) == bytes(data)


@pytest.mark.parametrize(
    ("content", "delta", "error", "message"),
    [
        (b"abc", 1, ContentDeltaError, "content_delta: must equal the pending delta 3 (got 1)"),
        (b"", 3, SpoolRequestError, "expected content or a proposal (got neither)"),
    ],
)
def test_refusals_change_nothing(
    content: bytes, delta: int, error: type[Exception], message: str
) -> None:
    spool = new_spool()
    spool.apply_content(b"abc", 0)
    before = state(spool)
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        spool.apply_content(content, delta)
    assert state(spool) == before


def test_apply_content_after_close_is_refused() -> None:
    spool = new_spool()
    spool.close()
    with pytest.raises(SpoolClosedError):
        spool.apply_content(b"x", 0)
