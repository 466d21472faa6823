"""spool_roll: the primary's roll policy as pure functions of a fragment, its first append time
and the journal's spec."""

from __future__ import annotations

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.fragment.naming import content_sum
from broker.fragment.spool_roll import RollReason, roll_proposal, roll_reason
from broker.fragment.spool_types import SpoolInvariantError
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import ValidationError

J = "a/journal"
HOUR_S = 3600


def fragment(begin: int, end: int, codec: int = pb.NONE) -> pb.Fragment:
    return pb.Fragment(
        journal=J,
        begin=begin,
        end=end,
        sum=content_sum(b"x" * (end - begin)) if end > begin else pb.SHA1Sum(),
        compression_codec=codec,  # type: ignore[arg-type]
    )


def spec(length: int = 100, codec: int = pb.NONE, flush_s: int = 0) -> pb.JournalSpec.Fragment:
    return pb.JournalSpec.Fragment(
        length=length,
        compression_codec=codec,  # type: ignore[arg-type]
        flush_interval=Duration(seconds=flush_s),
    )


@pytest.mark.parametrize(
    ("frag", "first", "the_spec", "now", "to", "reason"),
    [
        (fragment(10, 20), 5.0, spec(), 6.0, 30, RollReason.ROLL_TO_OFFSET),
        (fragment(10, 10), None, spec(), 6.0, 0, RollReason.EMPTY),
        (fragment(10, 110), 5.0, spec(length=100), 6.0, 0, RollReason.LENGTH),
        (
            fragment(10, 20),
            1.0 * HOUR_S - 1,
            spec(flush_s=HOUR_S),
            HOUR_S,
            0,
            RollReason.FLUSH_INTERVAL,
        ),
        (fragment(10, 20), 1.0 * HOUR_S, spec(flush_s=HOUR_S), 2 * HOUR_S - 1, 0, None),
        (fragment(10, 20), 5.0, spec(codec=pb.GZIP), 6.0, 0, RollReason.CODEC),
        (fragment(10, 20), 5.0, spec(), 6.0, 0, None),
    ],
)
def test_roll_reason(
    frag: pb.Fragment,
    first: float | None,
    the_spec: pb.JournalSpec.Fragment,
    now: float,
    to: int,
    reason: RollReason | None,
) -> None:
    assert roll_reason(frag, first, the_spec, now, to) is reason


def test_roll_to_an_offset_below_the_end_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^roll_to_offset: must be >= the spool's end 20"):
        roll_reason(fragment(10, 20), 5.0, spec(), 6.0, 15)


def test_a_non_empty_fragment_needs_its_first_append_time_under_a_flush_interval() -> None:
    with pytest.raises(SpoolInvariantError):
        roll_reason(fragment(10, 20), None, spec(flush_s=60), 6.0)


def test_roll_proposal_is_a_copy_or_the_empty_fragment_at_the_end() -> None:
    current = fragment(10, 20, codec=pb.NONE)
    same = roll_proposal(current, 5.0, spec(), 6.0)
    assert same == current and same is not current
    same.end = 99
    assert current.end == 20  # A copy: the spool's fragment is untouched.

    rolled = roll_proposal(current, 5.0, spec(codec=pb.ZSTANDARD), 6.0)
    assert (rolled.begin, rolled.end, rolled.compression_codec) == (20, 20, pb.ZSTANDARD)
    assert rolled.sum == pb.SHA1Sum()
    assert roll_proposal(current, 5.0, spec(), 6.0, 50).begin == 50


def test_roll_proposal_refuses_an_invalid_codec() -> None:
    with pytest.raises(ValidationError, match=r"^compression_codec: "):
        roll_proposal(fragment(10, 10), None, spec(codec=pb.INVALID), 6.0)
