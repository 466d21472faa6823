"""What every fault of a soak shares: the stack, the workload, measurement and recovery.

`SoakContext` gives a fault what it needs around its own injection:

- `measure`: from the fault's start, probe appends to journals and wait for shards' progress
  (a verified sum of a stream that ended after the fault), concurrently, each bounded; times go
  to the `FaultRecord`, a timeout becomes an ``unrecovered`` finding;
- `restore`: as an operator and a supervisor would, start processes that exited (a finding
  unless the fault expected it), wait until every journal and shard is served as specified,
  and report shards that parked in FAILED (as ``sequence violation`` if the summer's
  `SequenceViolation` failed them, else ``shard failed``), unassigning them so they restart;
- `check`: read every journal through every running broker over gRPC and HTTP (and a quorum
  journal's committed range from each member itself), compare with the ledger, check persisted
  fragments, and collect the workload's own findings.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import aiohttp

from broker.client.appender import append
from broker.client.route_cache import ChannelPool, JournalClient
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from examples.stream_sum.chunker import Chunker
from examples.stream_sum.soak.checks import (
    ContentGapError,
    ContentLedger,
    Read,
    ReadFailedError,
    check_fragments,
    probe_append,
    read_grpc,
    read_http,
    read_member,
)
from examples.stream_sum.soak.report import FaultRecord
from examples.stream_sum.soak.stack import SoakStack, StackError
from examples.stream_sum.verifier import Finding

__all__ = ["ProgressTracker", "SoakContext", "Timeouts"]

# Between the baseline and the final check, a journal is read whole (through one broker and API
# in turn) at every this-many-th check; otherwise from near the end of what was verified.
whole_read_every: Final = 4


@dataclass(frozen=True)
class Timeouts:
    """Bounds of every wait after a fault (seconds)."""

    append_s: float = 60.0  # Fault to first successful append, per journal.
    progress_s: float = 90.0  # Fault to a shard's first verified sum after it.
    restore_s: float = 120.0  # Processes, journals and shards back as specified.
    exit_s: float = 60.0  # A SIGTERM'd broker's exit.


class ProgressTracker:
    """Resolves waits for "a sum of journal J verified, of a stream that ended after t0" from
    the verifier's `on_verified` callback."""

    def __init__(self) -> None:
        self._waiters: list[tuple[str, float, asyncio.Future[float]]] = []
        self._verified = asyncio.Event()

    def on_verified(self, journal: str, completed_at: float, verified_at: float) -> None:
        verified, self._verified = self._verified, asyncio.Event()
        verified.set()
        keep = []
        for j, t0, future in self._waiters:
            if future.done():
                continue
            if j == journal and completed_at >= t0:
                future.set_result(verified_at - t0)
            else:
                keep.append((j, t0, future))
        self._waiters = keep

    async def any_verified(self, timeout_s: float) -> None:
        """Wait for the next verified sum (of any journal)."""
        async with asyncio.timeout(timeout_s):
            await self._verified.wait()

    async def wait(self, journal: str, t0: float, timeout_s: float) -> float:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters.append((journal, t0, future))
        try:
            async with asyncio.timeout(max(0.0, t0 + timeout_s - time.monotonic())):
                return await future
        finally:
            future.cancel()


