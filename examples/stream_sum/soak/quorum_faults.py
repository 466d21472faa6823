"""Faults aimed at quorum journals (label ``gazette.dev/replication-mode=quorum``,
docs/design/quorum.md), whose leader is the one the journal's term register names
(``<root>/quorum/<journal>``), not necessarily the allocator's primary:

- ``quorum-leader-kill``: kill -9 the leader of a quorum journal (rotating over them); a
  supervisor starts it again `restart_delay_s` later. A new leader must serve appends within
  the lease TTL + `leader_slack_s` (issue #16's acceptance).
- ``quorum-leader-zombie``: SIGSTOP the leader until another member leads (a new term fences
  the stopped one) and its lease has expired, then SIGCONT it: the zombie must not commit. An
  append sent through it once resumed must land at or after everything the new leader
  acknowledged meanwhile (a lower offset is an offset written twice); then the ledger's reads
  through every member check that nothing it held diverged.
- ``quorum-follower-stop``: SIGSTOP a follower for `follower_stop_s` (past its lease) while
  appends to the journal run one after another through the leader: each must succeed, none may
  take `follower_stall_max_s` or more (an all-replicas journal blocks until the lease expires).
- ``quorum-member-restarts``: kill -9 and restart at once a follower and then the leader, each
  once the journals are replicated again; a leader must serve appends within the bound after
  each.

Each works in any replication mode: with no quorum journal in the layout, it hits the
allocator's primary (or another member) of an R=3 journal instead, measures, and notes that
nothing quorum-specific was checked. After each, besides the soak's usual checks, the
`SoakContext.check` reads every quorum journal's committed range straight from each member
(a blocking read up to a barrier's commit offset, served by that broker itself).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Final

from broker.client.appender import append
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.quorum_shell.term_record import QuorumTerm
from broker.testing.process_cluster import BrokerProcess
from broker.topology import quorum_term_key
from examples.stream_sum.soak.context import SoakContext
from examples.stream_sum.soak.fault_kit import (
    Fault,
    FaultConfig,
    all_journals,
    all_shards,
    later,
    measure_while,
    settle_resumed,
)
from examples.stream_sum.soak.report import FaultRecord, percentile
from examples.stream_sum.verifier import Finding

__all__ = ["QUORUM_FAULTS", "quorum_leader"]

# One attempt of a leader probe (an empty append) may take this long: short, so that an
# attempt stuck on a stopped leader does not hide how soon a new one serves.
leader_probe_attempt_s: Final = 1.0
leader_probe_backoff_initial_s: Final = 0.05
leader_probe_backoff_max_s: Final = 0.25
# One attempt of a barrier append (the journal's commit offset before a zombie is resumed).
barrier_attempt_s: Final = 5.0
# Appends of the follower-stop fault: each is given this many attempts (a route change as the
# stopped broker's lease expires redirects one), backing off at most this long.
stall_append_attempts_max: Final = 20
stall_append_backoff_cap_s: Final = 0.1
# Appends timed before the follower is stopped (the healthy latencies quoted beside).
healthy_appends: Final = 30
# An append through a resumed zombie is tried this long (it may fail: it must not commit
# below the new leader's end).
zombie_append_timeout_s: Final = 15.0


def quorum_leader(ctx: SoakContext, journal: str) -> BrokerProcess | None:
    """The broker the journal's term register names as leader (None: none appointed)."""
    cluster = ctx.stack.cluster
    entry = cluster.ks.get(quorum_term_key(cluster.root, journal))
    term = entry.decoded if entry is not None else None
    if not isinstance(term, QuorumTerm) or not term.record.leader:
        return None
    suffix = term.record.leader.split("#", 1)[-1]
    return next((b for b in cluster.brokers if b.suffix == suffix), None)


def _live(b: BrokerProcess | None) -> bool:
    return b is not None and b.running and not b.paused


def _pick(ctx: SoakContext, record: FaultRecord) -> tuple[str, BrokerProcess, bool]:
    """A quorum journal (rotating with the fault's index) and its live leader; else an R=3
    journal and its allocator's primary. The flag says whether it is a quorum journal."""
    layout = ctx.stack.layout
    quorum = layout.quorum_journals()
    for i in range(len(quorum)):
        journal = quorum[(record.index + i) % len(quorum)]
        leader = quorum_leader(ctx, journal)
        if leader is not None and _live(leader):
            return journal, leader, True
    if quorum:
        raise RuntimeError(f"no quorum journal has a live leader: {quorum}")
    r3 = [s.name for s in layout.journal_specs() if s.replication >= 3]
    for i in range(len(r3)):
        journal = r3[(record.index + i) % len(r3)]
        primary = ctx.stack.cluster.primary(journal)
        if primary is not None and _live(primary):
            record.notes.append("no quorum journal in this layout: the allocator's primary")
            return journal, primary, False
    raise RuntimeError("no R=3 journal has a live primary")


