"""``python -m gazette_consumer.demo`` (``make demo``): an exactly-once pipeline in one process.

The embedded mode of docs/architecture.md ("Two ways to run"), end to end: an in-process keyspace
(etcd's semantics, no
etcd), a broker serving gRPC on loopback with a ``file://`` fragment store under the data
directory, and a consumer member running the counting example (`examples.counter.Counter`) with
one SQLite store per shard under the data directory.

Two input journals feed one shard each; both shards publish their derived messages to one
output journal. Two Publishers write the input, keyed so that a key always lands in the same
journal: one publishes committed messages, the other transactions, one of which is rolled back
(the producer re-sends its previous ACKs, as a restarted consumer's recovery does); and some
committed messages are appended a second time, byte for byte, as a retried append does. The
demo then waits until both shards have read through everything (the Shard service's Stat waits
on the shard's progress), and checks what exactly-once promises:

- the counts in the SQL stores grew, key by key, by exactly what was committed this run;
- a read-committed reader of the output sees one derived message per committed input message:
  per key the totals 1, 2, ..., count (over every run), each once, none from a rolled-back
  message, none twice.

It prints a verdict and exits 1 if either differs. Stopping the broker persists the fragments,
so a second run on the same data directory continues where the first stopped: the journals
resume at their persisted heads (the confirmation ``gazctl journals reset-head`` gives), the
shards from their SQLite checkpoints, and the counts grow by exactly the second run's messages.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
from collections import Counter as Tally
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import grpc.aio
import sqlalchemy as sa
from google.protobuf.duration_pb2 import Duration

from broker import client
from broker.cli.reset_head import reset_head
from broker.client.append_service import AppendService
from broker.client.async_append import AsyncAppend
from broker.flag_types import log_level
from broker.fragment.naming import parse_content_name
from broker.keyspace.embedded import EmbeddedStore
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import ShardStatusError
from examples.counter import Count, Counted, Counter, read_counts
from gazette_consumer.member import ConsumerConfig, ConsumerMember
from gazette_consumer.message import (
    CONTENT_TYPE_JSON_LINES,
    JSONFraming,
    Partition,
    Partitions,
    Publisher,
    modulo_mapping,
)
from gazette_consumer.runner import ShardRuntime, shard_factory, start_embedded_broker
from gazette_consumer.sequencer.read_iter import ReadCommittedIter
from gazette_consumer.shard_client import ShardClient
from gazette_consumer.shard_client import upsert as shard_upsert
from gazette_consumer.topology import shard_route

INPUTS = ("demo/counts/in-0", "demo/counts/in-1")
OUTPUT = "demo/counts/out"
SHARDS = {"counter-0": INPUTS[0], "counter-1": INPUTS[1]}  # Shard → its source journal.
ROOT = "/gazette/consumers/demo-counter"
KEYS = ("apple", "banana", "cherry", "damson", "elder", "fig")

# The workload of one run (the same every run; seeded, so that the counts differ per key).
SEED = 20261124
COMMITTED_MESSAGES = 2000  # Publisher A: committed messages.
# Publisher B: transactions, in order, of (messages, acknowledged?); the False one is rolled back.
TRANSACTIONS = ((1000, True), (300, False), (500, True))
# Every 10th committed message, the 3rd-latest committed message is appended again (a retried
# append): the copy lands after later messages of the same producer.
DUPLICATE_EVERY = 10
DUPLICATE_LAG = 3

# Bounds of each wait; every wait is on an event, these only turn a hang into an error.
assign_wait_s = 30.0
consume_wait_s = 60.0
derived_wait_s = 60.0

JSON = JSONFraming()


class DemoError(RuntimeError):
    """A step of the demo did not complete (a wait ran out, a shard failed)."""


# --- The workload ---------------------------------------------------------------------------------


class Workload:
    """Publishes one run's input and remembers what must count: `expected` per key, and the UUIDs
    of the messages that committed (`committed`) and of those rolled back (`rolled_back`)."""

    def __init__(self, appends: AppendService) -> None:
        self.appends = appends
        self.a: Publisher[AsyncAppend] = Publisher(appends)  # Committed messages.
        self.b: Publisher[AsyncAppend] = Publisher(appends)  # Transactions.
        partitions = Partitions.of_journals(INPUTS, CONTENT_TYPE_JSON_LINES)
        self.to = modulo_mapping(_key, partitions)
        self.expected: Tally[str] = Tally()
        self.committed: set[UUID] = set()
        self.rolled_back: set[UUID] = set()
        self.messages = self.acks = self.duplicates = 0  # Frames written, of each kind.
        self.last: dict[str, AsyncAppend] = {}  # Journal → its last append (the head, once done).

    def _sent(self, append: AsyncAppend) -> None:
        self.last[append.journal] = append  # Appends to a journal commit in release order.

    async def run(self) -> dict[str, int]:
        """Publish everything; return each input journal's head once it all committed."""
        rng = random.Random(SEED)
        slots = ["a"] * COMMITTED_MESSAGES + ["b"] * sum(n for n, _ in TRANSACTIONS)
        rng.shuffle(slots)  # Interleave the two publishers.
        published: list[Count] = []
        txns = iter(TRANSACTIONS)
        size, acknowledge = next(txns)
        open_txn: list[Count] = []
        last_acks: dict[str, bytes] = {}
        for slot in slots:
            message = Count(key=rng.choice(KEYS))
            self.messages += 1
            if slot == "a":
                self._sent(await self.a.publish_committed(self.to, message))
                self._commit([message])
                published.append(message)
                if len(published) % DUPLICATE_EVERY == 0:
                    await self._duplicate(published[-DUPLICATE_LAG])
                continue
            self._sent(await self.b.publish_uncommitted(self.to, message))
            open_txn.append(message)
            if len(open_txn) < size:
                continue
            intents = self.b.build_ack_intents()  # This transaction's ACK, per journal.
            if acknowledge:
                last_acks.update(intents)
                self._commit(open_txn)
            else:
                # Roll back: re-send the previous ACK of each journal instead. Readers take an
                # ACK they already saw as "the producer restarted from there", and drop what it
                # published since.
                if not intents.keys() <= last_acks.keys():
                    raise DemoError("a rollback needs an earlier ACK on every journal it touched")
                intents = {journal: last_acks[journal] for journal in intents}
                self.rolled_back.update(m.uuid for m in open_txn)
            for append in await self.b.write_ack_intents(intents):
                self._sent(append)
                self.acks += 1
            open_txn = []
            size, acknowledge = next(txns, (0, False))
        await self.appends.flush()
        return {journal: (await append).commit.end for journal, append in self.last.items()}

    def _commit(self, messages: Sequence[Count]) -> None:
        for message in messages:
            self.expected[message.key] += message.n
            self.committed.add(message.uuid)

    async def _duplicate(self, message: Count) -> None:
        """Append `message` again, the same bytes with the same UUID: what a retry of an append
        whose response was lost does."""
        journal = self.to(message).journal
        append = await self.appends.start_append(journal)
        append.write(JSON.marshal(message))
        append.release()
        self._sent(append)
        self.messages += 1
        self.duplicates += 1


