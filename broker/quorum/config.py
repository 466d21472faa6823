"""Bounds and timeouts of the quorum core. Times are in ticks: the caller's unit (the broker
uses milliseconds; the simulation counts its own logical time)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from broker.quorum.errors import InvalidConfigError


@dataclass(frozen=True, slots=True)
class QuorumConfig:
    # Replicate messages a leader has sent a follower and not yet seen acknowledged. After a
    # timeout the window shrinks to one message until the follower answers again.
    inflight_messages_max: int = 4
    # Entries and bytes in one Replicate message.
    replicate_entries_max: int = 64
    replicate_bytes_max: int = 1 << 20
    # Bytes and entries a leader's log may hold that are not yet in the snapshot store; an
    # append past either is refused with LogFullError until commits and uploads catch up.
    log_bytes_max: int = 64 << 20
    log_entries_max: int = 1 << 16
    # A log compacts (drops committed, stored entries) once it holds more than this share of
    # log_bytes_max / log_entries_max: half, so compaction is amortised.
    compact_at_fraction: float = 0.5
    # Appends a leader waits on to commit.
    pending_appends_max: int = 1024
    # A follower that has not answered within this long is re-sent its un-acknowledged
    # entries; the wait doubles on each silent retry, up to retry_backoff_max_ticks.
    ack_timeout_ticks: int = 20
    retry_backoff_max_ticks: int = 320
    # An idle leader tells followers (commit offset) and coordinators (liveness) this often.
    heartbeat_interval_ticks: int = 10
    # A follower the leader has not heard from (any answer of its term, or the term's start
    # if none) for this long is *silent* (LeaderRole.silent): an ensemble change replacing it
    # removes it before adding its successor (Rules.next_ensemble).
    silent_after_ticks: int = 60

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value <= 0:
                raise InvalidConfigError(f"QuorumConfig.{f.name} must be positive (got {value})")
        if self.compact_at_fraction > 1:
            raise InvalidConfigError(
                f"QuorumConfig.compact_at_fraction must be at most 1 (got {self.compact_at_fraction})"
            )
        if self.retry_backoff_max_ticks < self.ack_timeout_ticks:
            raise InvalidConfigError(
                "QuorumConfig.retry_backoff_max_ticks must be at least ack_timeout_ticks "
                f"({self.retry_backoff_max_ticks} < {self.ack_timeout_ticks})"
            )


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    # A leader silent this long is replaced (a new term).
    leader_timeout_ticks: int = 60
    # An election (of another coordinator) that has not appointed a leader this long is taken
    # over with a newer term. Each coordinator adds up to the same again, at random, so that
    # two of them rarely collide twice.
    election_timeout_ticks: int = 40
    # A register request or a NewTerm unanswered this long is sent again, the wait doubling
    # up to retry_backoff_max_ticks.
    request_timeout_ticks: int = 10
    retry_backoff_max_ticks: int = 160

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value <= 0:
                raise InvalidConfigError(
                    f"CoordinatorConfig.{f.name} must be positive (got {value})"
                )
        if self.retry_backoff_max_ticks < self.request_timeout_ticks:
            raise InvalidConfigError(
                "CoordinatorConfig.retry_backoff_max_ticks must be at least request_timeout_ticks"
            )
