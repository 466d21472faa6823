"""The soak: the stream-sum workload on a real cluster, under faults, checked after each.

`run_soak` starts a `SoakStack`, the sums reader and a chunker, measures a baseline (every
journal appendable, every shard progressing), then injects faults one after another (a given
list, or every kind in a seeded random order, round after round, until `duration_s` has
passed), each followed by restore and checks (faults.py). It prints a line per fault, stops
the chunker, waits until every sum it expects is verified (bounded by the sums' deadline),
checks everything a last time and prints the summary table and every finding. The result is
`ok` only if nothing was found: no violation, no unrecovered fault.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from broker.client.append_service import AppendService
from broker.client.appender import append
from broker.protocol import protocol_pb2 as pb
from examples.stream_sum.chunker import Chunker, ChunkerConfig
from examples.stream_sum.soak.context import ProgressTracker, SoakContext, Timeouts
from examples.stream_sum.soak.faults import FAULTS, FaultConfig, run_fault
from examples.stream_sum.soak.report import FaultRecord, one_line, summary
from examples.stream_sum.soak.stack import SoakStack, StackConfig
from examples.stream_sum.verifier import Finding, SumVerifier, read_sums

__all__ = ["SoakConfig", "SoakResult", "run_soak"]


@dataclass(frozen=True)
class SoakConfig:
    # Faults in this order; empty: every kind, in seeded random rounds, for `duration_s`.
    faults: Sequence[str] = ()
    duration_s: float = 600.0
    kinds: Sequence[str] = tuple(FAULTS)
    seed: int = 12
    chunks_per_s: float = 40.0
    sum_deadline_s: float = 120.0
    # No fault starts after this many seconds from the start (None: no bound), so that a run
    # whose faults do not recover still ends in time, with its report.
    faults_budget_s: float | None = None
    # A fault the stack did not recover from gets one more restore window before the soak
    # stops (off: stop at once).
    late_restore: bool = True
    faults_config: FaultConfig = field(default_factory=FaultConfig)
    timeouts: Timeouts = field(default_factory=Timeouts)
    stack: StackConfig = field(default_factory=StackConfig)

    def __post_init__(self) -> None:
        unknown = sorted((set(self.faults) | set(self.kinds)) - FAULTS.keys())
        if unknown:
            raise ValueError(f"unknown fault kind(s) {unknown}; known: {sorted(FAULTS)}")


@dataclass
class SoakResult:
    records: list[FaultRecord]
    findings: list[tuple[str, Finding]]  # (fault, finding)
    verified_sums: int
    chunks: int
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return not self.findings


def schedule(config: SoakConfig, rng: random.Random) -> Callable[[int, float], str | None]:
    """The next fault kind, given how many ran and the seconds elapsed; None: stop."""
    if config.faults:
        return lambda index, _: config.faults[index] if index < len(config.faults) else None
    order: list[str] = []

    def next_kind(index: int, elapsed_s: float) -> str | None:
        if elapsed_s >= config.duration_s:
            return None
        if not order:
            order.extend(rng.sample(list(config.kinds), len(config.kinds)))
        return order.pop(0)

    return next_kind


async def run_soak(config: SoakConfig, out: Callable[[str], None] = print) -> SoakResult:
    rng = random.Random(config.seed)
    started = time.monotonic()
    records: list[FaultRecord] = []
    out(f"soak: seed {config.seed}; starting etcd, brokers, consumers, PostgreSQL, S3")
    async with SoakStack(config.stack) as stack:
        out(f"soak: stack up in {time.monotonic() - started:.1f}s; logs under {stack.dir}")
        layout = stack.layout
        client = stack.client()
        tracker = ProgressTracker()
        verifier = SumVerifier(config.sum_deadline_s, on_verified=tracker.on_verified)
        barrier = await append(client, pb.AppendRequest(journal=layout.sums_journal), b"")
        read_errors: list[BaseException] = []
        reader = asyncio.create_task(
            read_sums(client, layout.sums_journal, barrier.commit.end, verifier, read_errors.append)
        )
        async with AppendService(client) as appends:
            chunker = Chunker(
                appends,
                ChunkerConfig(journals=layout.chunk_journals, chunks_per_s=config.chunks_per_s),
                verifier,
                rng=random.Random(rng.random()),
            )
            publishing = asyncio.create_task(chunker.run())
            ctx = SoakContext(stack, chunker, tracker, rng, config.timeouts)
            try:
                baseline = FaultRecord(index=0, kind="baseline", started_at=time.monotonic())
                await ctx.measure(
                    baseline,
                    baseline.started_at,
                    layout.journals(),
                    [p.shard for p in layout.shards],
                )
                await ctx.check(baseline, whole=True)
                out(baseline.line())
                records.append(baseline)
                next_kind = schedule(config, rng)
                index = 1
                while (kind := next_kind(index - 1, time.monotonic() - started)) is not None:
                    elapsed = time.monotonic() - started
                    if config.faults_budget_s is not None and elapsed > config.faults_budget_s:
                        out(f"soak: out of time ({elapsed:.0f}s): no more faults")
                        break
                    record = await run_fault(ctx, index, kind, config.faults_config)
                    out(record.line())
                    records.append(record)
                    index += 1
                    if record.restored_s is None and not (
                        config.late_restore and await _late_restore(ctx, record, out)
                    ):
                        # Later faults would only pile up on this one: stop here.
                        out(f"soak: stopping: the stack did not recover from fault {record.index}")
                        break
                chunker.stop()
                await publishing
                final = FaultRecord(index=index, kind="final", started_at=time.monotonic())
                await _drain(verifier, tracker, config.sum_deadline_s, final)
                # A shard that FAILED after the last fault's restore is reported here (no
                # restore follows to find it; its sums are only late otherwise).
                ctx.report_failed_shards(final)
                await ctx.check(final, whole=True)
                if publishing.done() and (err := publishing.exception()) is not None:
                    final.findings.append(Finding("chunker failed", repr(err)))
                if reader.done() and (err := reader.exception()) is not None:
                    final.findings.append(Finding("sums reader gave up", repr(err)))
                if read_errors:
                    final.notes.append(
                        f"the sums reader resumed {len(read_errors)} time(s) after a failed"
                        f" read (last: {read_errors[-1]!r})"[:300]
                    )
                out(final.line())
                records.append(final)
            finally:
                chunker.stop()
                publishing.cancel()
                reader.cancel()
                await asyncio.gather(publishing, reader, return_exceptions=True)
                await ctx.close()
                if any(r.findings for r in records):
                    stack.keep_logs()
                    out(f"soak: findings: the logs are kept under {stack.dir}")
    result = SoakResult(
        records=records,
        findings=[(f"{r.index} {r.kind}", f) for r in records for f in r.findings],
        verified_sums=verifier.verified,
        chunks=chunker.stats.chunks,
        elapsed_s=time.monotonic() - started,
    )
    out("")
    out(summary([r for r in records if r.kind not in ("baseline", "final")]))
    s = chunker.stats
    out(
        f"\nworkload: {s.chunks} chunks ({s.duplicates} appended twice), {s.commits} transactions"
        f" committed, {s.rollbacks} rolled back, {s.abandons} abandoned; {s.streams_ended}"
        f" streams ended, {verifier.verified} sums verified; {result.elapsed_s:.0f}s"
    )
    if result.ok:
        out("soak: OK (no violation, every fault recovered)")
    else:
        out(f"soak: FAILED, {len(result.findings)} finding(s):")
        for where, finding in result.findings:
            out(f"  [fault {where}] {one_line(str(finding))}")
    return result


async def _late_restore(ctx: SoakContext, record: FaultRecord, out: Callable[[str], None]) -> bool:
    """One more restore window for a fault the stack did not recover from in time: if it
    recovers now, say how late (the fault keeps its findings) and go on."""
    late = FaultRecord(index=record.index, kind=record.kind, started_at=time.monotonic())
    await ctx.restore(late)
    if late.restored_s is None:
        return False
    out(
        f"      note: fault {record.index}: everything was back"
        f" {time.monotonic() - record.started_at:.0f}s after it (late); going on"
    )
    return True


async def _drain(
    verifier: SumVerifier, tracker: ProgressTracker, timeout_s: float, record: FaultRecord
) -> None:
    """Wait until every expected sum was verified (each verification is an event)."""
    deadline = time.monotonic() + timeout_s
    while verifier.outstanding:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            record.findings.append(
                Finding(
                    "unrecovered",
                    f"{verifier.outstanding} sum(s) still outstanding {timeout_s:.0f}s after the"
                    f" chunker stopped, by journal: {verifier.outstanding_by_journal()}",
                )
            )
            return
        try:
            await tracker.any_verified(remaining)
        except TimeoutError:
            pass
