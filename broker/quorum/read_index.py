"""Read-your-writes through any member (Raft's ReadIndex), the sans-IO part: the two messages a
follower and the leader exchange, and the leader's rule for answering.

A follower serves reads up to its own commit offset, which trails the leader's by a message (it
learns a commit on the leader's next Replicate). So before it serves a non-blocking read (or
reports a write head) it asks the leader for the leader's commit offset (`ReadIndexAsk`), and
serves once it has applied that much (quorum_shell/read_barrier.py). Everything acknowledged
before the read began is then below the offset it serves up to.

The leader's answer (`ReadIndexAnswer`) must cover every append acknowledged before the ask
arrived, whoever acknowledged it, so the leader answers only when (`leader_read_index`):

- it leads the asker's term (fenced by term: an ask of another term is refused), and
- its term's barrier entry is committed: a new leader holds every entry committed in earlier
  terms (leader completeness), but its commit index covers them only once its own term
  commits something (the commit rule counts only current-term entries), and
- no newer term exists: the shell reads the term register (a linearizable read, after the ask
  arrived) and requires it to name this member as the leader of this term. A newer leader
  commits only after its term was claimed in the register, so nothing was acknowledged by a
  newer term before that read. Without it, a deposed leader that does not know it yet (cut off
  with a follower that does not know either) would answer its stale commit offset.

The offset answered is the end of the quorum's commit index (`LeaderRole.commit_index`, what
appends are acknowledged at), read after the register: later is larger, never smaller.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.quorum.member import Member

# The answer's offset when the leader refuses (not the leader of that term, or not yet able
# to answer): the asker asks again, of the leader it knows then.
REFUSED = -1


@dataclass(frozen=True, slots=True)
class ReadIndexAsk:
    """Follower -> leader: your commit offset, please, if you lead `term`. `ask`: the
    asker's number for this question, echoed (re-sends of one question share it)."""

    term: int
    member: str
    ask: int


@dataclass(frozen=True, slots=True)
class ReadIndexAnswer:
    """Leader -> follower: the leader's commit offset as of after the ask arrived, or
    REFUSED."""

    term: int
    leader: str
    ask: int
    commit_end: int


def leader_read_index(member: Member, term: int) -> int | None:
    """The commit offset `member` may answer an ask of `term` with, once the term register
    confirms it still leads (see the module docstring); None if it may not answer (not the
    leader of `term`, or its barrier not committed yet)."""
    role = member.leader
    if role is None or role.term != term or member.log.term != term:
        return None
    if role.barrier_index == 0 or role.commit_index < role.barrier_index:
        return None
    return member.log.end_at(role.commit_index)
