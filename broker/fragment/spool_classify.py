"""What a proposal means to a Spool: the rule book of spool.py's module docstring, as pure
functions of the spool's committed state and the request (no files, no mutation), so that the
Spool applies an outcome decided here and nothing else."""

from __future__ import annotations

from broker.fragment.spool_types import ZERO_SUM, Outcome, same_fragment
from broker.protocol import protocol_pb2 as pb


def rolled_fragment(journal: str, proposal: pb.Fragment) -> pb.Fragment:
    """The empty fragment a roll to `proposal` starts. It keeps what the proposal may change
    through a roll (codec, backing store) and nothing else."""
    return pb.Fragment(
        journal=journal,
        begin=proposal.end,
        end=proposal.end,
        sum=ZERO_SUM,
        compression_codec=proposal.compression_codec,
        backing_store=proposal.backing_store,
    )


def classify(
    fragment: pb.Fragment,
    registers: pb.LabelSet,
    delta: int,
    next_fragment: pb.Fragment,
    proposal: pb.Fragment,
    proposed_registers: pb.LabelSet,
) -> Outcome:
    """Decide what `proposal` (with `proposed_registers`) means to a spool holding committed
    `fragment` with `registers`, `delta` pending bytes, and `next_fragment` the proposal that
    would commit them (`Spool.next()`)."""
    end = fragment.end
    if proposal.end > end + delta:
        # Beyond everything we hold: roll forward to it, whatever else it says. The roll takes
        # the proposal's registers, so only the fragment can mismatch afterwards.
        if same_fragment(rolled_fragment(fragment.journal, proposal), proposal):
            return Outcome.ROLLED
        return Outcome.CAUGHT_UP
    if proposal.begin == proposal.end == end:
        rolled = rolled_fragment(fragment.journal, proposal)
        if not same_fragment(rolled, proposal) or proposed_registers != registers:
            return Outcome.MISMATCH
        # Re-proposing the current empty fragment only drops pending content.
        if same_fragment(rolled, fragment):
            return Outcome.ROLLED_BACK
        return Outcome.ROLLED
    if same_fragment(proposal, fragment) and proposed_registers == registers:
        return Outcome.ROLLED_BACK
    if delta and same_fragment(proposal, next_fragment):
        return Outcome.COMMITTED
    return Outcome.MISMATCH
