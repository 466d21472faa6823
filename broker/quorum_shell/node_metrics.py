"""What a quorum node reports about itself: its Prometheus series (broker/metrics.py) and the
blocked-election log line.

The node calls `observe` after every flush (`QuorumNode._flush`: each message, tick and answer)
and `sent` for each message it sends; gauges are written only when their value changed, so an
idle node costs a few comparisons per tick. Series are labelled by journal and member (the
broker's name: see `metrics.QUORUM_LABELS`) and removed by `close` when the node stops, so a
broker exports series only for the quorum journals it is a member of now.

Counted from the cores' state, which stays sans-IO: elections started are the coordinator's
`terms_claimed`, an election won is the member taking the leader role, a Snapshot sent is a
message the node hands to its transport (re-sends included, and those to a member that is
down), a Snapshot installed is one the member handled that moved its log's base, a log-full
refusal is the `LogFullError` an append raised, an apply error is a failed try of the node's
commit applier (apply.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker import metrics
from broker.logging import get_logger
from broker.quorum.coordinator import ElectionBlocked
from broker.quorum.entry import LogBase
from broker.quorum.messages import Snapshot

if TYPE_CHECKING:
    from broker.quorum_shell.node import QuorumNode

log = get_logger(__name__)

_SERIES = (
    metrics.QUORUM_TERM,
    metrics.QUORUM_LEADING,
    metrics.QUORUM_COMMIT_LAG,
    metrics.QUORUM_ELECTIONS_STARTED,
    metrics.QUORUM_ELECTIONS_WON,
    metrics.QUORUM_LOG_FULL,
    metrics.QUORUM_SNAPSHOTS_SENT,
    metrics.QUORUM_SNAPSHOTS_INSTALLED,
    metrics.QUORUM_LOG_BASE,
    metrics.QUORUM_APPLY_ERRORS,
    metrics.QUORUM_KEPT_UNASSIGNED,
)


class NodeMetrics:
    def __init__(self, journal: str, member: str) -> None:
        self.journal = journal
        self.member = member
        labels = (journal, member)
        self._term = metrics.QUORUM_TERM.labels(*labels)
        self._leading = metrics.QUORUM_LEADING.labels(*labels)
        self._lag = metrics.QUORUM_COMMIT_LAG.labels(*labels)
        self._started = metrics.QUORUM_ELECTIONS_STARTED.labels(*labels)
        self._won = metrics.QUORUM_ELECTIONS_WON.labels(*labels)
        self._log_full = metrics.QUORUM_LOG_FULL.labels(*labels)
        self._snapshots = metrics.QUORUM_SNAPSHOTS_SENT.labels(*labels)
        self._installed = metrics.QUORUM_SNAPSHOTS_INSTALLED.labels(*labels)
        self._base = metrics.QUORUM_LOG_BASE.labels(*labels)
        self._apply_errors = metrics.QUORUM_APPLY_ERRORS.labels(*labels)
        self._kept = metrics.QUORUM_KEPT_UNASSIGNED.labels(*labels)
        self._last: tuple[int, bool, int, int] = (-1, False, -1, -1)
        self._claimed = 0
        self.election_blocked: ElectionBlocked | None = None
        self._leading.set(0)
        self._kept.set(0)

    def observe(self, node: QuorumNode) -> None:
        member = node.member
        # The commit lag: bytes of the log beyond the commit offset this member knows.
        term, leading, lag = member.term, node.is_leader, member.log.head_end - member.read_limit
        base = member.log.base.end
        last_term, was_leading, last_lag, last_base = self._last
        if term != last_term:
            self._term.set(term)
        if leading != was_leading:
            self._leading.set(1 if leading else 0)
            if leading:
                self._won.inc()
        if lag != last_lag:
            self._lag.set(lag)
        if base != last_base:
            self._base.set(base)
        self._last = (term, leading, lag, base)
        claimed = node.coordinator.terms_claimed
        if claimed > self._claimed:
            self._started.inc(claimed - self._claimed)
            self._claimed = claimed

    def sent(self, msg: object) -> None:
        if isinstance(msg, Snapshot):
            self._snapshots.inc()

    def received(self, msg: object, base_before: LogBase, base_after: LogBase) -> None:
        """`msg` was handled by the member, whose log's base went from one to the other."""
        if isinstance(msg, Snapshot) and base_after != base_before:
            self._installed.inc()

    def log_full(self) -> None:
        self._log_full.inc()

    def kept_unassigned(self, kept: bool) -> None:
        """The node runs only because the term register names its member, the journal not
        being assigned here (or no longer only for that): QuorumNode.kept_unassigned."""
        self._kept.set(1 if kept else 0)

    def apply_error(self) -> None:
        """A try of the node's commit applier failed (apply.py: it tries again)."""
        self._apply_errors.inc()

    def on_election_blocked(self, blocked: ElectionBlocked | None) -> None:
        """The coordinator's `election_blocked` changed: the gauge, and a log line once per
        change of the members that block it."""
        before, self.election_blocked = self.election_blocked, blocked
        if blocked is not None and before is None:
            metrics.QUORUM_ELECTIONS_BLOCKED.inc()
        elif blocked is None and before is not None:
            metrics.QUORUM_ELECTIONS_BLOCKED.dec()
        if _blocked_key(blocked) == _blocked_key(before):
            return  # the same members block a later term's election: said already
        if blocked is not None:
            log.error(
                "quorum election blocked: not enough members can vote; acknowledged appends"
                " may be held only by lost disks, so no leader is elected"
                " (docs/design/quorum.md, Built (lost disks): what an operator does)",
                journal=self.journal,
                node=self.member,
                reason=str(blocked),
            )
        else:
            log.info("quorum election no longer blocked", journal=self.journal, node=self.member)

    def close(self) -> None:
        """The node stopped: its series go (a later node of the journal starts them again)."""
        if self.election_blocked is not None:
            metrics.QUORUM_ELECTIONS_BLOCKED.dec()
            self.election_blocked = None
        for series in _SERIES:
            try:
                series.remove(self.journal, self.member)
            except KeyError:
                pass  # never recorded


def _blocked_key(blocked: ElectionBlocked | None) -> tuple[object, ...] | None:
    return None if blocked is None else (blocked.non_voters, blocked.voters_needed)