# --- Set-up and waits -----------------------------------------------------------------------------


def journal_spec(name: str, store_url: str) -> pb.JournalSpec:
    return pb.JournalSpec(
        name=name,
        replication=1,
        labels=pb.LabelSet(labels=[pb.Label(name="content-type", value=CONTENT_TYPE_JSON_LINES)]),
        fragment=pb.JournalSpec.Fragment(
            length=1 << 26,  # Large: fragments are cut when the broker stops, not by size.
            compression_codec=pb.ZSTANDARD,
            stores=[store_url],
            refresh_interval=Duration(seconds=30),
        ),
    )


def shard_spec(shard: str, source: str) -> cpb.ShardSpec:
    return cpb.ShardSpec(
        id=shard,
        sources=[cpb.ShardSpec.Source(journal=source)],
        max_txn_duration=Duration(seconds=1),
        labels=pb.LabelSet(labels=[pb.Label(name="counter.example/output", value=OUTPUT)]),
    )


async def wait_journals_assigned(c: client.JournalClient) -> None:
    """Until every demo journal has a primary broker (watched, not polled)."""
    want = {*INPUTS, OUTPUT}
    try:
        async with asyncio.timeout(assign_wait_s):
            async for snapshot in client.watch_journals(c, "prefix=demo/counts/"):
                if want <= {j.spec.name for j in snapshot.journals if j.route.primary >= 0}:
                    return
    except TimeoutError:
        raise DemoError(f"journals had no primary broker after {assign_wait_s}s") from None
    raise DemoError("the journal listing ended before every journal was assigned")