def _led_by(ctx: SoakContext, b: BrokerProcess) -> list[str]:
    return [j for j in ctx.stack.layout.quorum_journals() if quorum_leader(ctx, j) is b]


def _follower(ctx: SoakContext, journal: str, leader: BrokerProcess, index: int) -> BrokerProcess:
    members = [m.suffix for m in ctx.stack.cluster.route(journal).members]
    others = [b for b in ctx.stack.cluster.brokers if b.suffix in members and b is not leader]
    others = [b for b in others if _live(b)]
    if not others:
        raise RuntimeError(f"{journal}: no live member besides {leader.suffix}")
    return others[index % len(others)]


async def _leader_served(ctx: SoakContext, journal: str, t0: float) -> tuple[float, str]:
    """Empty appends to `journal` (each through a new client of a live broker, which proxies it
    to whom it takes for the leader) until one succeeds; the seconds from `t0` and the
    answering leader's suffix. Raises TimeoutError past `Timeouts.append_s`."""
    delay = leader_probe_backoff_initial_s
    last = "no attempt"
    while True:
        remaining = t0 + ctx.timeouts.append_s - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{journal}: no leader served an append (last: {last})")
        client = ctx.fresh_client()
        try:
            async with asyncio.timeout(min(leader_probe_attempt_s, remaining)):
                resp = await append(client, pb.AppendRequest(journal=journal), b"", attempts_max=1)
            route = resp.header.route
            primary = route.members[route.primary].suffix if route.primary >= 0 else "?"
            if resp.status == pb.OK:
                return time.monotonic() - t0, primary
            last = pb.Status.Name(resp.status)
        except Exception as err:  # Any failure: tried again until the deadline.
            last = f"{type(err).__name__}: {err}"[:200]
        finally:
            await client.close()
        await asyncio.sleep(delay)
        delay = min(leader_probe_backoff_max_s, delay * 2)


async def _check_leaders(
    ctx: SoakContext,
    record: FaultRecord,
    config: FaultConfig,
    journals: Sequence[str],
    t0: float,
    victim: BrokerProcess,
) -> None:
    """Each of `journals` (whose leader was `victim`) must have a leader serving appends
    within the lease TTL + `leader_slack_s` of `t0`."""
    bound = ctx.stack.config.lease_ttl_s + config.leader_slack_s

    async def one(journal: str) -> None:
        try:
            took, by = await _leader_served(ctx, journal, t0)
        except TimeoutError as err:
            record.leader_s[journal] = None
            record.findings.append(Finding("unrecovered", f"leader: {err}"))
            return
        prior = record.leader_s.get(journal)
        record.leader_s[journal] = took if prior is None else max(prior, took)
        record.notes.append(f"{journal}: {by} served an append {took:.1f}s after the fault")
        if took > bound:
            record.findings.append(
                Finding(
                    "slow election",
                    f"{journal}: no leader served an append until {took:.1f}s after"
                    f" {victim.suffix} (its leader) went; bound {bound:.0f}s (lease TTL +"
                    f" {config.leader_slack_s:.0f}s)",
                )
            )

    await asyncio.gather(*map(one, journals))


async def quorum_leader_kill(
    ctx: SoakContext, record: FaultRecord, config: FaultConfig
) -> list[str]:
    journal, leader, quorum = _pick(ctx, record)
    cluster = ctx.stack.cluster
    led = _led_by(ctx, leader) if quorum else []
    record.target = f"{leader.suffix} (leader of {journal}; {len(led)} quorum journal(s))"
    ctx.stack.held.add(leader.suffix)
    record.started_at = time.monotonic()
    await cluster.kill(leader)

    async def restart() -> None:
        ctx.stack.held.discard(leader.suffix)
        await cluster.start_broker(leader)

    await measure_while(
        ctx,
        record,
        all_journals(ctx),
        all_shards(ctx),
        _check_leaders(ctx, record, config, led, record.started_at, leader),
        later(config.restart_delay_s, restart),
    )
    return []


