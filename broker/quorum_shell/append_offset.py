"""Where a quorum append may land: the offset rules of Gazette's append, on the leader's log
(sans-IO).

The leader's log head (its last entry's end, committed or not) is where the next append lands.
As in all-replicas mode (append_preconditions.py, Gazette's append_fsm.go):

- an append naming an offset (`AppendRequest.offset`, non-zero: an at-most-once writer's
  expectation, or `gazctl journals reset-head`) that is not where it would land is refused
  WRONG_APPEND_OFFSET, nothing appended;
- content the journal's fragment stores hold beyond the log head (the index's end) was not
  written through this log: a journal deleted and created again under the same name over the
  same store, or a store written by another cluster. A plain append is refused
  INDEX_HAS_GREATER_OFFSET, nothing appended: appended, it would be acknowledged at offsets
  whose stored bytes readers are served instead (found by audit, 2026-11-29). All-replicas
  mode continues at the index's end once an operator names it (reset-head); a quorum log
  cannot start after offset 0 yet, so that append is refused as FAILED_PRECONDITION, saying
  what to do: remove the journal's fragments from the store, or name the journal otherwise.

The check runs on the leader synchronously with the log append (QuorumNode.append_checked),
so that no append lands between it and the entry.
"""

from __future__ import annotations

from broker.protocol import protocol_pb2 as pb


class AppendOffsetError(Exception):
    """An append refused for where it would land: `status` (WRONG_APPEND_OFFSET or
    INDEX_HAS_GREATER_OFFSET) is the client's answer."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


class StoreAheadOfLogError(Exception):
    """An operator's append at the store's end, beyond a quorum log's head: not supported."""


def check_append_offset(journal: str, head_end: int, index_end: int, requested: int) -> None:
    """Raise if an append requesting offset `requested` (0: none) may not land at the log head
    `head_end`, given the journal's fragment index ends at `index_end` (see the module
    docstring)."""
    furthest = max(head_end, index_end)
    if requested == 0:
        if head_end < furthest:
            raise AppendOffsetError(
                pb.INDEX_HAS_GREATER_OFFSET,
                f"journal {journal!r}: its fragment stores hold content through offset"
                f" {index_end}, beyond the quorum log's head {head_end}",
            )
        return
    if requested != furthest:
        raise AppendOffsetError(
            pb.WRONG_APPEND_OFFSET,
            f"journal {journal!r}: an append at offset {requested}, where the journal's next"
            f" append lands at {furthest}",
        )
    if head_end < furthest:
        raise StoreAheadOfLogError(
            f"journal {journal!r}: its fragment stores hold content through offset {index_end}"
            f" that its quorum log did not write (its log ends at {head_end}: a journal deleted"
            " and created again over the same store, or a store another cluster wrote); a"
            " quorum journal cannot continue after it yet. Remove the journal's fragments from"
            " its stores, or create the journal under another name"
        )
