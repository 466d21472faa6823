"""Append semantics across three `gazette serve` processes on a real etcd (issue #3): journals of
replication 3 over two zones, each replica checked through reads it answers from its own spool.

- Concurrent appenders never interleave: every append of many concurrent clients (each streamed
  in several chunks) is found whole, contiguous and exactly once, at the offsets its commit
  named, and every replica holds the same bytes.
- A client that aborts mid-append (cancels the call, breaks the protocol, or ends its stream
  without committing), directly or through a broker that proxies it, leaves no trace: every
  replica's write head is unchanged and the next append lands there.
- A register check-and-set race has exactly one winner: the others get REGISTER_MISMATCH (with
  the winner's registers), append nothing, and the journal's registers are the winner's.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from e2e_workload import journal_spec, replica_content, replica_head, requires_etcd

from broker.client.appender import Appender, append
from broker.client.route_cache import ChannelPool, JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.protocol.status import RegisterMismatchError
from broker.testing.process_cluster import BrokerProcess, ProcessCluster

pytestmark = [pytest.mark.etcd, requires_etcd, pytest.mark.asyncio(loop_scope="module")]

BROKERS = [("zone-a", "broker-a1"), ("zone-a", "broker-a2"), ("zone-b", "broker-b1")]
CONCURRENT = "semantics/concurrent"
ABORTED = "semantics/aborted"
REGISTERS = "semantics/registers"
# Fragments far larger than anything written here: after the journal's very first fragment
# (rolled by the second append), every byte stays in each replica's own spool file.
FRAGMENT_BYTES = 64 << 20

WRITERS = 16
APPENDS_PER_WRITER = 20
# Appends are streamed in chunks this small, so that each one is several messages.
CHUNK_BYTES = 512
CONTENDERS = 12
# Generous flow control: slow clients are not what this module is about, and on a loaded machine
# a broker may itself take more than the default second to get to a client's next chunk.
FLOW_CONTROL_ARGS = ["--flow-control-burst", "10"]


@dataclass
class Env:
    cluster: ProcessCluster
    channels: ChannelPool

    def members(self, journal: str) -> list[BrokerProcess]:
        return [self.cluster.broker(m.suffix) for m in self.cluster.route(journal).members]

    def primary(self, journal: str) -> BrokerProcess:
        b = self.cluster.primary(journal)
        assert b is not None, f"{journal}: no primary"
        return b

    def replica(self, journal: str) -> BrokerProcess:
        """A member of the route that is not the primary (it proxies appends)."""
        primary = self.primary(journal)
        return next(b for b in self.members(journal) if b is not primary)

    async def heads(self, journal: str) -> dict[str, int]:
        return {
            b.suffix: await replica_head(self.channels, b, journal) for b in self.members(journal)
        }

    async def contents(self, journal: str, offset: int) -> dict[str, bytes]:
        """Each replica's content from ``offset``, from its own spool files."""
        return {
            b.suffix: await replica_content(self.channels, b, journal, offset, local=True)
            for b in self.members(journal)
        }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env() -> AsyncIterator[Env]:
    async with ProcessCluster(BROKERS, extra_args=FLOW_CONTROL_ARGS) as cluster:
        journals = [CONCURRENT, ABORTED, REGISTERS]
        specs = [journal_spec(j, 3, cluster.store_url, length=FRAGMENT_BYTES) for j in journals]
        await cluster.apply(specs)
        await cluster.wait_until(cluster.journals_ready(journals, 3, zones_min=2))
        channels = ChannelPool()
        try:
            yield Env(cluster, channels)
        finally:
            await channels.close()


async def preamble(client: JournalClient, journal: str) -> int:
    """A first append: the journal's first fragment is rolled by the next one, after which all
    content stays local. Returns the write head."""
    resp = await append(client, pb.AppendRequest(journal=journal), b"preamble\n")
    return resp.commit.end


# --- Concurrent appenders ---------------------------------------------------------------------

FRAME = re.compile(rb"<(\d{2}):(\d{4}):(\d{6})>")