async def quorum_leader_zombie(
    ctx: SoakContext, record: FaultRecord, config: FaultConfig
) -> list[str]:
    journal, leader, quorum = _pick(ctx, record)
    cluster = ctx.stack.cluster
    led = _led_by(ctx, leader) if quorum else []
    record.target = f"{leader.suffix} (leader of {journal}; {len(led)} quorum journal(s))"

    def replaced() -> str | None:
        if quorum:
            now = quorum_leader(ctx, journal)
            if now is None or now is leader:
                return f"{journal}: leader {now.suffix if now else None}"
        else:
            primary = cluster.primary(journal)
            if primary is None or primary is leader:
                return f"{journal}: primary {primary.suffix if primary else None}"
        return None

    # Every other time it is resumed as soon as another member leads (fenced by the new term
    # alone: its lease may still be alive, so that it goes on as a member), else once its lease
    # is gone too (it then exits, or announces itself again).
    lease_gone = record.index % 2 == 0

    async def zombie() -> None:
        ends: dict[str, int] = {}
        try:
            await cluster.wait_until(replaced, ctx.timeouts.append_s)
            if lease_gone:
                await cluster.wait_until(cluster.member_gone(leader), ctx.timeouts.append_s)
                await asyncio.sleep(config.zombie_extra_s)  # How long it stays a zombie.
                # What the new leader(s) acknowledged so far: the zombie may not commit below.
                ends = {j: await _barrier(ctx, j) for j in led}
        finally:
            alive = cluster.member_gone(leader)() is not None
            cluster.resume(leader)
        if not lease_gone:
            # Resumed at once (its lease may still be alive): the new leader's end now.
            ends = {j: await _barrier(ctx, j) for j in led}
        record.notes.append(
            f"{leader.suffix} resumed {time.monotonic() - record.started_at:.1f}s after the"
            f" stop, its lease {'still alive' if alive else 'expired'}"
        )
        for j, end in ends.items():
            await _append_through_zombie(ctx, record, j, end, leader)
        await settle_resumed(ctx, record, leader)

    record.started_at = time.monotonic()
    cluster.pause(leader)
    try:
        await measure_while(
            ctx,
            record,
            all_journals(ctx),
            all_shards(ctx),
            _check_leaders(ctx, record, config, led, record.started_at, leader),
            zombie(),
        )
    finally:
        cluster.resume(leader)
    # Resumed with its lease alive, it may still find it expired a moment later and exit.
    return [leader.suffix]


async def _barrier(ctx: SoakContext, journal: str) -> int:
    """The journal's commit offset now: an empty append through a live broker (each attempt
    bounded: one proxied to a stopped broker would otherwise wait for it forever), tried until
    `Timeouts.append_s`."""
    last = ["no attempt"]

    async def attempts() -> int:
        delay = leader_probe_backoff_initial_s
        while True:
            client = ctx.fresh_client()
            try:
                async with asyncio.timeout(barrier_attempt_s):
                    resp = await append(
                        client, pb.AppendRequest(journal=journal), b"", attempts_max=1
                    )
                if resp.status == pb.OK:
                    return resp.commit.end
                last[0] = pb.Status.Name(resp.status)
            except Exception as err:  # Tried again until the bound (a timeout included).
                last[0] = f"{type(err).__name__}: {err}"[:200]
            finally:
                await client.close()
            await asyncio.sleep(delay)
            delay = min(leader_probe_backoff_max_s, delay * 2)

    try:
        async with asyncio.timeout(ctx.timeouts.append_s):
            return await attempts()
    except TimeoutError:
        raise RuntimeError(f"{journal}: no barrier append ({last[0]})") from None


async def _append_through_zombie(
    ctx: SoakContext, record: FaultRecord, journal: str, end: int, zombie: BrokerProcess
) -> None:
    """An empty append sent to the resumed zombie: it may fail or be proxied, but if it is
    acknowledged, then at or after `end` (what the new leader acknowledged meanwhile)."""
    client = ctx.stack.cluster.client(zombie)
    try:
        async with asyncio.timeout(zombie_append_timeout_s):
            resp = await append(
                client,
                pb.AppendRequest(journal=journal),
                b"",
                attempts_max=stall_append_attempts_max,
                backoff_cap_s=stall_append_backoff_cap_s,
            )
    except Exception as err:  # Refusing is allowed: committing below `end` is not.
        record.notes.append(
            f"{journal}: an append through the resumed zombie failed: {err!r}"[:300]
        )
        return
    finally:
        await client.close()
    route = resp.header.route
    by = route.members[route.primary].suffix if route.primary >= 0 else "?"
    if resp.commit.begin < end:
        record.findings.append(
            Finding(
                "zombie committed",
                f"{journal}: an append through the resumed zombie {zombie.suffix} was"
                f" acknowledged at [{resp.commit.begin}, {resp.commit.end}) (by {by}), below"
                f" {end}, which the new leader had acknowledged (an offset written twice)",
            )
        )
    else:
        record.notes.append(f"{journal}: an append through the resumed zombie committed by {by}")


