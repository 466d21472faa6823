"""The faults a soak injects, each with what it measures and how it heals.

Every fault gets a fresh `FaultRecord` whose `started_at` is the moment of injection. A fault
injects, measures (`SoakContext.measure`: appends and shard progress from that moment) while
it lasts or until the stack copes, and heals what it broke (restarts what it killed, resumes
what it stopped); then the soak `restore`s and `check`s. Faults:

- ``broker-primary-kill``: kill -9 the primary broker of a journal (rotating over journals);
  a supervisor starts it again (same identity and address) `restart_delay_s` later. Journals
  of replication 2 fail over meanwhile; journals of replication 3, on three brokers, are not
  appendable until the broker is back (Gazette refuses appends to a route short of its
  replication: INSUFFICIENT_JOURNAL_BROKERS).
- ``broker-pair-kill``: kill -9 two brokers at once, keeping alive one that is a member of
  every journal's route (R=3 journals lose two replicas; no journal loses all of them, which
  Gazette does not survive either); both are started again `restart_delay_s` later.
- ``broker-zombie``: SIGSTOP a primary broker until its etcd lease has expired (its member key
  is gone) and another broker took its journals over, then SIGCONT it: a zombie.
- ``broker-rolling-restart``: SIGTERM every broker in turn (it must hand its journals off and
  exit 0), start it again, and wait for its journals to be fully replicated before the next.
- ``shard-kill-standby`` / ``shard-kill-no-standby``: kill -9 the consumer process holding the
  primary of a shard with (without) a hot standby; started again `restart_delay_s` later.
- ``etcd-restart``: kill -9 etcd and start it again (same data and ports).
- ``postgres-restart``: crash PostgreSQL (``pg_ctl stop -m immediate``) and start it again.
- ``s3-outage`` / ``file-store-outage``: the fragment store fails for `store_outage_s`: the
  S3 server is stopped with SIGSTOP (requests hang), or the ``file://`` root is moved away
  (writes fail: no such directory); then it is back, with its content.
"""

from __future__ import annotations

import asyncio
import time

from broker.protocol import consumer_pb2 as cpb
from broker.protocol.status import GazetteError
from broker.testing.process_cluster import ProcessClusterError
from examples.stream_sum.soak.context import SoakContext
from examples.stream_sum.soak.fault_kit import (
    Fault,
    FaultConfig,
    all_journals,
    all_shards,
    later,
    measure_while,
    pick_journal,
    settle_resumed,
)
from examples.stream_sum.soak.quorum_faults import QUORUM_FAULTS
from examples.stream_sum.soak.report import FaultRecord
from examples.stream_sum.verifier import Finding

__all__ = ["FAULTS", "FaultConfig", "run_fault"]


async def run_fault(ctx: SoakContext, index: int, kind: str, config: FaultConfig) -> FaultRecord:
    """Inject fault `kind`, restore the stack and check it; the record of it all."""
    record = FaultRecord(index=index, kind=kind, started_at=time.monotonic())
    try:
        expected_exits = await FAULTS[kind](ctx, record, config)
    except (ProcessClusterError, GazetteError, OSError, RuntimeError) as err:
        record.findings.append(Finding("fault failed", f"{kind}: {type(err).__name__}: {err}"))
        expected_exits = []
    await ctx.restore(record, expected_exits=expected_exits)
    await ctx.check(record)
    return record


async def broker_primary_kill(
    ctx: SoakContext, record: FaultRecord, config: FaultConfig
) -> list[str]:
    journal, b = pick_journal(ctx, record)
    cluster = ctx.stack.cluster
    record.target = f"{b.suffix} (primary of {journal})"
    ctx.stack.held.add(b.suffix)
    record.started_at = time.monotonic()
    await cluster.kill(b)

    async def restart() -> None:
        ctx.stack.held.discard(b.suffix)
        await cluster.start_broker(b)

    await measure_while(
        ctx,
        record,
        all_journals(ctx),
        all_shards(ctx),
        later(config.restart_delay_s, restart),
    )
    return []


