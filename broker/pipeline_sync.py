"""What a pipeline's peers answered to its synchronising proposal asks of the primary next.

The sans-IO half of ``Pipeline.gather_sync`` (broker/pipeline.py, whose module docstring says
what synchronisation is): given every healthy peer's answer, the offset to roll every spool
forward to, the later revision to re-resolve at, and which peers answered what they must not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker.protocol import protocol_pb2 as pb
from broker.topology import routes_equivalent


class PeerError(Exception):
    """A peer's stream failed, or answered something it should not have."""


class AppendOutcomeUnknownError(PeerError):
    """A peer failed after the append's commit was proposed to every replica: the primary
    (and the peers that took it) committed the content, so it may be read and a retry may
    append it twice, as in Gazette (an append's error never promises it was not written)."""


@dataclass
class SyncResult:
    """What synchronisation asks of the primary next (all zero: the pipeline is in sync)."""

    # A peer holds content through this offset (or must start a new fragment here): roll every
    # spool forward to an empty fragment at it.
    roll_to_offset: int = 0
    # The registers that go with the content through roll_to_offset, when a peer was ahead.
    roll_to_registers: pb.LabelSet | None = None
    # A peer resolved a different route at this later revision: re-resolve at it.
    read_through_rev: int = 0


def judge_sync(
    header: pb.Header, end: int, answers: Mapping[int, pb.ReplicateResponse]
) -> tuple[SyncResult, dict[int, PeerError]]:
    """The outcome of a synchronising proposal whose local fragment ends at ``end``, sent
    with ``header``, from each healthy peer's answer (by its index in the route): what to do
    next, and the error of each peer whose answer is one it must not give."""
    out = SyncResult()
    errors: dict[int, PeerError] = {}
    for index, resp in answers.items():
        if resp.status == pb.OK:
            continue
        if resp.status == pb.WRONG_ROUTE:
            later = resp.header.etcd.revision > header.etcd.revision
            if later and not routes_equivalent(resp.header.route, header.route):
                out.read_through_rev = max(out.read_through_rev, resp.header.etcd.revision)
            else:
                errors[index] = PeerError(f"unexpected WRONG_ROUTE: {resp.header}")
        elif resp.status == pb.PROPOSAL_MISMATCH:
            theirs = resp.fragment
            if theirs.end > end:
                # The peer took part in commits we did not see: everything up to its end is
                # (possibly) committed, so we must continue from there, never below.
                if theirs.end > out.roll_to_offset:
                    out.roll_to_offset = theirs.end
                    out.roll_to_registers = resp.registers
            elif theirs.end == end and theirs.begin == theirs.end:
                # The peer is at our end but cannot extend our fragment (it has none of its
                # content): start a new, empty fragment here that all can extend.
                out.roll_to_offset = max(out.roll_to_offset, end)
            else:
                errors[index] = PeerError(
                    f"unexpected PROPOSAL_MISMATCH: [{theirs.begin}, {theirs.end}) "
                    f"registers {resp.registers}"
                )
        else:
            errors[index] = PeerError(f"unexpected response {brief(resp)}")
    return out, errors


def brief(resp: pb.ReplicateResponse) -> str:
    """A response in a few words, for errors."""
    return f"{pb.Status.Name(resp.status)} {resp.fragment.begin}-{resp.fragment.end}"