async def wait_shards_assigned(member: ConsumerMember) -> None:
    """Until every shard has a primary (re-checked at each update of the member's mirror)."""
    missing = list(SHARDS)
    try:
        async with asyncio.timeout(assign_wait_s):
            while missing := [s for s in SHARDS if shard_route(member.ks, ROOT, s)[0].primary < 0]:
                if member.failure is not None:
                    raise DemoError(f"the consumer member failed: {member.failure}")
                await member.ks.wait_for_revision(member.ks.header.revision + 1, assign_wait_s)
    except TimeoutError:
        raise DemoError(f"shards {missing} had no primary after {assign_wait_s}s") from None


async def wait_read_through(endpoint: str, heads: Mapping[str, int]) -> None:
    """Until each shard's last completed transaction (committed, ACKs written) read through its
    source's head: the consumer's Stat waits on the shard's progress."""
    async with ShardClient(endpoint, timeout_s=consume_wait_s) as shards:
        for shard, source in SHARDS.items():
            try:
                await shards.stat(shard, {source: heads[source]})
            except grpc.aio.AioRpcError as err:
                raise DemoError(
                    f"shard {shard} did not read through {source}@{heads[source]} "
                    f"(Stat: {err.code().name}: {err.details()}; bound {consume_wait_s}s)"
                ) from None
            except ShardStatusError as err:
                raise DemoError(f"shard {shard} stopped before it read everything: {err}") from None


def committed_counts(db_dir: Path) -> dict[str, Tally[str]]:
    """Each shard's counts in its SQLite store (none if the store does not exist yet)."""
    out: dict[str, Tally[str]] = {}
    for shard in SHARDS:
        path = db_dir / f"{shard}.sqlite"
        out[shard] = Tally()
        if not path.exists():
            continue
        engine = sa.create_engine(f"sqlite:///{path}")
        try:
            if sa.inspect(engine).has_table("counter_counts"):
                out[shard].update(read_counts(engine, shard))
        finally:
            engine.dispose()
    return out


async def read_derived(c: client.JournalClient, marker: UUID) -> list[Counted]:
    """The output journal read-committed from its start, up to `marker` (a committed message
    appended once the shards had finished: everything they acknowledged precedes it)."""
    out: list[Counted] = []
    try:
        async with ReadCommittedIter(c, {OUTPUT: 0}, message_type=Counted) as it:
            async with asyncio.timeout(derived_wait_s):
                while True:
                    envelope = await it.next()
                    if envelope.uuid == marker:
                        return out
                    if envelope.message.key:  # Not the end marker of an earlier run.
                        out.append(envelope.message)
    except TimeoutError:
        raise DemoError(
            f"{OUTPUT}: read {len(out)} derived messages, but not this run's end marker, "
            f"within {derived_wait_s}s"
        ) from None


# --- Checking and printing ------------------------------------------------------------------------


def check(
    expected: Mapping[str, int],
    committed: set[UUID],
    rolled_back: set[UUID],
    before: Mapping[str, Tally[str]],
    after: Mapping[str, Tally[str]],
    derived: Sequence[Counted],
) -> list[str]:
    """What differs between what this run committed (`expected` per key, the UUIDs of
    `committed` and `rolled_back` input messages) and what was observed: the shards' counts
    `before` and `after` the run, every `derived` message of every run. Empty: exactly once."""
    problems = []
    grown: Tally[str] = Tally()
    for shard in after:
        grown.update(after[shard])
        grown.subtract(before.get(shard, Tally()))
    if +grown != +Tally(expected):
        problems.append(f"counts grew by {dict(+grown)}, not by the {dict(expected)} committed")
    counts = sum(after.values(), Tally[str]())
    totals: dict[str, list[int]] = {}
    for message in derived:
        totals.setdefault(message.key, []).append(message.total)
    for key in sorted(counts.keys() | totals.keys()):
        if sorted(totals.get(key, [])) != list(range(1, counts[key] + 1)):
            problems.append(f"{key}: derived totals are not 1, 2, ..., {counts[key]}, each once")
    sources = [UUID(m.source) for m in derived]
    if len(set(sources)) != len(sources):
        problems.append(f"{len(sources) - len(set(sources))} derived messages came twice")
    if missing := len(committed - set(sources)):
        problems.append(f"{missing} committed messages of this run were not derived")
    if rolled := sum(1 for s in sources if s in rolled_back):
        problems.append(f"{rolled} derived messages came from rolled-back input")
    return problems


