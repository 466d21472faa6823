"""What the soak's faults share: their configuration, and the steps they are made of
(pick a journal and its primary, restart later as a supervisor would, measure while healing,
wait for a resumed zombie to settle)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from broker.testing.cluster_state import wait_until
from broker.testing.process_cluster import BrokerProcess, ProcessCluster
from examples.stream_sum.soak.context import SoakContext
from examples.stream_sum.soak.report import FaultRecord

__all__ = [
    "Fault",
    "FaultConfig",
    "all_journals",
    "all_shards",
    "later",
    "measure_while",
    "pick_journal",
    "see_resumed_through",
    "settle_resumed",
]

# How long past its lease's TTL a resumed broker's lease may still turn out expired: etcd
# deletes an expired lease's keys within about a second of its TTL.
lease_expiry_slack_s = 1.5


@dataclass(frozen=True)
class FaultConfig:
    store_outage_s: float = 30.0
    # A SIGSTOP'd broker stays stopped this long after its member key is gone.
    zombie_extra_s: float = 1.0
    # A killed process is started again this long after the kill, as by a supervisor: longer
    # than the leases, so that the cluster has noticed (and failed over) by then.
    restart_delay_s: float = 5.0
    # Quorum faults. A follower of a quorum journal stays SIGSTOPped this long while appends
    # run (longer than the brokers' lease, so that its lease expires too).
    follower_stop_s: float = 8.0
    # No append to a quorum journal may take this long with one follower stopped (an
    # all-replicas journal blocks until the stopped broker's lease expires and beyond).
    follower_stall_max_s: float = 2.0
    # A new leader must serve appends within the brokers' lease TTL plus this (issue #16).
    leader_slack_s: float = 3.0


Fault = Callable[[SoakContext, FaultRecord, FaultConfig], Awaitable[list[str]]]


def all_journals(ctx: SoakContext) -> list[str]:
    return ctx.stack.layout.journals()


def all_shards(ctx: SoakContext) -> list[str]:
    return [p.shard for p in ctx.stack.layout.shards]


def pick_journal(ctx: SoakContext, record: FaultRecord) -> tuple[str, BrokerProcess]:
    """A journal (rotating with the fault's index) and its primary broker."""
    journals = all_journals(ctx)
    for i in range(len(journals)):
        journal = journals[(record.index + i) % len(journals)]
        primary = ctx.stack.cluster.primary(journal)
        if primary is not None and primary.running:
            return journal, primary
    raise RuntimeError("no journal has a running primary broker")


async def later(delay_s: float, start: Callable[[], Awaitable[None]]) -> None:
    await asyncio.sleep(delay_s)  # The supervisor's restart delay: part of the fault.
    await start()


async def measure_while(
    ctx: SoakContext,
    record: FaultRecord,
    journals: Sequence[str],
    shards: Sequence[str],
    *concurrently: Awaitable[None],
) -> None:
    """Measure from the record's start while `concurrently` run (heal steps); their failures
    are raised once the measurement is done."""
    results = await asyncio.gather(
        ctx.measure(record, record.started_at, journals, shards),
        *concurrently,
        return_exceptions=True,
    )
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def settle_resumed(ctx: SoakContext, record: FaultRecord, b: BrokerProcess) -> None:
    """`see_resumed_through` with the soak's bounds; a restart is noted in `record`."""
    code = await see_resumed_through(
        ctx.stack.cluster, b, lease_ttl_s=ctx.stack.config.lease_ttl_s, exit_s=ctx.timeouts.exit_s
    )
    if code is not None:
        record.notes.append(f"{b.suffix} exited {code} once resumed; restarted")


async def see_resumed_through(
    cluster: ProcessCluster, b: BrokerProcess, *, lease_ttl_s: float, exit_s: float
) -> int | None:
    """See a resumed (SIGCONT'd) broker through, as a supervisor would; the exit code of a
    broker it restarted, else None. Resumed with its member key still announced, the broker
    may yet have lost its lease: stopped for nearly a TTL, its next keepalive reaches etcd too
    late, and it exits a moment later. So for one lease TTL (and `lease_expiry_slack_s`) its
    exit or its key's deletion is watched for. A broker whose key is gone, or that exited, is
    then waited for until it exited or announced itself again (at most `exit_s`), and one
    that exited is restarted at once, not left down until a fault's measurements end."""
    gone = cluster.member_gone(b)
    if gone() is not None:  # Still announced: kept, or not yet known to be lost.

        def lost() -> str | None:
            return None if not b.running or gone() is None else f"{b.suffix} keeps its lease"

        with contextlib.suppress(TimeoutError):
            await wait_until(cluster.ks, lost, lease_ttl_s + lease_expiry_slack_s)
    if gone() is None or not b.running:
        await _exited_or_back(cluster, b, exit_s)
    if b.running:
        return None
    code = b.process.returncode if b.process is not None else None
    await cluster.start_broker(b)
    return code


async def _exited_or_back(cluster: ProcessCluster, b: BrokerProcess, exit_s: float) -> None:
    """Wait until a resumed zombie has either exited or announced itself again under a new
    lease: whichever it does, bounded by `exit_s`."""
    proc = b.process
    if proc is None:
        return
    exited = asyncio.ensure_future(proc.wait())
    back = asyncio.ensure_future(
        cluster.wait_until(
            lambda: "still gone" if cluster.member_gone(b)() is None else None, exit_s
        )
    )
    done, pending = await asyncio.wait(
        {exited, back}, timeout=exit_s, return_when=asyncio.FIRST_COMPLETED
    )
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    if not done:
        raise TimeoutError(
            f"{b.suffix}: resumed zombie neither exited nor re-announced itself within {exit_s:.0f}s"
        )
