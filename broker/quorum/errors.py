"""Typed errors of the quorum core.

Two families. A `ProtocolError` is an input no correct peer sends in the receiver's state (an
illegal transition, a term never joined, a log that diverged where it cannot): a bug or
corruption, which the shell reports loudly (the simulation counts it as a violation). The input
changed nothing. A `QuorumError` that is not a ProtocolError is an ordinary refusal a client
gets (not the leader, log full): it also changed nothing.
"""

from __future__ import annotations


class QuorumError(Exception):
    """Base of the quorum core's errors."""


class ProtocolError(QuorumError):
    """An input that no correct peer sends here. Nothing changed."""


class IllegalTransitionError(ProtocolError):
    """The (state, event) pair is not in the transition table."""

    def __init__(self, machine: str, state: object, event: object) -> None:
        self.state = state
        self.event = event
        super().__init__(f"{machine}: no transition from {state} on {event}")


class TermNotJoinedError(ProtocolError):
    """A message of a term this member was never fenced into (only NewTerm raises a term)."""


class LogDivergedError(ProtocolError):
    """A synchronised follower's log is not a prefix of its leader's log."""


class TruncateBelowCommitError(ProtocolError):
    """A truncation or snapshot would drop an entry this member knows to be committed."""


class LogContiguityError(ProtocolError):
    """An entry does not continue the log (index, offset or term out of order)."""


class NotLeaderError(QuorumError):
    """This member does not lead the journal's current term. `leader_hint` names the member
    it believes leads, or is empty."""

    def __init__(self, member: str, leader_hint: str = "") -> None:
        self.member = member
        self.leader_hint = leader_hint
        super().__init__(f"{member} is not the leader (leader: {leader_hint or 'unknown'})")


class LogFullError(QuorumError):
    """The leader's log holds `log_bytes_max` bytes (or `log_entries_max` entries) not yet in
    the snapshot store: appends wait for commits and uploads."""


class PendingAppendsFullError(QuorumError):
    """The leader already waits on `pending_appends_max` appends to commit."""


class EmptyRegisterUpdateError(QuorumError):
    """An append that would change the registers carries no content (as Gazette, a register
    update needs a non-empty append)."""


class InvalidConfigError(ValueError):
    """A configuration value out of its range; the message names it."""


class QuorumInvariantError(AssertionError):
    """An internal invariant of the core broke: a bug, not bad input. Raised explicitly (not by
    `assert`), so that `python -O` keeps the check."""


class LogFileCorruptError(QuorumError):
    """A member's log file holds a damaged record followed by intact ones (not a torn tail,
    which is cut off), or records that do not rebuild a log: it cannot be replayed without
    losing what it acknowledged. Nothing was changed; the member must not take part."""
