"""The replica state machine of a member, as an explicit table (the seed's diagram).

  NotMember  not in the journal's ensemble as far as it knows (term 0).
  Fenced     in a term, but neither aligned with its leader nor leading: refuses appends and
             reads beyond its commit offset; answers the coordinator.
  Follower   aligned with the term's leader (its log a prefix of the leader's); appends the
             leader's entries and learns the commit offset from it.
  Leader     chosen by the term's coordinator: serves appends, replicates, commits.

Events are the protocol's messages. A message of an older term never reaches the table (it is
answered as stale); a message of a newer term other than NewTerm is a ProtocolError. The table
holds every legal (state, event) pair of a message of the member's own term (NewTerm: of a newer
term) and the state it leads to; any other pair raises IllegalTransitionError and changes
nothing.

Beyond the seed's diagram, two pairs are re-deliveries, legal and without effect: a Truncate
reaching a Follower (the leader sends one Truncate per follower and term; a copy that arrives
after the follower moved on must not truncate again), and a BecomeLeader reaching the Leader.
A NewTerm of the member's own term reaching a Follower or Leader is answered from the message
checks and is not a transition either.
"""

from __future__ import annotations

import enum
from typing import Final

from broker.quorum.errors import IllegalTransitionError


class ReplicaState(enum.Enum):
    NOT_MEMBER = "NotMember"
    FENCED = "Fenced"
    FOLLOWER = "Follower"
    LEADER = "Leader"

    def __str__(self) -> str:
        return self.value


class Event(enum.Enum):
    NEW_TERM = "NewTerm"
    BECOME_LEADER = "BecomeLeader"
    REPLICATE = "Replicate"
    TRUNCATE = "Truncate"
    SNAPSHOT = "Snapshot"
    ADD_FOLLOWER = "AddFollower"

    def __str__(self) -> str:
        return self.value


S = ReplicaState
E = Event

TRANSITIONS: Final[dict[tuple[ReplicaState, Event], ReplicaState]] = {
    (S.NOT_MEMBER, E.NEW_TERM): S.FENCED,
    (S.FENCED, E.NEW_TERM): S.FENCED,
    (S.FENCED, E.REPLICATE): S.FOLLOWER,
    (S.FENCED, E.TRUNCATE): S.FOLLOWER,
    (S.FENCED, E.SNAPSHOT): S.FOLLOWER,
    (S.FENCED, E.BECOME_LEADER): S.LEADER,
    (S.FOLLOWER, E.NEW_TERM): S.FENCED,
    (S.FOLLOWER, E.REPLICATE): S.FOLLOWER,
    (S.FOLLOWER, E.SNAPSHOT): S.FOLLOWER,
    (S.FOLLOWER, E.TRUNCATE): S.FOLLOWER,  # a re-delivery: no effect
    (S.LEADER, E.NEW_TERM): S.FENCED,
    (S.LEADER, E.ADD_FOLLOWER): S.LEADER,
    (S.LEADER, E.BECOME_LEADER): S.LEADER,  # a re-delivery: no effect
}


def next_state(state: ReplicaState, event: Event) -> ReplicaState:
    """The state `event` leads to from `state`; raises IllegalTransitionError if none."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransitionError("replica", state, event) from None