async def broker_pair_kill(ctx: SoakContext, record: FaultRecord, config: FaultConfig) -> list[str]:
    cluster = ctx.stack.cluster
    journals = all_journals(ctx)
    survivors = [
        b
        for b in cluster.brokers
        if all(any(m.suffix == b.suffix for m in cluster.route(j).members) for j in journals)
    ]
    if not survivors:
        raise RuntimeError(
            "no broker is a member of every journal's route: killing two brokers would lose"
            " every replica of some journal (not a fault Gazette survives)"
        )
    survivor = survivors[record.index % len(survivors)]
    victims = [b for b in cluster.brokers if b is not survivor]
    record.target = f"{'+'.join(b.suffix for b in victims)} (keeping {survivor.suffix})"
    ctx.stack.held.update(b.suffix for b in victims)
    record.started_at = time.monotonic()
    await asyncio.gather(*(cluster.kill(b) for b in victims))

    async def restart() -> None:
        for b in victims:
            ctx.stack.held.discard(b.suffix)
        await asyncio.gather(*(cluster.start_broker(b) for b in victims))

    await measure_while(
        ctx, record, journals, all_shards(ctx), later(config.restart_delay_s, restart)
    )
    return []


async def broker_zombie(ctx: SoakContext, record: FaultRecord, config: FaultConfig) -> list[str]:
    journal, b = pick_journal(ctx, record)
    cluster = ctx.stack.cluster
    record.target = f"{b.suffix} (primary of {journal})"

    def taken_over() -> str | None:
        primary = cluster.primary(journal)
        if primary is None or primary is b:
            return f"{journal}: primary {primary.suffix if primary else None}"
        return None

    async def zombie() -> None:
        try:
            # Stopped until its lease is gone and another broker serves the journal.
            await cluster.wait_until(cluster.member_gone(b), ctx.timeouts.append_s)
            await cluster.wait_until(taken_over, ctx.timeouts.append_s)
            await asyncio.sleep(config.zombie_extra_s)  # How long it stays a zombie: the fault.
        finally:
            cluster.resume(b)
        await settle_resumed(ctx, record, b)

    record.started_at = time.monotonic()
    cluster.pause(b)
    try:
        await measure_while(ctx, record, all_journals(ctx), all_shards(ctx), zombie())
    finally:
        cluster.resume(b)
    return []


async def broker_rolling_restart(
    ctx: SoakContext, record: FaultRecord, _: FaultConfig
) -> list[str]:
    """Each broker in turn: SIGTERM, wait for its exit, start it again at once (as an
    orchestrator's rolling update does), and wait for every journal to be replicated again
    before the next. Appends to the journals it was primary of are measured from its SIGTERM."""
    cluster = ctx.stack.cluster
    record.target = "every broker, in turn"
    for b in list(cluster.brokers):
        journals = [j for j in all_journals(ctx) if cluster.primary(j) is b]
        step = FaultRecord(index=record.index, kind=record.kind, started_at=time.monotonic())
        ctx.stack.held.add(b.suffix)
        try:
            code, took_s = await cluster.terminate(b, ctx.timeouts.exit_s)
        finally:
            ctx.stack.held.discard(b.suffix)
        if code != 0:
            record.findings.append(Finding("unclean exit", f"{b.suffix} exited {code} on SIGTERM"))
        record.notes.append(f"{b.suffix} exited {code} in {took_s:.1f}s after SIGTERM")
        if took_s >= ctx.stack.config.handoff_timeout_s:
            record.findings.append(
                Finding(
                    "slow hand-off",
                    f"{b.suffix}: its journals had not moved {took_s:.0f}s after SIGTERM"
                    f" (hand-off timeout {ctx.stack.config.handoff_timeout_s:.0f}s)",
                )
            )
        await measure_while(ctx, step, journals, (), cluster.start_broker(b))
        for journal, value in step.append_s.items():
            prior = record.append_s.get(journal, 0.0)
            worst = None if value is None or prior is None else max(prior, value)
            record.append_s[journal] = worst
        record.replication.update(step.replication)
        record.findings.extend(step.findings)
        await ctx.stack.wait_journals(ctx.timeouts.restore_s)
    await ctx.measure(record, record.started_at, (), all_shards(ctx))
    return []


