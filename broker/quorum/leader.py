"""The leader role of a member: appends, replication to each follower, and the commit index.

A member holds a LeaderRole exactly while it is in the Leader state of its current term. It
opens the term with a barrier entry (so that entries of earlier terms commit with it), aligns
each follower the coordinator named (BecomeLeader) or added later (AddFollower), and streams
entries through the follower cursors (cursor.py). The commit index advances by the commit rule
(quorum_ack.py) over the leader's own synced index and the followers' acknowledgements. Clients'
appends are answered (`Committed` notices) once the commit index covers them; if the role ends
first they are answered `AppendFailed`, whose outcome is unknown: a later leader may still
commit the entry.

Registers. An append may check the journal's registers and change them (entry.py). The check
is against the registers as of the leader's head: every entry written before it, committed or
not. A check that passes writes the append's entry after that head, so it commits only if
every entry the check saw commits too (a truncation that drops a register change drops the
append with it). A check that fails appends no content; it writes an empty entry after the
head it checked and is answered `RegistersMismatched` once that entry commits: the registers
it reports are then committed, and current (a deposed leader commits nothing, so it cannot
answer a mismatch from stale registers). A leader that steps down first answers
`AppendFailed` instead, so a mismatch is never reported against registers that a new leader
then truncates away.

Effects are appended to the member's outbox ((destination, message) pairs) and notices.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker.quorum.config import QuorumConfig
from broker.quorum.cursor import CursorState, FollowerCursor, common_prefix
from broker.quorum.entry import NO_REGISTERS, Entry, EntryId, Registers
from broker.quorum.errors import (
    EmptyRegisterUpdateError,
    LogDivergedError,
    LogFullError,
    PendingAppendsFullError,
    QuorumInvariantError,
)
from broker.quorum.log import ReplicaLog
from broker.quorum.messages import (
    COORDINATORS,
    Heartbeat,
    NewTermResponse,
    ReplicaResponse,
    Replicate,
    ReplyStatus,
    Snapshot,
    Truncate,
)
from broker.quorum.quorum_ack import advance_commit
from broker.quorum.rules import Rules

Outbox = list[tuple[str, object]]


@dataclass(frozen=True, slots=True)
class Committed:
    """The append `token` committed as `entry` ([begin, end) of the journal; begin == end for
    an empty append). `registers`: the journal's registers as of `entry` (after the append)."""

    token: object
    entry: EntryId
    begin: int
    end: int
    registers: Registers = NO_REGISTERS


@dataclass(frozen=True, slots=True)
class RegistersMismatched:
    """The append `token`'s register check failed against `registers`, the journal's
    registers as of `entry` (which ends at offset `end`), which is committed: nothing was
    appended."""

    token: object
    entry: EntryId
    end: int
    registers: Registers


@dataclass(frozen=True, slots=True)
class AppendFailed:
    """The append `token` was not committed by this leader: its outcome is unknown."""

    token: object
    reason: str


Notice = Committed | RegistersMismatched | AppendFailed

RegisterCheck = Callable[[Registers], bool]
"""Whether an append may go ahead, given the registers as of the leader's head."""
RegisterUpdate = Callable[[Registers], Registers]
"""The registers after an append, given those before it. May raise to refuse the append (a
bound): nothing is changed."""