def print_counts(before: Mapping[str, Tally[str]], after: Mapping[str, Tally[str]]) -> None:
    print("counts in the shards' SQL stores (committed):")
    print(f"  {'key':<8} {'shard':<10} {'before':>7} {'this run':>9} {'now':>7}")
    for shard in SHARDS:
        for key in sorted(after[shard]):
            was, now = before[shard][key], after[shard][key]
            print(f"  {key:<8} {shard:<10} {was:>7} {now - was:>+9} {now:>7}")
    was = sum(sum(t.values()) for t in before.values())
    now = sum(sum(t.values()) for t in after.values())
    print(f"  {'total':<19} {was:>7} {now - was:>+9} {now:>7}")


def print_fragments(fragments: Path) -> bool:
    """Print each journal's persisted fragment files; whether they cover it from offset 0
    without a gap."""
    print(f"fragments persisted under {fragments} (file:// store):")
    whole = True
    for journal in (*INPUTS, OUTPUT):
        files = sorted((fragments / journal).glob("*.zst"))
        spans = sorted(parse_content_name(p.name)[:2] for p in files)
        end = 0
        for begin, stop in spans:
            whole = whole and begin <= end
            end = max(end, stop)
        newest = files[-1].name if files else "-"
        if len(newest) > 60:
            newest = f"{newest[:44]}…{newest[-16:]}"
        print(f"  {journal:<17} {len(files)} files, bytes [0, {end:>7}), newest {newest}")
    if not whole:
        print("demo: the persisted fragments leave a gap in a journal", file=sys.stderr)
    return whole


# --- The demo -------------------------------------------------------------------------------------


def prepare(data_dir: Path) -> Path:
    """The absolute data directory, with its fragment store, spool and store directories."""
    data_dir = data_dir.resolve()
    for sub in ("fragments", "spools", "db"):
        (data_dir / sub).mkdir(parents=True, exist_ok=True)
    return data_dir


async def run(data_dir: Path) -> int:
    """Run the demo on `data_dir` (created if missing); the exit code."""
    data_dir = await asyncio.to_thread(prepare, data_dir)
    fragments, db_dir = data_dir / "fragments", data_dir / "db"
    print(f"gazette-py demo: an exactly-once counting pipeline; data under {data_dir}")
    store = EmbeddedStore()
    # Durable spools under <data_dir>/spools: a run killed mid-way loses nothing acknowledged.
    address, stop_broker = await start_embedded_broker(store, zone="local", data_dir=str(data_dir))
    c = client.JournalClient(address)
    consumer_backend = store.connect()
    try:
        async with shard_factory(ShardRuntime(Counter(data_dir=db_dir), ROOT, address)) as start:
            member = ConsumerMember(
                consumer_backend, ConsumerConfig(zone="local", suffix="consumer", root=ROOT), start
            )
            await member.start()
            try:
                code = await pipeline(c, member, data_dir)
            finally:
                # A lone member has nobody to hand its shards to: stop without draining.
                await member.stop(graceful=False)
    except DemoError as err:
        print(f"demo: {err}", file=sys.stderr)
        code = 1
    finally:
        await c.close()
        await stop_broker()  # Persists the journals' fragments to the store.
        await consumer_backend.close()
    return code if print_fragments(fragments) else 1


