"""The replica state machine, table-driven: every state against every event.

The expected table is written out here from the seed's diagram (plus the two documented
re-deliveries), independently of broker/quorum/states.py, and checked twice: against the table
itself, and through a Member put in each state and handed each message. A pair that is not a
transition raises and leaves the member exactly as it was.
"""

from __future__ import annotations

import itertools

import pytest

from broker.quorum.entry import ORIGIN, LogBase
from broker.quorum.errors import (
    IllegalTransitionError,
    ProtocolError,
    TermNotJoinedError,
)
from broker.quorum.messages import (
    AddFollower,
    BecomeLeader,
    NewTermResponse,
    ReplicaResponse,
    Replicate,
    ReplyStatus,
    Snapshot,
    Truncate,
)
from broker.quorum.states import TRANSITIONS, Event, ReplicaState, next_state
from tests.broker.quorum.quorum_testkit import ENSEMBLE, durable_state, member_in, new_term

S, E = ReplicaState, Event

# The seed's diagram, and the re-deliveries the module docstring adds.
SEED_TABLE = {
    (S.NOT_MEMBER, E.NEW_TERM): S.FENCED,
    (S.FENCED, E.NEW_TERM): S.FENCED,
    (S.FENCED, E.REPLICATE): S.FOLLOWER,
    (S.FENCED, E.TRUNCATE): S.FOLLOWER,
    (S.FOLLOWER, E.NEW_TERM): S.FENCED,
    (S.LEADER, E.NEW_TERM): S.FENCED,
    (S.LEADER, E.ADD_FOLLOWER): S.LEADER,
    (S.FOLLOWER, E.REPLICATE): S.FOLLOWER,
    (S.FENCED, E.BECOME_LEADER): S.LEADER,
    (S.FENCED, E.SNAPSHOT): S.FOLLOWER,
    (S.FOLLOWER, E.SNAPSHOT): S.FOLLOWER,
}
REDELIVERIES = {
    (S.FOLLOWER, E.TRUNCATE): S.FOLLOWER,
    (S.LEADER, E.BECOME_LEADER): S.LEADER,
}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(S, E)))
def test_table(state: ReplicaState, event: Event) -> None:
    expected = {**SEED_TABLE, **REDELIVERIES}.get((state, event))
    assert TRANSITIONS.get((state, event)) == expected
    if expected is None:
        with pytest.raises(IllegalTransitionError):
            next_state(state, event)
    else:
        assert next_state(state, event) is expected


def _msg(event: Event) -> object:
    """A message of `event` in term 1 (NewTerm: term 2) from leader m0 / coordinator c0."""
    follower = NewTermResponse(1, "m2", "Fenced", ORIGIN, ORIGIN, ())
    return {
        E.NEW_TERM: new_term(2),
        E.BECOME_LEADER: BecomeLeader(1, "c0", ENSEMBLE, ()),
        E.REPLICATE: Replicate(1, "m0", ORIGIN, (), 0, 0),
        E.TRUNCATE: Truncate(1, "m0", ORIGIN),
        E.SNAPSHOT: Snapshot(1, "m0", LogBase(0, 0, 0), 0),
        E.ADD_FOLLOWER: AddFollower(1, "c0", follower),
    }[event]


# (fixture state, event) -> the state after it, or the error it raises. `fenced_aligned` is a
# follower that restarted: Fenced, its log already aligned in the term.
MEMBER_CASES: list[tuple[str, Event, ReplicaState | type[Exception]]] = [
    ("not_member", E.NEW_TERM, S.FENCED),
    ("not_member", E.BECOME_LEADER, TermNotJoinedError),
    ("not_member", E.REPLICATE, TermNotJoinedError),
    ("not_member", E.TRUNCATE, TermNotJoinedError),
    ("not_member", E.SNAPSHOT, TermNotJoinedError),
    ("not_member", E.ADD_FOLLOWER, TermNotJoinedError),
    ("fenced", E.NEW_TERM, S.FENCED),
    ("fenced", E.BECOME_LEADER, S.LEADER),
    ("fenced", E.TRUNCATE, S.FOLLOWER),
    ("fenced", E.SNAPSHOT, S.FOLLOWER),
    ("fenced", E.REPLICATE, ProtocolError),  # never before the leader aligned it
    ("fenced", E.ADD_FOLLOWER, S.FENCED),  # dropped: a late BecomeLeader, or a restart
    ("fenced_aligned", E.REPLICATE, S.FOLLOWER),
    ("fenced_aligned", E.TRUNCATE, S.FOLLOWER),
    ("follower", E.NEW_TERM, S.FENCED),
    ("follower", E.REPLICATE, S.FOLLOWER),
    ("follower", E.SNAPSHOT, S.FOLLOWER),
    ("follower", E.TRUNCATE, S.FOLLOWER),
    ("follower", E.BECOME_LEADER, IllegalTransitionError),
    ("follower", E.ADD_FOLLOWER, IllegalTransitionError),
    ("leader", E.NEW_TERM, S.FENCED),
    ("leader", E.ADD_FOLLOWER, S.LEADER),
    ("leader", E.BECOME_LEADER, S.LEADER),
    ("leader", E.REPLICATE, IllegalTransitionError),
    ("leader", E.TRUNCATE, IllegalTransitionError),
    ("leader", E.SNAPSHOT, IllegalTransitionError),
]


@pytest.mark.parametrize(("fixture", "event", "expected"), MEMBER_CASES)
def test_member_transition(
    fixture: str, event: Event, expected: ReplicaState | type[Exception]
) -> None:
    member = member_in(fixture)
    before = durable_state(member)
    if isinstance(expected, ReplicaState):
        member.handle(_msg(event), 0)
        assert member.state is expected
    else:
        with pytest.raises(expected):
            member.handle(_msg(event), 0)
        assert durable_state(member) == before


def test_member_cases_cover_every_state_and_event() -> None:
    covered = {(f.replace("_aligned", ""), e) for f, e, _ in MEMBER_CASES}
    assert covered == {(s.name.lower(), e) for s in S for e in E}


@pytest.mark.parametrize("fixture", ["follower", "leader", "fenced"])
@pytest.mark.parametrize("event", [E.REPLICATE, E.TRUNCATE, E.SNAPSHOT])
def test_stale_leader_message_is_answered_stale_and_changes_nothing(
    fixture: str, event: Event
) -> None:
    member = member_in(fixture)
    member.handle(new_term(3), 0)
    member.outbox.clear()
    before = durable_state(member)
    member.handle(_msg(event), 0)  # of term 1
    assert member.outbox == [("m0", ReplicaResponse(3, "m1", ReplyStatus.STALE, member.log.head))]
    member.outbox.clear()
    assert durable_state(member) == before


@pytest.mark.parametrize("event", [E.BECOME_LEADER, E.ADD_FOLLOWER, E.NEW_TERM])
def test_stale_coordinator_message_is_dropped(event: Event) -> None:
    member = member_in("follower")
    member.handle(new_term(3), 0)
    member.outbox.clear()
    before = durable_state(member)
    msg = _msg(event) if event is not E.NEW_TERM else new_term(2)
    member.handle(msg, 0)
    assert durable_state(member) == before


def test_new_term_redelivered_to_follower_answers_where_it_stands() -> None:
    member = member_in("follower")
    member.handle(new_term(1), 0)
    [(dst, resp)] = member.outbox
    assert dst == "c0" and isinstance(resp, NewTermResponse)
    assert resp.state == "Follower" and member.state is S.FOLLOWER
