"""Alignment: the longest prefix a follower shares with the new leader, and the truncation of
exactly the entries after it (uncommitted entries the leader lacks), never of shared ones."""

from __future__ import annotations

import pytest

from broker.quorum.cursor import common_prefix
from broker.quorum.entry import EntryId
from broker.quorum.member import Member
from broker.quorum.messages import BecomeLeader, Snapshot, Truncate
from broker.quorum.states import ReplicaState
from tests.broker.quorum.quorum_testkit import (
    CONFIG,
    ENSEMBLE,
    Router,
    make_log,
    response_of,
)

# (leader's entries' terms, follower's entries' terms, follower's commit index, expected point)
CASES = [
    ([1, 1, 1], [1, 1], 0, EntryId(1, 2)),  # the follower's head is held: a prefix
    ([1, 1, 3], [1, 1, 2], 0, EntryId(1, 2)),  # a term the leader lacks
    ([1, 1, 1, 2], [1, 1, 1, 1, 1], 0, EntryId(1, 3)),  # the leader's run of term 1 is shorter
    ([1, 1], [1, 2], 0, EntryId(1, 1)),  # leader: no term 2, and more of term 1
    ([1, 2, 2, 4], [1, 2, 3, 3], 1, EntryId(2, 2)),  # the newest common term wins
    ([1, 4], [1, 2, 3], 1, EntryId(1, 1)),  # only the commit point is common
    ([5], [2, 3], 0, EntryId(0, 0)),  # nothing in common: the origin
]


@pytest.mark.parametrize(("leader", "follower", "commit", "expected"), CASES)
def test_common_prefix(
    leader: list[int], follower: list[int], commit: int, expected: EntryId
) -> None:
    leader_log = make_log([(t, b"L%d" % i) for i, t in enumerate(leader)])
    member = Member(
        "m1", make_log([(t, b"F%d" % i) for i, t in enumerate(follower)], commit=commit), CONFIG
    )
    resp = response_of(member, 9)
    assert common_prefix(leader_log, resp) == expected


def test_a_follower_keeps_shared_uncommitted_entries_and_drops_only_the_rest() -> None:
    # m1 holds 1.1-1.3 (committed through 1.1 as far as it knows) and 2.4, which only it got.
    # The leader of term 3 holds 1.1-1.3: m1 keeps 1.2 and 1.3, drops 2.4.
    leader = Member("m0", make_log([(1, b"a"), (1, b"b"), (1, b"c")], term=1), CONFIG)
    follower = Member(
        "m1", make_log([(1, b"a"), (1, b"b"), (1, b"c"), (2, b"X")], term=2, commit=1), CONFIG
    )
    members = {"m0": leader, "m1": follower, "m2": Member("m2", make_log([]), CONFIG)}
    router = Router(members)
    router.cut = lambda src, dst, msg: "m2" in (src, dst)
    resp = response_of(follower, 3)
    response_of(leader, 3)
    truncates: list[Truncate] = []

    def watch(src: str, dst: str, msg: object) -> bool:
        if isinstance(msg, Truncate):
            truncates.append(msg)
        return "m2" in (src, dst)

    router.cut = watch
    leader.handle(BecomeLeader(3, "c0", ENSEMBLE, (resp,)), 0)
    router.run()
    assert truncates == [Truncate(3, "m0", EntryId(1, 3), EntryId(3, 4))]  # its barrier: its head
    assert follower.state is ReplicaState.FOLLOWER
    assert follower.log.head == leader.log.head == EntryId(3, 4)
    assert follower.log.read(0, 3) == b"abc"
    assert follower.log.drops == 1  # 2.4 only; 1.2 and 1.3 were never dropped and re-sent


def test_a_snapshot_replaces_a_log_that_does_not_hold_its_base() -> None:
    follower = Member("m1", make_log([(1, b"a"), (2, b"zz")], term=2, commit=1), CONFIG)
    response_of(follower, 4)
    base = make_log([(1, b"a"), (3, b"bbbb"), (3, b"cc")], commit=3)
    base.compact_through(3)
    follower.handle(Snapshot(4, "m0", base.base, 3), 0)
    assert follower.state is ReplicaState.FOLLOWER
    assert follower.log.head == EntryId(3, 3) and follower.log.entry_count == 0
    assert follower.read_limit == 7  # everything before comes from the store
    [(dst, answer)] = follower.outbox
    assert dst == "m0" and answer.head == EntryId(3, 3)


def test_a_snapshot_keeps_a_log_that_holds_its_base() -> None:
    follower = Member("m1", make_log([(1, b"a"), (1, b"bb"), (2, b"X")], term=2), CONFIG)
    response_of(follower, 4)
    leader_log = make_log([(1, b"a"), (1, b"bb"), (3, b"cc")], commit=2)
    leader_log.compact_through(2)
    follower.handle(Snapshot(4, "m0", leader_log.base, 2), 0)
    # It holds 1.2: keeps 1.1-1.2 (compacted into the store's range), drops 2.3 only.
    assert follower.log.head == EntryId(1, 2) and follower.log.base.index == 2
    assert follower.log.commit_index == 2 and follower.log.aligned_term == 4
