"""The quorum protocol's messages. Every message carries the sender's term; senders are named
so that a receiver can answer. All are immutable values: a network may deliver one twice.

Coordinator -> member:  NewTerm, BecomeLeader, AddFollower (to the leader).
Member -> coordinator:  NewTermResponse, Heartbeat (from the leader).
Leader -> follower:     Truncate, Replicate, Snapshot.
Follower -> leader:     ReplicaResponse (answers all three).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from broker.quorum.entry import ORIGIN, Entry, EntryId, LogBase

# Destination meaning "every coordinator" (the shell fans out).
COORDINATORS = "*coordinators*"


@dataclass(frozen=True, slots=True)
class NewTerm:
    """Fence into `term`: persist it, stop serving, answer with the log's head."""

    term: int
    coordinator: str
    ensemble: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NewTermResponse:
    """A member's answer to NewTerm: its (synced) head, its commit point, and the last entry
    of each term it holds above the commit point, so that a leader can work out the longest
    prefix it shares with this member (cursor.common_prefix)."""

    term: int
    member: str
    state: str  # the ReplicaState's value when it answered
    head: EntryId
    commit: EntryId
    term_summary: tuple[EntryId, ...]
    # False for a member that lost its log (a new disk) and no leader has aligned yet: its
    # empty head must not count in an election (Rules.may_vote).
    voter: bool = True
    # A member back from a lost disk: the nonce of this start (Member.lost_nonce), which a
    # leader echoes in the Truncate or Snapshot that aligns it. 0: not lost.
    nonce: int = 0


@dataclass(frozen=True, slots=True)
class BecomeLeader:
    """Lead `term`; `followers` are the NewTerm answers the coordinator chose from."""

    term: int
    coordinator: str
    ensemble: tuple[str, ...]
    followers: tuple[NewTermResponse, ...]
    # The term changes the ensemble (its record is not settled): the leader then says in its
    # heartbeats when its barrier committed (Heartbeat.established). False otherwise, so that
    # other terms' heartbeats are as before on the wire.
    changing: bool = False


@dataclass(frozen=True, slots=True)
class AddFollower:
    """A member answered NewTerm after the leader was chosen: align and replicate to it."""

    term: int
    coordinator: str
    follower: NewTermResponse


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The leader of `term` is alive; coordinators reset their failure detector."""

    term: int
    leader: str
    commit_index: int
    head_index: int
    followers: tuple[str, ...]  # the members it replicates to (aligned or being aligned)
    # A term that changes the ensemble (BecomeLeader.changing) whose commit reached its
    # barrier: established, so its record may be settled (coordinator.py).
    established: bool = False


@dataclass(frozen=True, slots=True)
class Truncate:
    """Drop every entry after `to` (which this follower holds) and follow the leader.
    `leader_head`: the leader's head when it sent this; a follower back from a lost disk
    votes again only once it holds it (Rules.may_vote). `nonce`: the follower's, as its NewTerm
    or LOST answer gave it (0: none); a member back from a lost disk is aligned only by a
    message carrying its own (Rules.accepts_alignment), never by one sent before its loss."""

    term: int
    leader: str
    to: EntryId
    leader_head: EntryId = ORIGIN
    nonce: int = 0


@dataclass(frozen=True, slots=True)
class Replicate:
    """Append `entries`, which follow `prev` in the leader's log, and learn the leader's commit
    index and how far the snapshot store holds the journal (`stored_end`, an offset). No
    entries: a heartbeat carrying the commit index."""

    term: int
    leader: str
    prev: EntryId
    entries: tuple[Entry, ...]
    commit_index: int
    stored_end: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The entries this follower needs were compacted: drop its log and start after `base`,
    whose content (and all before it) the snapshot store holds. `leader_head`, `nonce`: as
    Truncate's."""

    term: int
    leader: str
    base: LogBase
    commit_index: int
    leader_head: EntryId = ORIGIN
    nonce: int = 0


class ReplyStatus(enum.Enum):
    OK = "ok"
    # The follower's head does not continue `prev` (a gap: messages were lost or reordered).
    # `head` tells the leader where to resume.
    GAP = "gap"
    # The follower is in a newer term (`term` says which): the leader is deposed.
    STALE = "stale"
    # The follower lost its log (a new disk) since the leader last aligned it: `head` is what
    # it holds now; the leader aligns it again from there, echoing the answer's `nonce`.
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class ReplicaResponse:
    """A follower's answer to Truncate, Replicate or Snapshot: its synced head after applying
    it (OK), where it stands (GAP), or its newer term (STALE). `nonce`: a member back from a
    lost disk sends its Member.lost_nonce (0 otherwise), for the leader to echo."""

    term: int
    member: str
    status: ReplyStatus
    head: EntryId
    nonce: int = 0