@dataclass
class SoakContext:
    stack: SoakStack
    chunker: Chunker
    tracker: ProgressTracker
    rng: random.Random
    timeouts: Timeouts = field(default_factory=Timeouts)
    ledger: ContentLedger = field(init=False)
    # Findings of the workload (chunker, verifier) already handed to a record.
    _taken: tuple[int, int] = (0, 0)
    # Checks run so far (which journals are read whole by which source: see `check`).
    _checks: int = 0
    # Persisted fragments verified already, per journal (check_fragments).
    _fragments: dict[str, set[tuple[int, int, bytes]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        json = {
            s.name
            for s in self.stack.layout.journal_specs()
            if labels.CONTENT_TYPE_JSON_LINES in labels.values_of(s.labels, labels.CONTENT_TYPE)
        }
        self.ledger = ContentLedger(json)

    def client(self) -> JournalClient:
        return self.stack.client()

    def fresh_client(self) -> JournalClient:
        """A new client (closed by the caller) of a random running broker. The soak's own
        probes and reads use new channels, so that they measure the brokers, not a channel's
        reconnect back-off (the workload's long-lived clients have theirs, and it shows in
        the consumers' progress)."""
        running = [b for b in self.stack.cluster.running() if not b.paused and b.endpoint]
        known = [b for b in self.stack.cluster.brokers if b.endpoint]
        return JournalClient(self.rng.choice(running or known).endpoint)

    async def close(self) -> None:
        pass

    # --- Measure ---

    async def measure(
        self,
        record: FaultRecord,
        t0: float,
        journals: Sequence[str] = (),
        shards: Sequence[str] = (),
    ) -> None:
        """Probe appends to `journals` and wait for progress of `shards`, from `t0`."""
        plans = {p.shard: p for p in self.stack.layout.shards}
        replication = {s.name: s.replication for s in self.stack.layout.journal_specs()}
        for journal in journals:
            record.replication[journal] = replication[journal]

        async def append(journal: str) -> None:
            try:
                record.append_s[journal] = await probe_append(
                    self.fresh_client, journal, t0, self.timeouts.append_s
                )
            except TimeoutError as err:
                record.append_s[journal] = None
                record.findings.append(Finding("unrecovered", f"appends: {err}"))

        async def progress(shard: str) -> None:
            plan = plans[shard]
            record.standby[shard] = record.standby.get(shard, plan.hot_standbys > 0)
            try:
                record.progress_s[shard] = await self.tracker.wait(
                    plan.journal, t0, self.timeouts.progress_s
                )
            except TimeoutError:
                record.progress_s[shard] = None
                record.findings.append(
                    Finding(
                        "unrecovered",
                        f"shard {shard}: no sum of {plan.journal} verified within"
                        f" {self.timeouts.progress_s:.0f}s of the fault"
                        f" ({self._shard_state(shard)})",
                    )
                )

        await asyncio.gather(*map(append, journals), *map(progress, shards))
        if any(v is None for v in (*record.append_s.values(), *record.progress_s.values())):
            # Something is stuck: every process says what its tasks wait on, in its log.
            asked = self.stack.dump_tasks()
            record.notes.append(f"asked {', '.join(asked)} for task dumps (in their logs)")

    def _shard_state(self, shard: str) -> str:
        states = [f"{a.suffix}/{a.slot}: {a.status.code}" for a in self.stack.assignments(shard)]
        return "assignments " + (", ".join(states) or "none")

    # --- Restore ---

    async def restore(self, record: FaultRecord, *, expected_exits: Sequence[str] = ()) -> None:
        """Bring everything back as specified; record how long it took since the fault."""
        deadline = record.started_at + self.timeouts.restore_s
        for name in await self.stack.revive():
            if name.split(" ")[0] in expected_exits:
                record.notes.append(f"{name} exited, as expected; restarted")
            else:
                record.findings.append(
                    Finding("unexpected exit", f"{name}: restarted; log in {self.stack.dir}")
                )
        try:
            await self.stack.wait_journals(max(1.0, deadline - time.monotonic()))
            await self._wait_shards(record, deadline)
        except StackError as err:
            record.findings.append(Finding("unrecovered", str(err)))
            return
        record.restored_s = time.monotonic() - record.started_at

    def report_failed_shards(self, record: FaultRecord, reported: set[str] | None = None) -> None:
        """A finding for each shard with a FAILED assignment (not in `reported`, which it
        extends): ``sequence violation`` if the summer's `SequenceViolation` failed it, else
        ``shard failed``."""
        reported = set() if reported is None else reported
        for shard, errors in self.stack.failed_shards().items():
            if shard in reported:
                continue
            reported.add(shard)
            text = "; ".join(errors)
            kind = "sequence violation" if "SequenceViolation" in text else "shard failed"
            record.findings.append(Finding(kind, f"shard {shard} FAILED: {text}"))

    async def _wait_shards(self, record: FaultRecord, deadline: float) -> None:
        """Wait for the shards; a FAILED one is reported (once) and unassigned, so that it is
        started again, as an operator would."""
        reported: set[str] = set()
        while True:
            remaining = deadline - time.monotonic()
            failed = self.stack.failed_shards()
            self.report_failed_shards(record, reported)
            if failed:
                try:
                    async with self.stack.shard_client() as shards:
                        await shards.unassign(sorted(failed), only_failed=True)
                    record.notes.append(f"unassigned FAILED shards {sorted(failed)}")
                except Exception as err:
                    record.notes.append(f"could not unassign {sorted(failed)}: {err}")
            try:
                await self.stack.wait_consumers(
                    lambda: (
                        "a shard FAILED"
                        if self.stack.failed_shards().keys() - reported
                        else self.stack.shards_problem()
                    ),
                    max(0.5, remaining),
                    "shards not back",
                )
            except StackError:
                if self.stack.failed_shards().keys() - reported and remaining > 0:
                    continue
                raise
            if not self.stack.failed_shards().keys() - reported:
                return

    # --- Check ---

    async def check(self, record: FaultRecord, *, whole: bool = False) -> None:
        """Readability and consistency of every journal; the workload's findings.

        With `whole` (the baseline and the final check), every journal is read from offset 0
        through every broker and API. Otherwise, so that a check does not grow with the
        journals (whole reads of all of them through 3 brokers x 2 APIs took minutes after
        half an hour), every `whole_read_every`-th check of a journal reads it whole through
        one (broker, API) in turn, and every other read starts `overlap_bytes` before the end
        of what was verified: every source still reads every new byte and repeats the
        verified tail, and the whole content is re-read through every source over the
        rounds."""
        brokers = [b for b in self.stack.cluster.brokers if b.running and not b.paused]
        journals = self.stack.layout.journals()
        sources = [(b, api) for b in brokers for api in ("gRPC", "HTTP")]
        turn = self._checks
        self._checks += 1

        async def read(
            index: int, journal: str, session: aiohttp.ClientSession, channels: ChannelPool
        ) -> None:
            reads: dict[str, Read] = {}
            whole_source = -1
            if whole:
                whole_source = len(sources)  # Every one: see below.
            elif (turn + index) % whole_read_every == 0 and sources:
                whole_source = ((turn + index) // whole_read_every) % len(sources)
            for i, (b, api) in enumerate(sources):
                start = 0 if whole or i == whole_source else self.ledger.read_start(journal)
                try:
                    if api == "gRPC":
                        content = await read_grpc(channels, b.endpoint, journal, start)
                    else:
                        content = await read_http(session, b.http_endpoint, journal, start)
                    reads[f"{b.suffix}/{api}"] = Read(start, content)
                except ReadFailedError as err:
                    kind = "content gap" if isinstance(err, ContentGapError) else "unreadable"
                    record.findings.append(Finding(kind, str(err)))
            if journal in quorum:
                await self._read_members(record, journal, channels, reads)
            record.findings.extend(self.ledger.check(journal, reads))
            if reads:
                # The furthest of the reads from the earliest offset.
                widest = min(reads.values(), key=lambda r: (r.start, -r.end))
                client = self.fresh_client()
                try:
                    verified = self._fragments.setdefault(journal, set())
                    record.findings.extend(await check_fragments(client, journal, widest, verified))
                finally:
                    await client.close()

        quorum = set(self.stack.layout.quorum_journals())
        channels = ChannelPool(channels_max=len(brokers) + 1)  # Fresh: see fresh_client.
        try:
            async with aiohttp.ClientSession() as session:
                for index, journal in enumerate(journals):
                    await read(index, journal, session, channels)
        finally:
            await channels.close()
        record.findings.extend(self.take_findings())

    async def _read_members(
        self, record: FaultRecord, journal: str, channels: ChannelPool, reads: dict[str, Read]
    ) -> None:
        """A quorum journal's committed range (up to a barrier's commit offset), read straight
        from each running member of its route, served by that broker itself: added to `reads`
        (as ``<broker>/member``), so that the ledger compares them with every other read."""
        client = self.fresh_client()
        try:
            barrier = await append(client, pb.AppendRequest(journal=journal), b"")
        except Exception as err:  # A check that cannot run is a finding, not a crash.
            record.findings.append(Finding("unreadable", f"{journal}: no barrier append: {err}"))
            return
        finally:
            await client.close()
        end = barrier.commit.end
        start = self.ledger.read_start(journal)
        members = {m.suffix for m in self.stack.cluster.route(journal).members}
        for b in self.stack.cluster.brokers:
            if b.suffix not in members or not b.running or b.paused:
                continue
            try:
                content = await read_member(channels, b.endpoint, b.suffix, journal, start, end)
            except ReadFailedError as err:
                kind = "content gap" if isinstance(err, ContentGapError) else "unreadable"
                record.findings.append(Finding(kind, f"member read: {err}"))
                continue
            reads[f"{b.suffix}/member"] = Read(start, content)

    def take_findings(self) -> list[Finding]:
        """The workload's findings not handed out yet (its lists only grow)."""
        self.chunker.verifier.check_deadlines()
        chunker, verifier = self.chunker.findings, self.chunker.verifier.findings
        a, b = self._taken
        self._taken = (len(chunker), len(verifier))
        return [*chunker[a:], *verifier[b:]]
