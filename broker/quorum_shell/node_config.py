"""The broker's timing and bounds of its quorum nodes (node.py): the cores' ticks are
milliseconds. `gazette serve --quorum-log-bytes-max` lowers the entry log's byte bound (a
leader refuses appends past it until the fragment store holds its entries; it compacts at
half of it)."""

from __future__ import annotations

from broker.quorum.config import CoordinatorConfig, QuorumConfig

# The core's clock tick is one millisecond; the loop advances it every `tick_interval_s`.
tick_interval_s = 0.01


def broker_quorum_config() -> QuorumConfig:
    """The core's bounds with ticks in milliseconds: a silent follower is re-sent after
    200 ms (doubling to 2 s); an idle leader tells followers and coordinators every 50 ms; a
    follower that has not answered for 1.5 s (30 heartbeats: as long as a silent leader is
    tolerated) is silent, and removed before its successor is added."""
    return QuorumConfig(
        ack_timeout_ticks=200,
        retry_backoff_max_ticks=2000,
        heartbeat_interval_ticks=50,
        silent_after_ticks=1500,
    )


def broker_coordinator_config() -> CoordinatorConfig:
    """A leader silent for 1.5 s is replaced; register requests are re-sent after 200 ms,
    doubling to 2 s."""
    return CoordinatorConfig(
        leader_timeout_ticks=1500,
        election_timeout_ticks=1000,
        request_timeout_ticks=200,
        retry_backoff_max_ticks=2000,
    )
