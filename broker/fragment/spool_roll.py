"""When a primary rolls its spool to a new fragment, and the proposal that does it.

A primary extends the current fragment append after append until one of the reasons below says
to start a new one. Every broker of the route applies the same roll proposal (spool.py), so this
policy runs on the primary only, once before each append and at each synchronisation.

Pure functions of the spool's committed fragment, its first append time and the journal's spec.
"""

from __future__ import annotations

import enum

from broker.fragment.spool_types import ZERO_SUM, SpoolInvariantError, copy_fragment
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import at, validate_compression_codec


class RollReason(enum.Enum):
    """Why a primary should roll the spool to a new fragment before the next append."""

    ROLL_TO_OFFSET = "roll_to_offset"  # Synchronization requires a roll to a given offset.
    EMPTY = "empty"  # Empty: rolling costs nothing and adopts the journal's current spec.
    LENGTH = "length"  # The fragment reached the spec's target length.
    FLUSH_INTERVAL = "flush_interval"  # Its first append is in an earlier flush interval.
    CODEC = "codec"  # The spec's compression codec changed.


def roll_reason(
    fragment: pb.Fragment,
    first_append_time: float | None,
    spec: pb.JournalSpec.Fragment,
    now: float,
    roll_to_offset: int = 0,
) -> RollReason | None:
    """Why the primary must roll `fragment` before the next append under `spec` at Unix time
    `now`, or None if it should be extended. A non-zero `roll_to_offset` (a peer's greater
    offset learned while synchronizing) always requires a roll.

    A backing-store change is deliberately no reason: the persister picks the store when it
    persists (as in Gazette), and Go replicas drop a proposal's backing store when they roll,
    so proposing one would never synchronize with them."""
    if roll_to_offset:
        if roll_to_offset < fragment.end:
            raise ValueError(
                f"roll_to_offset: must be >= the spool's end {fragment.end} (got {roll_to_offset})"
            )
        return RollReason.ROLL_TO_OFFSET
    length = fragment.end - fragment.begin
    if length == 0:
        return RollReason.EMPTY
    if length >= spec.length:
        return RollReason.LENGTH
    # Flush intervals are aligned to the Unix epoch, so that every broker cuts fragments at the
    # same wall-clock boundaries (e.g. on the hour), whatever its spool's history.
    interval_s = spec.flush_interval.seconds
    if interval_s > 0:
        if first_append_time is None:
            raise SpoolInvariantError(
                f"fragment [{fragment.begin}, {fragment.end}) without a first append time"
            )
        if int(first_append_time) // interval_s != int(now) // interval_s:
            return RollReason.FLUSH_INTERVAL
    if spec.compression_codec != fragment.compression_codec:
        return RollReason.CODEC
    return None


def roll_proposal(
    fragment: pb.Fragment,
    first_append_time: float | None,
    spec: pb.JournalSpec.Fragment,
    now: float,
    roll_to_offset: int = 0,
) -> pb.Fragment:
    """The fragment a primary proposes before the next append: a copy of `fragment`, or (if
    `roll_reason` says so) the empty fragment at its end (or at `roll_to_offset`) with the
    spec's codec."""
    reason = roll_reason(fragment, first_append_time, spec, now, roll_to_offset)
    proposal = copy_fragment(fragment)
    if reason is None:
        return proposal
    with at("compression_codec"):
        validate_compression_codec(spec.compression_codec)
    end = roll_to_offset or fragment.end
    proposal.begin = end
    proposal.end = end
    proposal.sum.CopyFrom(ZERO_SUM)
    proposal.compression_codec = spec.compression_codec
    return proposal