class LeaderRole:
    def __init__(
        self,
        name: str,
        term: int,
        ensemble: tuple[str, ...],
        log: ReplicaLog,
        config: QuorumConfig,
        rules: Rules,
        outbox: Outbox,
        notices: list[Notice],
        stored_end: int,
        *,
        changing: bool = False,
    ) -> None:
        self.name = name
        self.term = term
        self.ensemble = ensemble
        self.log = log
        self.config = config
        self.rules = rules
        self.cursors: dict[str, FollowerCursor] = {}
        # The commit index as the quorum decided it. The log's (durable, read-visible) commit
        # index follows it, but not past the leader's own synced entries.
        self.commit_index = log.commit_index
        self.stored_end = stored_end
        self._out = outbox
        self._notices = notices
        # Appends waiting for the commit index to reach their entry.
        self._pending: deque[Committed | RegistersMismatched] = deque()
        self._heartbeat_due = 0
        self.barrier_index = 0  # this term's barrier entry (start())
        self.changing = changing  # the term changes the ensemble (BecomeLeader.changing)
        # When each follower last answered in this term (see doubtful()).
        self._heard: dict[str, int] = {}
        self._started = 0

    # --- Term start and membership -------------------------------------------------------------

    def start(self, followers: Iterable[NewTermResponse], now: int) -> None:
        self._started = now
        log = self.log
        log.append(Entry(self.term, log.head_index + 1, log.head_end, log.head_end, b""))
        self.barrier_index = log.head_index
        for follower in followers:
            self.add_follower(follower, now)
        self.tick(now)

    def add_follower(self, follower: NewTermResponse, now: int) -> None:
        """Align and stream to `follower`; a member already followed (or not in the ensemble,
        or this leader) is ignored: AddFollower may be re-delivered."""
        member = follower.member
        if member == self.name or member not in self.ensemble or member in self.cursors:
            return
        cursor = FollowerCursor(
            member,
            backoff=self.config.ack_timeout_ticks,
            window=self.config.inflight_messages_max,
            align_to=common_prefix(self.log, follower),
            nonce=follower.nonce,
        )
        if cursor.align_to.index < self.log.base.index:
            cursor.state = CursorState.SNAPSHOTTING
        self.cursors[member] = cursor
        self._drive(cursor, now)

    @property
    def followers(self) -> tuple[str, ...]:
        return tuple(sorted(self.cursors))

    def doubtful(self, now: int) -> frozenset[str] | None:
        """The ensemble's other members this leader cannot count on: *silent* ones (no
        answer of this term, any status, for `silent_after_ticks`; or none at all since the
        term started `ack_timeout_ticks` ago, a live member answering its alignment within a
        round trip: a leader elected after a member died finds it silent at once) and
        members back from a lost disk in this term (aligned with a nonce: they may not vote
        yet, Rules.may_vote). Deterministic in `now`, so the simulation and the broker
        decide alike; what it decides is only the order of a replacement's two steps
        (ensemble_step), never what commits. None while the term is younger than
        `ack_timeout_ticks`: too young to tell (a coordinator changes nothing meanwhile)."""
        config = self.config
        if now - self._started < config.ack_timeout_ticks:
            return None
        doubtful = set()
        for m in self.ensemble:
            if m == self.name:
                continue
            heard = self._heard.get(m)
            silent = heard is None or now - heard >= config.silent_after_ticks
            if silent or (m in self.cursors and self.cursors[m].nonce != 0):
                doubtful.add(m)
        return frozenset(doubtful)

    # --- Appends -----------------------------------------------------------------------------

    def append(
        self,
        data: bytes,
        token: object,
        now: int,
        check: RegisterCheck | None = None,
        update: RegisterUpdate | None = None,
    ) -> EntryId:
        """Write `data` as the next entry (not yet synced here); `token` is answered by a
        notice. An empty append writes an empty entry, answered once it commits (a barrier). `check` and `update`: the append's registers (module docstring). Raises
        LogFullError, PendingAppendsFullError, EmptyRegisterUpdateError, or what `update`
        raises, changing nothing."""
        config, log = self.config, self.log
        if len(self._pending) >= config.pending_appends_max:
            raise PendingAppendsFullError(
                f"{self.name}: {len(self._pending)} appends pending (pending_appends_max)"
            )
        at = self.rules.register_check_index(log)
        current = log.registers_at(at)
        if check is not None and not check(current):
            # An empty entry after the head: the mismatch is answered once it commits, which
            # also proves this leader still led (a deposed one commits nothing), so the
            # registers answered are the journal's, not a stale leader's.
            self._write_entry(b"", None)
            self._pending.append(RegistersMismatched(token, log.head, log.head_end, current))
            for cursor in self.cursors.values():
                self._drive(cursor, now)
            return log.head
        registers = None
        if update is not None:
            if not data:
                raise EmptyRegisterUpdateError(
                    f"{self.name}: a register update needs a non-empty append"
                )
            after = update(current)
            registers = after if after != current else None
        # An empty append (a write barrier: its end is the journal's head as of the request) is
        # an empty entry of this term too. Answered once it commits, it proves that this leader
        # still led after the request came (a deposed one commits nothing), so no append a newer
        # leader acknowledged before it is above its end. Answered from the entries already
        # committed instead, a leader deposed while stopped (and resumed, not yet knowing it)
        # answered a stale head.
        self._write_entry(data, registers)
        begin = log.head_end - len(data)
        self._pending.append(Committed(token, log.head, begin, log.head_end, log.head_registers))
        self._answer_pending()
        for cursor in self.cursors.values():
            self._drive(cursor, now)
        return log.head

    def _write_entry(self, data: bytes, registers: Registers | None) -> None:
        """Write `data` (empty: a barrier or a mismatch's entry) as the next entry of this
        term, compacting first if the log is full; LogFullError if it stays full."""
        log, config = self.log, self.config
        if (
            log.held_bytes + len(data) > config.log_bytes_max
            or log.entry_count >= config.log_entries_max
        ):
            compact(log, self.stored_end, config)
        if log.held_bytes + len(data) > config.log_bytes_max:
            raise LogFullError(
                f"{self.name}: log holds {log.held_bytes} bytes not yet stored (log_bytes_max {config.log_bytes_max})"
            )
        if log.entry_count >= config.log_entries_max:
            raise LogFullError(
                f"{self.name}: log holds {log.entry_count} entries (log_entries_max)"
            )
        end = log.head_end + len(data)
        log.append(Entry(self.term, log.head_index + 1, log.head_end, end, data, registers))

    def on_synced(self, now: int) -> None:
        """The shell made the leader's written entries durable."""
        self.log.sync()
        self._advance_commit(now)

    def on_stored(self, end: int) -> None:
        """The snapshot store holds the journal's content through offset `end`: compact."""
        self.stored_end = max(self.stored_end, end)
        compact(self.log, self.stored_end, self.config)

    def fail_pending(self, reason: str) -> None:
        while self._pending:
            self._notices.append(AppendFailed(self._pending.popleft().token, reason))

    # --- Followers' answers ------------------------------------------------------------------

    def on_response(self, resp: ReplicaResponse, now: int) -> int:
        """Apply a follower's answer. Returns a newer term the follower reported (the leader
        must step down), else 0. Raises LogDivergedError if an aligned follower reports a head
        this leader does not hold (a broken protocol)."""
        if resp.status is ReplyStatus.STALE:
            return resp.term if resp.term > self.term else 0
        cursor = self.cursors.get(resp.member)
        if resp.term != self.term or cursor is None:
            return 0
        self._heard[resp.member] = now
        if resp.status is ReplyStatus.LOST:
            # Whatever this follower acknowledged is gone: align it again from its new log
            # (acknowledgements already counted stay counted: that disk loss is the one the
            # mode tolerates). Its nonce goes back with the alignment: only that one aligns it
            # (a Truncate or Snapshot sent before its loss may still be in the network).
            del self.cursors[resp.member]
            empty = NewTermResponse(
                resp.term, resp.member, "fenced", resp.head, resp.head, (), False, resp.nonce
            )
            self.add_follower(empty, now)
            return 0
        log, head = self.log, resp.head
        if head.index > log.head_index or (head.index >= log.base.index and not log.has(head)):
            raise LogDivergedError(
                f"{self.name}: aligned follower {resp.member} holds {head}, not in the leader's log"
            )
        # Every answer of this term comes from an aligned follower (it answers nothing before
        # its Truncate or Snapshot), so its head is durable and on this leader's log.
        cursor.ack_index = max(cursor.ack_index, head.index)
        cursor.backoff = self.config.ack_timeout_ticks
        cursor.window = self.config.inflight_messages_max
        if cursor.state is not CursorState.STREAMING:
            if head.index >= log.base.index:
                cursor.state = CursorState.STREAMING
                cursor.last_pushed = head.index
                cursor.inflight = 0
        elif resp.status is ReplyStatus.GAP:
            cursor.last_pushed = head.index
            cursor.inflight = 0
        else:
            cursor.inflight = max(cursor.inflight - 1, 0)
            cursor.last_pushed = max(cursor.last_pushed, head.index)
        cursor.deadline = now + cursor.backoff if cursor.inflight else 0
        self._advance_commit(now)
        self._drive(cursor, now)
        return 0

    # --- Time ----------------------------------------------------------------------------------

    def tick(self, now: int) -> None:
        for cursor in self.cursors.values():
            self._drive(cursor, now)
        if now >= self._heartbeat_due:
            self._heartbeat_due = now + self.config.heartbeat_interval_ticks
            self._out.append(
                (
                    COORDINATORS,
                    Heartbeat(
                        self.term,
                        self.name,
                        self.commit_index,
                        self.log.head_index,
                        self.followers,
                        self.changing and 0 < self.barrier_index <= self.commit_index,
                    ),
                )
            )

    # --- Internals -------------------------------------------------------------------------------

    def _advance_commit(self, now: int) -> None:
        acks = [self.log.synced_index]
        for member in self.ensemble:
            if member != self.name:
                cursor = self.cursors.get(member)
                acks.append(cursor.ack_index if cursor is not None else 0)
        commit = advance_commit(
            acks, len(self.ensemble), self.commit_index, self.term, self.log.term_at, self.rules
        )
        # The durable, read-visible commit follows the quorum's as far as this leader has
        # synced: also when only the sync moved.
        self.log.set_commit(commit)
        if commit != self.commit_index:
            self.commit_index = commit
            self._answer_pending()
            compact(self.log, self.stored_end, self.config)

    def _answer_pending(self) -> None:
        while self._pending and self._pending[0].entry.index <= self.commit_index:
            self._notices.append(self._pending.popleft())

    def _drive(self, cursor: FollowerCursor, now: int) -> None:
        """Send `cursor`'s follower whatever is due."""
        config, log = self.config, self.log
        if cursor.inflight and now >= cursor.deadline:
            # Silence: resume from what the follower acknowledged, one message at a time.
            cursor.backoff = min(cursor.backoff * 2, config.retry_backoff_max_ticks)
            cursor.window = 1
            cursor.inflight = 0
            cursor.last_pushed = cursor.ack_index
        if cursor.state is not CursorState.STREAMING:
            if cursor.inflight:
                return
            if cursor.state is CursorState.ALIGNING and cursor.align_to.index < log.base.index:
                cursor.state = CursorState.SNAPSHOTTING
            if cursor.state is CursorState.ALIGNING:
                msg: object = Truncate(
                    self.term, self.name, cursor.align_to, log.head, cursor.nonce
                )
            else:
                msg = Snapshot(
                    self.term, self.name, log.base, self.commit_index, log.head, cursor.nonce
                )
            self._send(cursor, msg, now)
            return
        while cursor.inflight < cursor.window:
            if cursor.last_pushed < log.base.index:
                cursor.state = CursorState.SNAPSHOTTING
                cursor.inflight = 0
                snap = Snapshot(
                    self.term, self.name, log.base, self.commit_index, log.head, cursor.nonce
                )
                self._send(cursor, snap, now)
                return
            entries = log.entries_after(
                cursor.last_pushed, config.replicate_entries_max, config.replicate_bytes_max
            )
            if not entries and cursor.commit_sent >= self.commit_index:
                if cursor.inflight or now < cursor.heartbeat_due:
                    return
            prev_term = log.term_at(cursor.last_pushed)
            if prev_term is None:
                raise QuorumInvariantError(
                    f"{self.name}: {cursor.member} pushed through {cursor.last_pushed}, "
                    f"outside the log [{log.base.index}, {log.head_index}]"
                )
            msg = Replicate(
                self.term,
                self.name,
                EntryId(prev_term, cursor.last_pushed),
                entries,
                self.commit_index,
                self.stored_end,
            )
            if entries:
                cursor.last_pushed = entries[-1].index
            self._send(cursor, msg, now)
            if not entries:
                return

    def _send(self, cursor: FollowerCursor, msg: object, now: int) -> None:
        if not cursor.inflight:
            cursor.deadline = now + cursor.backoff
        cursor.inflight += 1
        cursor.commit_sent = self.commit_index
        cursor.heartbeat_due = now + self.config.heartbeat_interval_ticks
        self._out.append((cursor.member, msg))


def compact(log: ReplicaLog, stored_end: int, config: QuorumConfig) -> None:
    """Drop committed entries whose content the snapshot store holds, once the log holds more
    than `compact_at_fraction` of its bounds."""
    fraction = config.compact_at_fraction
    if (
        log.held_bytes <= config.log_bytes_max * fraction
        and log.entry_count <= config.log_entries_max * fraction
    ):
        return
    through = min(log.commit_index, log.index_covering(stored_end))
    if through > log.base.index:
        log.compact_through(through)
