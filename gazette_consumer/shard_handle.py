"""What a consumer process needs from a running shard, and how it starts one.

The consumer member (``member.py``) decides *which* shards run here and in which role, from
the assignments the allocator writes to etcd; the shard runner (``shard.py``) decides *how* a
shard runs (restore, read-committed transactions, commits). This module is the seam between
the two, kept small so that either side can change without the other:

* ``StartShard``: called by the member, from its keyspace observer (so it must not block),
  when a shard is newly assigned here. It returns a ``ShardHandle`` at once; the shard then
  starts in the background.
* ``ShardHandle``: the member reads ``status()`` (advertised in etcd, where the allocator
  judges hand-offs by it) and ``progress()`` (answered by Stat), calls ``promote()`` when a
  standby becomes the primary, ``update_spec()`` when the ShardSpec changes while assigned,
  and ``await stop()`` when the assignment goes away.
* ``on_change``: the handle calls it (from the event loop, without blocking) whenever its
  status or progress changed, so the member re-advertises the status and wakes Stat waiters.
  No polling either way.

Call order, per assignment: ``start_shard`` once; any number of ``update_spec``; at most one
``promote`` (only for a shard started as STANDBY); then exactly one ``stop``. A promotion
never goes the other way: a primary that loses slot 0 is stopped, and a new assignment (if
any) starts afresh. All calls come from the event loop of the member.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from broker.protocol import consumer_pb2 as cpb


class ShardRole(enum.Enum):
    """The role an assignment gives a replica: slot 0 is the primary, others hot standbys."""

    PRIMARY = "primary"
    STANDBY = "standby"


@dataclass(frozen=True, slots=True)
class ShardProgress:
    """Offsets of the shard's last completed transaction: read through, per source journal,
    and published through (ACKs included), per journal written. Copies: the caller owns
    them."""

    read_through: Mapping[str, int] = field(default_factory=dict)
    publish_at: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ShardStart:
    """Everything ``StartShard`` is given about a new assignment."""

    spec: cpb.ShardSpec
    role: ShardRole
    # The shard's fully-qualified name: the etcd key of its ShardSpec, unique across consumer
    # groups sharing a database (the SQL store's ``shard_fqn``).
    fqn: str
    # Call whenever status() or progress() changed. Never blocks; safe to call often.
    on_change: Callable[[], None]
    # Whether this member still holds the assignment, asked of etcd itself (not of the mirror,
    # which lags in a process that was paused): what a replica asks before it starts over after
    # a failure, so that a zombie does not restore the shard again and fence its successor.
    # None: no etcd (a runner used directly), always held.
    still_assigned: Callable[[], Awaitable[bool]] | None = None


class ShardHandle(Protocol):
    """A shard running (or starting, or stopped) in this process. See the module docstring."""

    def status(self) -> cpb.ReplicaStatus:
        """The replica's status now: BACKFILL while restoring (optional) or starting over
        after a transient failure, STANDBY once ready to take over, PRIMARY once serving
        transactions, FAILED (with its errors, saying what to fix: e.g. the Application's
        exception) once it stopped for good. IDLE until started."""
        ...

    def progress(self) -> ShardProgress:
        """Offsets of the last completed transaction (empty until the first)."""
        ...

    def promote(self) -> None:
        """Become the primary (this standby's assignment moved to slot 0). Returns at once;
        the status turns PRIMARY (and on_change is called) when the shard serves."""
        ...

    def update_spec(self, spec: cpb.ShardSpec) -> None:
        """The ShardSpec changed while assigned. A shard may apply it at its next transaction,
        or ignore it until its next assignment."""
        ...

    async def stop(self) -> None:
        """Stop the shard (its assignment is gone, or the process is exiting): no further
        commits once this returns. Idempotent; never raises for the shard's own failure
        (that is reported by status())."""
        ...


StartShard = Callable[[ShardStart], ShardHandle]