def frame(writer: int, seq: int) -> bytes:
    """A self-describing append: a header naming its writer, sequence number and body length,
    then a body repeating the same tag. Between 1.5 and 6 KiB: 3 to 12 chunks."""
    length = 1536 + (writer * 977 + seq * 331) % 4608
    return b"<%02d:%04d:%06d>" % (writer, seq, length) + body(writer, seq, length)


def body(writer: int, seq: int, length: int) -> bytes:
    tag = b"[%02d.%04d]" % (writer, seq)
    return (tag * (length // len(tag) + 1))[:length]


def parse_frames(content: bytes, base: int) -> list[tuple[int, int, int, int]]:
    """(writer, seq, begin, end) of each frame of ``content`` (at journal offset ``base``),
    asserting that the content is whole frames only, each with its own body."""
    out = []
    pos = 0
    while pos < len(content):
        m = FRAME.match(content, pos)
        assert m is not None, f"torn or foreign bytes at offset {base + pos}"
        writer, seq, length = (int(g) for g in m.groups())
        end = m.end() + length
        assert content[m.end() : end] == body(writer, seq, length), (
            f"append ({writer}, {seq}) at offset {base + pos} is interleaved with another"
        )
        out.append((writer, seq, base + pos, base + end))
        pos = end
    return out


async def test_concurrent_appenders_never_interleave(env: Env) -> None:
    cluster = env.cluster
    # Clients through each broker: two of them reach the primary through a proxying broker
    # for their first append, then (having learned the route) go to it directly.
    clients = [cluster.client(b) for b in env.members(CONCURRENT)]
    start = await preamble(clients[0], CONCURRENT)
    commits: dict[tuple[int, int], tuple[int, int]] = {}

    async def writer(w: int) -> None:
        client = clients[w % len(clients)]
        for seq in range(APPENDS_PER_WRITER):
            resp = await append(
                client,
                pb.AppendRequest(journal=CONCURRENT),
                frame(w, seq),
                attempts_max=1,  # No retries: a retried append could legitimately repeat.
                chunk_bytes_max=CHUNK_BYTES,
            )
            commits[(w, seq)] = (resp.commit.begin, resp.commit.end)

    async with asyncio.timeout(90):
        await asyncio.gather(*(writer(w) for w in range(WRITERS)))

    head = max(end for _, end in commits.values())
    heads = await env.heads(CONCURRENT)
    assert set(heads.values()) == {head}, heads
    contents = await env.contents(CONCURRENT, start)
    content = contents[env.primary(CONCURRENT).suffix]
    for suffix, replica in contents.items():
        assert replica == content, f"{suffix} differs from the primary"

    frames = parse_frames(content, start)
    # Exactly once each, at the offsets its commit named; together they tile [start, head).
    assert len(frames) == WRITERS * APPENDS_PER_WRITER
    assert {(w, s): (b, e) for w, s, b, e in frames} == commits
    spans = sorted((b, e) for _, _, b, e in frames)
    assert spans[0][0] == start and spans[-1][1] == head
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


# --- A client that aborts mid-append ------------------------------------------------------------

ABORTED_CHUNKS = 32
# Bound on the wait for a broker's answer to an aborted append.
ANSWER_TIMEOUT_S = 30.0
ABORTED_CHUNK = b"partial content that must never be seen\n" * 256  # ~10 KiB


# Each way to abort an append in the middle of its content, given the call (grpc.aio stubs are
# untyped): it aborts and returns the call's outcome as the client sees it.


async def cancel(call: Any) -> grpc.StatusCode:
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            await call
    return grpc.StatusCode.CANCELLED


async def break_protocol(call: Any) -> grpc.StatusCode:
    # A content message may carry nothing but content: one naming a journal aborts the append.
    await call.write(pb.AppendRequest(journal=ABORTED, content=b"more"))
    # Answered at once, the stream still open (a proxy used to wait for the client's next
    # message before relaying the primary's answer).
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            await call
    assert "journal: unexpected after the first message" in (info.value.details() or "")
    return info.value.code()


async def end_without_commit(call: Any) -> grpc.StatusCode:
    await call.done_writing()  # No empty commit chunk before the end of the stream.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            await call
    assert "without the empty commit chunk" in (info.value.details() or "")
    return info.value.code()


ABORTS: dict[str, tuple[Callable[[Any], Awaitable[grpc.StatusCode]], grpc.StatusCode]] = {
    "cancel": (cancel, grpc.StatusCode.CANCELLED),
    "break-protocol": (break_protocol, grpc.StatusCode.INVALID_ARGUMENT),
    "end-without-commit": (end_without_commit, grpc.StatusCode.INVALID_ARGUMENT),
}


@pytest.mark.parametrize("via", ["primary", "proxy"])
@pytest.mark.parametrize("how", list(ABORTS))
async def test_an_aborted_append_leaves_no_trace(env: Env, how: str, via: str) -> None:
    client = env.cluster.client(env.primary(ABORTED))
    await append(client, pb.AppendRequest(journal=ABORTED), b"committed before\n")
    heads = await env.heads(ABORTED)
    head = heads[env.primary(ABORTED).suffix]
    assert set(heads.values()) == {head}, heads

    target = env.primary(ABORTED) if via == "primary" else env.replica(ABORTED)
    call = env.channels.stub(target.endpoint).Append()
    await call.write(pb.AppendRequest(journal=ABORTED))
    for _ in range(ABORTED_CHUNKS):
        await call.write(pb.AppendRequest(content=ABORTED_CHUNK))
    abort, code = ABORTS[how]
    assert await abort(call) == code

    # The next append lands at the old head (it waits for the aborted one's rollback), and
    # every replica holds exactly it there: none of the aborted content.
    after = b"committed after\n"
    resp = await append(client, pb.AppendRequest(journal=ABORTED), after)
    assert (resp.commit.begin, resp.commit.end) == (head, head + len(after))
    assert await env.heads(ABORTED) == {suffix: head + len(after) for suffix in heads}
    assert await env.contents(ABORTED, head) == {suffix: after for suffix in heads}


# --- A register check-and-set race --------------------------------------------------------------


async def test_register_check_and_set_race_has_exactly_one_winner(env: Env) -> None:
    # The fencing pattern of recovery logs: each contender checks that the register still holds
    # the epoch it read and, with its content, sets an epoch of its own.
    clients = [env.cluster.client(b) for b in env.members(REGISTERS)]
    epoch0 = label_set([("epoch", "0")])
    resp = await append(
        clients[0], pb.AppendRequest(journal=REGISTERS, union_registers=epoch0), b"init;"
    )
    assert resp.registers == epoch0
    head = resp.commit.end

    async def contend(i: int) -> tuple[pb.AppendResponse | None, bool]:
        request = pb.AppendRequest(
            journal=REGISTERS,
            check_registers=pb.LabelSelector(include=epoch0),
            union_registers=label_set([("epoch", f"1-{i}")]),
        )
        appender = Appender(clients[i % len(clients)], request, chunk_bytes_max=4)
        try:
            # A loser may be refused while it still streams: write() then raises.
            await appender.write(f"writer-{i};".encode())
            await appender.commit()
        except RegisterMismatchError:
            return appender.response, False
        return appender.response, True

    async with asyncio.timeout(60):
        outcomes = await asyncio.gather(*(contend(i) for i in range(CONTENDERS)))

    winners = [i for i, (_, won) in enumerate(outcomes) if won]
    assert len(winners) == 1, winners
    winner = winners[0]
    registers = label_set([("epoch", f"1-{winner}")])
    for outcome, won in outcomes:
        assert outcome is not None
        if won:
            assert outcome.status == pb.OK and outcome.registers == registers
        else:
            assert outcome.status == pb.REGISTER_MISMATCH and outcome.registers == registers

    # Only the winner's content was appended, on every replica; a zero-byte append (which
    # changes nothing) reports the journal's registers: the winner's.
    expected = f"writer-{winner};".encode()
    won_resp = outcomes[winner][0]
    assert won_resp is not None and won_resp.commit.begin == head
    assert await env.contents(REGISTERS, head) == {
        b.suffix: expected for b in env.members(REGISTERS)
    }
    resp = await append(clients[0], pb.AppendRequest(journal=REGISTERS), b"")
    assert resp.registers == registers
    assert (resp.commit.begin, resp.commit.end) == (head + len(expected),) * 2
