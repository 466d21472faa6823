"""A leader's view of one follower (the seed's FollowerCursor), and how a leader aligns a
follower's log with its own.

A cursor starts ALIGNING: the leader sends the follower a Truncate to the longest prefix their
logs share, or a Snapshot when that prefix is older than the leader's compacted base. Once the
follower answers, its log is a prefix of the leader's and the cursor is STREAMING: entries after
`last_pushed` go out in Replicate messages, at most `window` unacknowledged at a time, and every
answer raises `ack_index`, the highest index the follower durably holds. A follower that needs
entries the leader has compacted meanwhile is sent a Snapshot (SNAPSHOTTING) and streams again
once it answers.

Retries: a message unanswered for `backoff` ticks is re-sent (streaming resumes from
`ack_index`), the wait doubling up to `retry_backoff_max_ticks`, and the window shrinks to one
message until the follower answers: a silent follower costs one message per backoff period.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from broker.quorum.entry import ORIGIN, EntryId
from broker.quorum.log import ReplicaLog
from broker.quorum.messages import NewTermResponse


class CursorState(enum.Enum):
    ALIGNING = "aligning"
    SNAPSHOTTING = "snapshotting"
    STREAMING = "streaming"


@dataclass(slots=True)
class FollowerCursor:
    member: str
    backoff: int
    window: int
    state: CursorState = CursorState.ALIGNING
    align_to: EntryId = ORIGIN  # the Truncate point while ALIGNING
    last_pushed: int = 0  # index of the last entry sent
    ack_index: int = 0  # highest index the follower acknowledged holding durably
    inflight: int = 0  # messages sent and not yet answered
    commit_sent: int = 0  # commit index the follower was last told
    deadline: int = 0  # tick at which an unanswered message is re-sent (0: send now)
    heartbeat_due: int = 0  # tick at which an idle follower is sent the commit index again
    nonce: int = 0  # a follower back from a lost disk: its nonce, echoed when aligning it


def common_prefix(log: ReplicaLog, follower: NewTermResponse) -> EntryId:
    """The last entry both `log` (the leader's) and the follower's log hold.

    Logs that share an entry id share everything before it, and a term's entries, in any log,
    are a prefix of what that term's leader wrote (each term opens with its barrier). So:
      - if the leader holds the follower's head, the whole follower log is a prefix;
      - for each term the follower summarised, the shorter of the two logs' runs of that term
        ends on an entry both hold;
      - the follower's commit point is held by every later leader (committed entries are):
        the floor.
    With the summary complete, the result is the last entry the two logs share, so an aligned
    follower never loses an entry the leader holds (committed entries in particular).
    Entries below the leader's base cannot be checked by term; a point there means a Snapshot.
    """
    if log.has(follower.head):
        return follower.head
    best = follower.commit
    for last in follower.term_summary:
        mine = log.last_of_term(last.term)
        if mine is None:
            continue
        point = last if last.index <= mine.index else mine
        if point.index > best.index:
            best = point
    return best
