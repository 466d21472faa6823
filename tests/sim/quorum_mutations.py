"""Deliberately broken protocol rules (mutations): each must be caught by the simulation.

Used by test_quorum_sim_mutations.py, and by hand:
`PYTHONPATH=. python -m broker.quorum.sim --seeds 200 --rules tests.sim.quorum_mutations:CommitWithoutMajority`.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.quorum.log import ReplicaLog
from broker.quorum.messages import NewTermResponse
from broker.quorum.register import TermRecord
from broker.quorum.rules import Rules


class CommitWithoutMajority(Rules):
    """Commit once one member fewer than a majority holds an entry."""

    def quorum(self, ensemble_size: int) -> int:
        return max(ensemble_size // 2, 1)


class CommitPreviousTerm(Rules):
    """Commit an entry of an earlier term by counting acknowledgements (Raft's figure 8)."""

    def committable(self, entry_term: int, current_term: int) -> bool:
        return True


class SkipTruncation(Rules):
    """Followers acknowledge a Truncate but keep the entries after the common prefix."""

    def align(self, log: ReplicaLog, to_index: int) -> None:
        return


class ElectLeastUpToDate(Rules):
    """The coordinator appoints the least up-to-date of the fenced members."""

    def choose_leader(self, responses: Sequence[NewTermResponse]) -> NewTermResponse:
        return min(responses, key=lambda r: (r.head, r.member))


class LostDiskVotes(Rules):
    """A member back with an empty log (its disk lost) counts in elections at once: part
    three's behaviour."""

    def may_vote(self, lost_state: bool, log: ReplicaLog) -> bool:
        return True


class VoteOnAlignedTermEntry(Rules):
    """A member back from a lost disk votes again once it holds an entry of the term that
    aligned it (part four's rule), not the aligning leader's head: a Snapshot below an entry
    it acknowledged before the loss makes it a voter without that entry. Caught on the seeds
    of `ALIGNED_BELOW_ACKNOWLEDGED_SEEDS` (tests/sim/test_quorum_sim_mutations.py), not in MUTATIONS:
    the first of them is far into the 1,000."""

    def may_vote(self, lost_state: bool, log: ReplicaLog) -> bool:
        if not lost_state:
            return True
        synced_term = log.term_at(log.synced_index)
        if synced_term is None:
            synced_term = log.base.term
        return 0 < log.aligned_term <= synced_term


class CheckCommittedRegisters(Rules):
    """A leader checks an append's registers as of its commit index, not its head."""

    def register_check_index(self, log: ReplicaLog) -> int:
        return log.commit_index


class AlignOnAnyNonce(Rules):
    """A member back from a lost disk takes any Truncate or Snapshot of its term, also one
    sent before its loss and delivered late (the behaviour before the nonce): its head may be
    below an entry the member acknowledged before the loss, and the member votes without it.
    Not in MUTATIONS: the simulation reaches a lost member taking a late alignment, but not
    within the 1,000 seeds the vote without an acknowledged entry that follows; the core test
    shows it (tests/broker/quorum/test_quorum_lost_disk_gaps.py)."""

    def accepts_alignment(self, lost_state: bool, nonce: int, echoed: int) -> bool:
        return True


class LostStartsAtItsLogTerm(Rules):
    """A member back from a lost disk starts in its (empty) log's term, not the term
    register's (the behaviour before): the leader of a term it helped depose before the loss
    can align it and commit entries with it that the newer term's leader lacks."""

    def lost_start_term(self, log_term: int, register_term: int) -> int:
        return log_term


class ReplaceInOneStep(Rules):
    """An ensemble change replaces a member in one term ({A,B,C} -> {B,C,D}): the old and
    new ensembles have disjoint quorums ({A,B} and {C,D})."""

    def step_towards(
        self, current: tuple[str, ...], wanted: tuple[str, ...], doubtful: frozenset[str]
    ) -> tuple[str, ...]:
        return tuple(sorted(wanted))


class ChangeBeforeEstablished(Rules):
    """An ensemble change goes on from a term not known to have established: two unsettled
    single-member steps make a two-member change ({A,B,C} -> {A,B,C,D} -> {B,C,D}) while
    committed entries may still lie in a quorum of the first ensemble only."""

    def may_change(self, record: TermRecord) -> bool:
        return True


class ReplaceDeadInOneStep(Rules):
    """A doubtful (dead-looking) member is replaced in one term ({A,B,C} -> {A,B,D}), on the
    tempting argument that a dead member votes for nothing anyway: it may only be slow or cut
    off, and {A,C} and {B,D} are disjoint quorums of the two ensembles."""

    def step_towards(
        self, current: tuple[str, ...], wanted: tuple[str, ...], doubtful: frozenset[str]
    ) -> tuple[str, ...]:
        leaving = set(current) - set(wanted)
        if len(wanted) == len(current) and leaving and leaving <= doubtful:
            return tuple(sorted(wanted))
        return super().step_towards(current, wanted, doubtful)


class KeepABlockedChange(Rules):
    """An unsettled ensemble change is kept while it cannot elect (the rule before
    f16-live): {A,B,C} -> {A,B} with B back from a lost disk has one voter and never
    settles, so no leader is elected again. A liveness mutation, caught on the seeds of
    tests/sim/test_quorum_sim_blocked_change.py (not in MUTATIONS: those catch safety)."""

    def goes_back(self, blocked: bool) -> bool:
        return False


MUTATIONS = (
    CommitWithoutMajority,
    CommitPreviousTerm,
    SkipTruncation,
    ElectLeastUpToDate,
    LostDiskVotes,
    CheckCommittedRegisters,
    LostStartsAtItsLogTerm,
    ReplaceInOneStep,
    ChangeBeforeEstablished,
    ReplaceDeadInOneStep,
)
