"""The protocol's safety rules, gathered in one strategy object.

Each rule is a method so that tests can subclass `Rules` with one rule deliberately broken (a
*mutation*) and show that the simulation's checker catches it (tests/sim). Production code uses
`Rules()` and nothing else; no mutation lives in this package.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.quorum.log import ReplicaLog
from broker.quorum.messages import NewTermResponse
from broker.quorum.register import TermRecord


class Rules:
    def quorum(self, ensemble_size: int) -> int:
        """Acknowledgements (the leader's own included) that commit an entry: a majority."""
        return ensemble_size // 2 + 1

    def committable(self, entry_term: int, current_term: int) -> bool:
        """Whether a leader may commit an entry by counting acknowledgements: only an entry of
        its own term. Earlier terms' entries commit with the first entry of this term after
        them (the barrier), never on their own: a majority holding an entry of an earlier term
        can still be outvoted by a member with a later, different entry (Raft's figure 8)."""
        return entry_term == current_term

    def align(self, log: ReplicaLog, to_index: int) -> None:
        """A follower's truncation: drop everything after the common prefix."""
        log.truncate_after(to_index)

    def may_vote(self, lost_state: bool, log: ReplicaLog) -> bool:
        """Whether a member's NewTerm answer counts in an election. A member that lost its log
        (its disk is new, yet it was in the ensemble) reports an empty head that says nothing
        of what it acknowledged before: counted, it and a lagging member could form a majority
        that elects the lagging one and loses committed entries. It votes again once it holds,
        durably, the head of the leader that aligned it, as that leader sent it
        (`aligned_head`, recorded with the alignment). Every entry it acknowledged before the
        loss that counted toward a commit is in that leader's log at or below that head: in
        the same term, the leader sent it before the loss; in a later term, the leader holds
        every committed entry (the coordinator's rule) and its head is past them.
        An entry of the aligning term is not enough: a Snapshot aligns a log at the store's
        end, which may be short of an entry this member acknowledged before the loss and the
        leader counted (found by the simulation with compare-and-set appends). A head of
        another term than the alignment's (a leader that does not send one, or a write torn
        between the two) never makes it a voter: safe, a later alignment brings one.
        """
        if not lost_state:
            return True
        target = log.aligned_head
        return 0 < log.aligned_term == target.term and log.synced_index >= target.index

    def accepts_alignment(self, lost_state: bool, nonce: int, echoed: int) -> bool:
        """Whether a Truncate or Snapshot echoing `echoed` may align a member's log (not
        already aligned in the message's term). A member back from a lost disk (`nonce`: the
        one it gave in its NewTerm or LOST answer since) takes only an alignment echoing it:
        one sent before the loss, delivered late, carries an older leader head, which may be
        below an entry this member acknowledged before the loss; aligned by it, the member
        would vote again without that entry (may_vote). Refused, it answers LOST, and the
        leader aligns it again with its current head."""
        return not lost_state or echoed == nonce

    def lost_start_term(self, log_term: int, register_term: int) -> int:
        """The term a member back from a lost disk starts in: the term register's current
        term (or its log's, if later). Its lost log forgot the term it was fenced into; the
        register never goes back and issued that term, so starting there keeps the fence. A
        lower start would let the leader of a term it had already helped depose align it and
        commit entries with it that the newer term's leader lacks."""
        return max(log_term, register_term)

    def register_check_index(self, log: ReplicaLog) -> int:
        """The entry whose registers a leader checks an append against: its head, every entry
        written applied, committed or not. An append that passes is written after the head,
        so it commits only with every entry the check saw. Checking against the commit
        index instead would let a check pass against registers that an uncommitted entry
        before the append has already changed."""
        return log.head_index

    def next_ensemble(
        self,
        record: TermRecord,
        wanted: tuple[str, ...] | None,
        doubtful: frozenset[str] = frozenset(),
        blocked: bool = False,
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The ensemble (and `previous`, TermRecord) of the term claimed after `record`, the
        host wanting `wanted` (None: no wish), the leader unable to count on `doubtful`
        (LeaderRole.doubtful), `blocked`: an election in `record`'s ensemble found it unable
        to elect (Coordinator.election_blocked: more members back from a lost disk than it
        can spare, so no quorum of voters can form while no leader catches them up).

        Built from three steps, each a rule of its own (and a hook a mutation overrides):
        whether a change may start from `record` (`may_change`), the one step towards
        `wanted` (`step_towards`), and, for an unsettled record, whether the next term goes
        back to the ensemble the change left (`goes_back`). Without a change, the next term
        keeps the record's ensemble; a settled record's `previous` is then cleared."""
        if wanted is not None and self.may_change(record):
            step = self.step_towards(record.ensemble, wanted, doubtful)
            if step != record.ensemble:
                return step, record.ensemble
        if not record.settled:
            if self.goes_back(blocked):
                return record.previous, record.ensemble
            return record.ensemble, record.previous
        if wanted is None:
            return record.ensemble, record.previous
        return record.ensemble, ()

    def may_change(self, record: TermRecord) -> bool:
        """Whether the next term may change the ensemble of `record`: only a settled one.

        One member added or removed per term, and only from a settled record: every
        committed entry is then held by a quorum of the record's ensemble, and a quorum of an
        ensemble one member larger or smaller always shares a member with it
        (q(n) + q(n + 1) > n + 1), so the new term's election sees every committed entry and
        fences the old leader. While a change is unsettled (its term may or may not have
        committed: the register learns it only from the leader's heartbeat), the next term
        keeps the record's ensemble and `previous`: committed entries lie in a quorum of
        either, and both differ from it by at most one member."""
        return record.settled

    def step_towards(
        self, current: tuple[str, ...], wanted: tuple[str, ...], doubtful: frozenset[str]
    ) -> tuple[str, ...]:
        """The ensemble of a change from `current` towards `wanted`: one member added or
        removed (`ensemble_step`). Replacing a member is two changes (ensemble_step chooses
        their order from `doubtful`): in one step, {A,B,C} -> {B,C,D} has the disjoint
        quorums {A,B} and {C,D}."""
        return ensemble_step(current, wanted, doubtful)

    def goes_back(self, blocked: bool) -> bool:
        """Whether the term after an unsettled record goes back to its `previous` ensemble,
        naming the unsettled ensemble as its `previous` in turn: when `blocked`.

        A remove-first step ({A,B,C} -> {A,B}) decided before the leader knew that B lost its
        disk (B had just crashed, or the claim reached the register long after it was decided)
        leaves {A,B} with one voter (B votes only once a leader aligned it): kept, the change
        never elects again; {A,B,C} elects with A and C. Safe, whatever `blocked` says: the
        invariant of an unsettled record (every committed entry is held by a quorum of
        `ensemble` or of `previous`, and the two differ by one member) is symmetric in the
        two, so the swapped record keeps it;
        an election in either sees every committed entry and fences a quorum of both (their
        quorums intersect). Entries committed in a term of the swapped record are held by a
        quorum of its ensemble, one of the two again. It settles as any change does: once a
        term of it establishes (its barrier committed on a quorum of its ensemble, after
        every entry committed before it), which a coordinator writes only for the record's
        own term, so a settled record still means "everything committed is held by a quorum
        of `ensemble`". Bounded: a term goes back only when the term before it found its
        ensemble blocked, which stays so until a leader is elected (a member back from a
        lost disk votes only after a leader aligned it); and with both ensembles blocked the
        terms alternate, one per election, as claims already did."""
        return blocked

    def choose_leader(self, responses: Sequence[NewTermResponse]) -> NewTermResponse:
        """The coordinator's election among a majority of fenced members: the most up-to-date
        head (term, then index). Every committed entry is held by a majority, so by one of
        these members, and the most up-to-date head holds it too. Ties go to the first name,
        so that a re-run chooses the same."""
        return max(responses, key=lambda r: (r.head, _neg(r.member)))


def ensemble_step(
    current: tuple[str, ...], wanted: tuple[str, ...], doubtful: frozenset[str] = frozenset()
) -> tuple[str, ...]:
    """`current` moved one member towards `wanted` (sorted); never below one member.

    A replacement's order depends on the outgoing member. Live: add the new member first, so
    the ensemble keeps its fault tolerance while the new one catches up (the larger ensemble
    commits without it: 3 of {A,B,C,D} are live). Doubtful (LeaderRole.doubtful: silent, the
    usual reason the allocator moves a replica), and the only doubtful member: remove it
    first. Adding first would need 3 acknowledgements of {A,B,C,D} with C dead, i.e. the
    new, empty D caught up before any append commits; {A,B} needs A and B, which a dead C required already, and then {A,B,D}
    commits with A and B while D catches up. With another member doubtful too (silent, or
    back from a lost disk and perhaps not voting yet), removing first could leave {A,B}
    unable to elect for good; adding first keeps the chance that C comes back. Either order
    is single-member steps from settled records (Rules.may_change), so the choice is one
    of availability only: `doubtful` may be wrong (a slow member) without harm to safety.
    """
    add = sorted(set(wanted) - set(current))
    remove = sorted(set(current) - set(wanted), key=lambda m: (m not in doubtful, m))
    dead_first = (
        bool(remove) and remove[0] in doubtful and not doubtful & (set(current) - {remove[0]})
    )
    replacing = len(current) == len(wanted)
    if add and (len(current) < len(wanted) or not remove or (replacing and not dead_first)):
        return tuple(sorted((*current, add[0])))
    if remove and len(current) > 1:
        return tuple(m for m in current if m != remove[0])
    if add:
        return tuple(sorted((*current, add[0])))
    return current


def _neg(name: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in name)


CORRECT_RULES = Rules()