async def quorum_follower_stop(
    ctx: SoakContext, record: FaultRecord, config: FaultConfig
) -> list[str]:
    journal, leader, quorum = _pick(ctx, record)
    cluster = ctx.stack.cluster
    follower = _follower(ctx, journal, leader, record.index)
    record.target = f"{follower.suffix} (follower of {journal})"
    client = ctx.stack.client(leader)
    healthy = [await _timed_append(client, journal) for _ in range(healthy_appends)]
    stopped: list[float] = []

    async def appends_while_stopped() -> None:
        until = record.started_at + config.follower_stop_s
        try:
            while time.monotonic() < until:
                try:
                    stopped.append(await _timed_append(client, journal))
                except Exception as err:  # A failed append is a finding: the rest is not timed.
                    record.findings.append(
                        Finding(
                            "append failed",
                            f"{journal}: with {follower.suffix} stopped: {type(err).__name__}:"
                            f" {err}",
                        )
                    )
                    break
        finally:
            cluster.resume(follower)
        await settle_resumed(ctx, record, follower)

    record.started_at = time.monotonic()
    cluster.pause(follower)
    try:
        await measure_while(
            ctx, record, all_journals(ctx), all_shards(ctx), appends_while_stopped()
        )
    finally:
        cluster.resume(follower)
    expected_exits = [follower.suffix]  # Its lease expired while stopped (see the zombie).
    if not stopped:
        raise RuntimeError(f"{journal}: no append completed while {follower.suffix} was stopped")
    record.stall_s[journal] = max(stopped)
    record.notes.append(
        f"{journal}: {len(stopped)} appends with {follower.suffix} stopped: p50"
        f" {percentile(stopped, 0.5) * 1000:.0f} ms, p99 {percentile(stopped, 0.99) * 1000:.0f} ms,"
        f" max {max(stopped) * 1000:.0f} ms; healthy before: p50"
        f" {percentile(healthy, 0.5) * 1000:.0f} ms, p99 {percentile(healthy, 0.99) * 1000:.0f}"
        f" ms ({len(healthy)} appends)"
    )
    if quorum and max(stopped) >= config.follower_stall_max_s:
        record.findings.append(
            Finding(
                "append stall",
                f"{journal}: an append took {max(stopped):.1f}s with one follower"
                f" ({follower.suffix}) stopped (bound {config.follower_stall_max_s:.1f}s)",
            )
        )
    return expected_exits


async def _timed_append(client: JournalClient, journal: str) -> float:
    """One empty append (a write barrier through the leader and its replication); seconds."""
    started = time.monotonic()
    try:
        resp = await append(
            client,
            pb.AppendRequest(journal=journal),
            b"",
            attempts_max=stall_append_attempts_max,
            backoff_cap_s=stall_append_backoff_cap_s,
        )
    except Exception as err:  # Typed for run_fault, which reports it.
        raise RuntimeError(f"{journal}: append failed: {type(err).__name__}: {err}") from err
    if resp.status != pb.OK:
        raise RuntimeError(f"{journal}: append {pb.Status.Name(resp.status)}")
    return time.monotonic() - started


async def quorum_member_restarts(
    ctx: SoakContext, record: FaultRecord, config: FaultConfig
) -> list[str]:
    """A follower, then the leader: kill -9, started again at once; the next once every
    journal is replicated again. Appends are measured from each kill."""
    journal, leader, quorum = _pick(ctx, record)
    cluster = ctx.stack.cluster
    follower = _follower(ctx, journal, leader, record.index)
    record.target = f"{follower.suffix} then {leader.suffix} (members of {journal})"
    for b in (follower, leader):
        led = _led_by(ctx, b) if quorum else []
        step = FaultRecord(index=record.index, kind=record.kind, started_at=time.monotonic())
        ctx.stack.held.add(b.suffix)
        try:
            await cluster.restart(b)  # kill -9, then started again at once
        finally:
            ctx.stack.held.discard(b.suffix)
        await measure_while(
            ctx,
            step,
            all_journals(ctx),
            (),
            _check_leaders(ctx, step, config, led, step.started_at, b),
        )
        for j, value in step.append_s.items():
            prior = record.append_s.get(j, 0.0)
            record.append_s[j] = None if value is None or prior is None else max(prior, value)
        for j, value in step.leader_s.items():
            prior = record.leader_s.get(j, 0.0)
            record.leader_s[j] = None if value is None or prior is None else max(prior, value)
        record.replication.update(step.replication)
        record.notes.extend(f"{b.suffix}: {note}" for note in step.notes)
        record.findings.extend(step.findings)
        # As a supervisor would: one that exited since (e.g. its lease lost while starting) is
        # started again before the next step waits for every journal.
        for name in await ctx.stack.revive():
            record.findings.append(
                Finding("unexpected exit", f"{name}: restarted; log in {ctx.stack.dir}")
            )
        await ctx.stack.wait_journals(ctx.timeouts.restore_s)
    await ctx.measure(record, record.started_at, (), all_shards(ctx))
    return []


QUORUM_FAULTS: dict[str, Fault] = {
    "quorum-leader-kill": quorum_leader_kill,
    "quorum-leader-zombie": quorum_leader_zombie,
    "quorum-follower-stop": quorum_follower_stop,
    "quorum-member-restarts": quorum_member_restarts,
}