async def set_up(c: client.JournalClient, member: ConsumerMember, store_url: str) -> None:
    """Create the journals (continuing an earlier run's) and the shards."""
    journals = (*INPUTS, OUTPUT)
    await client.apply_journals(c, [client.upsert(journal_spec(j, store_url)) for j in journals])
    await wait_journals_assigned(c)
    resumed = []
    for journal in journals:
        # An earlier run's fragments are in the store: the broker appends after them only once
        # told explicitly where the journal continues (as `gazctl journals reset-head` does).
        head, outcome = await reset_head(c, journal)
        if outcome != "empty":
            resumed.append(f"{journal}@{head}")
    if resumed:
        print(f"continuing an earlier run: {', '.join(resumed)}")
    async with ShardClient(member.endpoint) as shards:
        await shards.apply([shard_upsert(shard_spec(s, j)) for s, j in SHARDS.items()])
    print(f"shards: {', '.join(f'{s} <- {j}' for s, j in SHARDS.items())}; both -> {OUTPUT}")


async def pipeline(c: client.JournalClient, member: ConsumerMember, data_dir: Path) -> int:
    """Set up, publish, wait until consumed, and judge (see the module docstring)."""
    consumer = member.endpoint.removeprefix("http://")
    print(f"broker on {c.endpoint}, consumer on {consumer}, one process (embedded keyspace)")
    db_dir = data_dir / "db"
    before = await asyncio.to_thread(committed_counts, db_dir)  # Before any shard runs.
    await set_up(c, member, f"file://{data_dir / 'fragments'}/")
    async with AppendService(c) as appends:
        work = Workload(appends)
        heads = await work.run()
        print(
            f"published {work.messages} messages (and {work.acks} ACKs):\n"
            f"  publisher A: {COMMITTED_MESSAGES} committed\n"
            f"  publisher B: transactions of "
            f"{' + '.join(str(n) for n, ack in TRANSACTIONS if ack)} acknowledged, "
            f"{len(work.rolled_back)} rolled back\n"
            f"  retries:     {work.duplicates} committed messages appended again (same UUID)\n"
            f"  => {len(work.committed)} must count, each once"
        )
        await wait_shards_assigned(member)
        await wait_read_through(member.endpoint, heads)
        marker = Counted()  # Ends what this run's reader of the output waits for.
        await (await Publisher(appends).publish_committed(_to_output, marker))
    after = await asyncio.to_thread(committed_counts, db_dir)
    print_counts(before, after)
    derived = await read_derived(c, marker.uuid)
    new = [m for m in derived if UUID(m.source) in work.committed]
    print(f"derived on {OUTPUT}, read-committed: {len(new)} this run, {len(derived)} in all")
    if new:
        print(f"  the last: {new[-1].key} reached {new[-1].total} (input {new[-1].source})")
    problems = check(work.expected, work.committed, work.rolled_back, before, after, derived)
    if problems:
        print("exactly-once: FAILED\n" + "\n".join(f"  {p}" for p in problems))
        return 1
    print(
        f"exactly-once: OK (+{len(work.committed)} counted and derived, each once; "
        f"{len(work.rolled_back)} rolled back and {work.duplicates} duplicates left out)"
    )
    return 0


def _key(message: Count) -> str:
    return message.key


def _to_output(_message: Any) -> Partition:
    return Partition(OUTPUT, CONTENT_TYPE_JSON_LINES)


def main(argv: Sequence[str] | None = None) -> int:
    from broker import logging as gazette_logging

    parser = argparse.ArgumentParser(
        prog="python -m gazette_consumer.demo",
        description="Run an exactly-once counting pipeline on the embedded default.",
    )
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("GAZETTE_DEMO_DIR", "demo-data"),
        help="fragments, spools and SQLite stores (a second run continues the first)",
    )
    # Warnings are expected on a second run (the broker refuses appends until the heads are
    # reset): the demo reports its own errors, so only errors are logged by default.
    parser.add_argument(
        "--log-level", type=log_level, default=os.environ.get("GAZETTE_LOG_LEVEL", "error")
    )
    args = parser.parse_args(argv)
    gazette_logging.configure("console", args.log_level)
    return asyncio.run(run(Path(args.data_dir)))


if __name__ == "__main__":
    sys.exit(main())