async def _shard_kill(
    ctx: SoakContext, record: FaultRecord, config: FaultConfig, standby: bool
) -> list[str]:
    plans = [p for p in ctx.stack.layout.shards if (p.hot_standbys > 0) == standby]
    if not plans:
        raise RuntimeError(f"the layout has no shard {'with' if standby else 'without'} a standby")
    plan = plans[record.index % len(plans)]
    consumer = ctx.stack.primary_of(plan.shard)
    if consumer is None or not consumer.running:
        raise RuntimeError(f"shard {plan.shard} has no running primary")
    # Every shard whose primary is there loses it; those with a ready standby fail over.
    hosted = [p.shard for p in ctx.stack.layout.shards if ctx.stack.primary_of(p.shard) is consumer]
    for shard in hosted:
        record.standby[shard] = _standby_ready(ctx, shard)
    record.target = f"{consumer.suffix} (primary of {', '.join(hosted)})"
    ctx.stack.held.add(consumer.suffix)
    record.started_at = time.monotonic()
    await consumer.kill()

    async def restart() -> None:
        ctx.stack.held.discard(consumer.suffix)
        await consumer.start()

    await measure_while(ctx, record, (), hosted, later(config.restart_delay_s, restart))
    return []


def _standby_ready(ctx: SoakContext, shard: str) -> bool:
    return any(
        a.slot > 0 and a.status.code == cpb.ReplicaStatus.STANDBY
        for a in ctx.stack.assignments(shard)
    )


async def shard_kill_standby(
    ctx: SoakContext, record: FaultRecord, config: FaultConfig
) -> list[str]:
    return await _shard_kill(ctx, record, config, standby=True)


async def shard_kill_no_standby(
    ctx: SoakContext, record: FaultRecord, config: FaultConfig
) -> list[str]:
    return await _shard_kill(ctx, record, config, standby=False)


async def etcd_restart(ctx: SoakContext, record: FaultRecord, _: FaultConfig) -> list[str]:
    etcd = ctx.stack.cluster.etcd
    record.target = "etcd (kill -9, start)"
    record.started_at = time.monotonic()
    await etcd.kill()
    await etcd.start()
    await ctx.measure(record, record.started_at, all_journals(ctx), all_shards(ctx))
    return []


async def postgres_restart(ctx: SoakContext, record: FaultRecord, _: FaultConfig) -> list[str]:
    pg = ctx.stack.pg
    if pg is None:
        raise RuntimeError("the soak runs without PostgreSQL")
    record.target = "postgres (stop -m immediate, start)"
    record.started_at = time.monotonic()
    await pg.crash()
    await pg.start()
    shards = [p.shard for p in ctx.stack.layout.shards if p.store == "postgres"]
    await ctx.measure(record, record.started_at, (), shards)
    return []


async def s3_outage(ctx: SoakContext, record: FaultRecord, config: FaultConfig) -> list[str]:
    moto = ctx.stack.moto
    if moto is None:
        raise RuntimeError("the soak runs without S3")
    record.target = f"S3 server stopped (SIGSTOP) {config.store_outage_s:.0f}s"
    record.started_at = time.monotonic()
    moto.pause()
    try:
        await asyncio.gather(
            ctx.measure(record, record.started_at, all_journals(ctx), all_shards(ctx)),
            asyncio.sleep(config.store_outage_s),  # The outage's length: the fault itself.
        )
    finally:
        moto.resume()
    return []


async def file_store_outage(
    ctx: SoakContext, record: FaultRecord, config: FaultConfig
) -> list[str]:
    root = ctx.stack.cluster.fragments_dir
    away = root.with_name(root.name + ".offline")
    record.target = f"file:// root moved away {config.store_outage_s:.0f}s"
    record.started_at = time.monotonic()
    root.rename(away)
    try:
        await asyncio.gather(
            ctx.measure(record, record.started_at, all_journals(ctx), all_shards(ctx)),
            asyncio.sleep(config.store_outage_s),  # The outage's length: the fault itself.
        )
    finally:
        away.rename(root)
    return []


FAULTS: dict[str, Fault] = {
    "broker-primary-kill": broker_primary_kill,
    "broker-pair-kill": broker_pair_kill,
    "broker-zombie": broker_zombie,
    "broker-rolling-restart": broker_rolling_restart,
    "shard-kill-standby": shard_kill_standby,
    "shard-kill-no-standby": shard_kill_no_standby,
    "etcd-restart": etcd_restart,
    "postgres-restart": postgres_restart,
    "s3-outage": s3_outage,
    "file-store-outage": file_store_outage,
    **QUORUM_FAULTS,
}
