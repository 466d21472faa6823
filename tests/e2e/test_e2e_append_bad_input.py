"""Bad input to the Append RPC of `gazette serve` processes on a real etcd (issue #3): three
brokers, a journal of replication 3. Each bad append gets its status or a typed gRPC error that
names what was wrong, and leaves the journal unchanged on every replica: same write head, same
content, and the next append lands at the old head.

- an unknown journal: JOURNAL_NOT_FOUND (and no journal appears);
- a malformed first message (bad journal name, negative offset, unsorted registers, a bad
  header) or no message at all: INVALID_ARGUMENT naming the field;
- content before the metadata (a first message carrying content): INVALID_ARGUMENT;
- an offset ahead of the journal: WRONG_APPEND_OFFSET;
- a stalled 100 MB append (the client streams part of it, then sends nothing more without
  closing its stream): the broker rolls it back once the client falls behind the minimum append
  rate (`gazette serve --min-append-rate --flow-control-burst`), and the client gets
  RESOURCE_EXHAUSTED; none of its bytes is ever committed, on any replica or in the persisted
  fragment files. Also through a broker that proxies the append to the primary.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from e2e_workload import (
    fragment_files,
    journal_spec,
    replica_content,
    replica_head,
    requires_etcd,
    stored_prefix,
)

from broker.client.appender import Appender, append
from broker.client.route_cache import ChannelPool, JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.protocol.status import JournalNotFoundError, WrongAppendOffsetError
from broker.serve_cli import main as gazette_main
from broker.testing.process_cluster import BrokerProcess, ProcessCluster
from broker.topology import lookup_item

pytestmark = [pytest.mark.etcd, requires_etcd, pytest.mark.asyncio(loop_scope="module")]

BROKERS = [("zone-a", "broker-a1"), ("zone-a", "broker-a2"), ("zone-b", "broker-b1")]
J = "bad-input/journal"
# Small fragments: appends roll them often, and the persisted files are checked.
FRAGMENT_BYTES = 4 << 10

# The brokers' flow-control policy: a client must stream at least MIN_RATE bytes a second, and
# may fall behind it by BURST_S seconds' worth; a stalled append is rolled back BURST_S seconds
# after the broker received its last chunk. (Longer than the default second: robust on a loaded
# machine, where the broker itself may be slow to take the next chunk.)
MIN_RATE = 1 << 15
BURST_S = 2.0

# The stalled append is of 100 MB, of which the client streams the first STALLED_SENT_BYTES (far
# beyond any fragment, buffer or flow-control window) before it stalls. (Nothing on the wire
# announces an append's size: the rest is only the client's intent.)
STALLED_APPEND_BYTES = 100 << 20
STALLED_SENT_BYTES = 48 << 20
STALLED_CHUNK_BYTES = 1 << 20

# Bound on any wait for a broker's answer (a stall is answered after BURST_S).
ANSWER_TIMEOUT_S = 30.0
# Bound on the wait for the brokers to persist rolled fragments (no event: the directory is
# polled every PERSIST_POLL_S).
PERSIST_TIMEOUT_S = 30.0
PERSIST_POLL_S = 0.1


@dataclass
class Env:
    cluster: ProcessCluster
    channels: ChannelPool
    client: JournalClient

    def members(self) -> list[BrokerProcess]:
        return [self.cluster.broker(m.suffix) for m in self.cluster.route(J).members]

    def target(self, via: str) -> BrokerProcess:
        """The journal's primary, or (``via`` "proxy") a member that proxies to it."""
        primary = self.cluster.primary(J)
        assert primary is not None
        if via == "primary":
            return primary
        return next(b for b in self.members() if b is not primary)

    async def state(self) -> tuple[int, bytes]:
        """The journal's write head and content, asserted identical on every replica (each
        answering itself)."""
        views = {
            b.suffix: (
                await replica_head(self.channels, b, J),
                await replica_content(self.channels, b, J),
            )
            for b in self.members()
        }
        head, content = next(iter(views.values()))
        assert len(content) == head
        for suffix, view in views.items():
            assert view == (head, content), f"{suffix} differs: head {view[0]} != {head}"
        return head, content

    async def check_unchanged(self, before: tuple[int, bytes]) -> int:
        """Every replica still holds exactly ``before``, and the next append lands at its head.
        Returns the write head after that append."""
        assert await self.state() == before
        head, content = before
        data = b"next append at %d\n" % head
        resp = await append(self.client, pb.AppendRequest(journal=J), data)
        assert (resp.commit.begin, resp.commit.end) == (head, head + len(data))
        assert await self.state() == (head + len(data), content + data)
        return head + len(data)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env() -> AsyncIterator[Env]:
    flow_control = ["--min-append-rate", str(MIN_RATE), "--flow-control-burst", str(BURST_S)]
    async with ProcessCluster(BROKERS, extra_args=flow_control) as cluster:
        await cluster.apply([journal_spec(J, 3, cluster.store_url, length=FRAGMENT_BYTES)])
        await cluster.wait_until(cluster.journals_ready([J], 3, zones_min=2))
        channels = ChannelPool()
        try:
            e = Env(cluster, channels, cluster.client())
            await append(e.client, pb.AppendRequest(journal=J), b"seed\n" * 1000)
            yield e
        finally:
            await channels.close()


async def raw_append(env: Env, via: str, messages: list[pb.AppendRequest]) -> grpc.aio.AioRpcError:
    """Send ``messages`` as an Append stream to a broker (bypassing the client's own checks),
    close it, and return the gRPC error the broker answered with."""
    call = env.channels.stub(env.target(via).endpoint).Append()
    try:
        for message in messages:
            await call.write(message)
        await call.done_writing()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        pass  # The broker answered before the stream ended: its answer is awaited below.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            await call
    return info.value


async def test_unknown_journal(env: Env) -> None:
    before = await env.state()
    unknown = "bad-input/no-such-journal"
    with pytest.raises(JournalNotFoundError):
        await append(env.client, pb.AppendRequest(journal=unknown), b"lost\n")
    # Also through the other brokers: each resolves it (none has it), none proxies.
    for b in env.members():
        messages = [pb.AppendRequest(journal=unknown), pb.AppendRequest(content=b"x")]
        resp = await env.channels.stub(b.endpoint).Append([*messages, pb.AppendRequest()])
        assert resp.status == pb.JOURNAL_NOT_FOUND
        assert resp.header.process_id == b.id
    assert lookup_item(env.cluster.ks, env.cluster.root, unknown) is None
    assert not (env.cluster.fragments_dir / unknown).exists()
    await env.check_unchanged(before)


MALFORMED = {
    "journal-name": (pb.AppendRequest(journal="bad-input/bad name"), "journal"),
    "negative-offset": (pb.AppendRequest(journal=J, offset=-5), "offset: must be >= 0"),
    "unsorted-registers": (
        pb.AppendRequest(journal=J, union_registers=label_set([("b", "1"), ("a", "1")])),
        "union_registers",
    ),
    "bad-header": (
        pb.AppendRequest(journal=J, header=pb.Header(process_id=pb.ProcessSpec.ID(zone="z"))),
        "header",
    ),
}


@pytest.mark.parametrize("via", ["primary", "proxy"])
@pytest.mark.parametrize("case", list(MALFORMED))
async def test_malformed_request(env: Env, case: str, via: str) -> None:
    before = await env.state()
    first, detail = MALFORMED[case]
    # Followed by content and the commit marker: had the first message been accepted, the
    # content would have been appended.
    err = await raw_append(env, via, [first, pb.AppendRequest(content=b"bad"), pb.AppendRequest()])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert detail in (err.details() or ""), err.details()
    await env.check_unchanged(before)


async def test_empty_request_stream(env: Env) -> None:
    before = await env.state()
    err = await raw_append(env, "primary", [])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "empty request stream" in (err.details() or "")
    await env.check_unchanged(before)


@pytest.mark.parametrize(
    ("first", "detail"),
    [
        # Content where the metadata should be: no journal named at all.
        (pb.AppendRequest(content=b"content first"), "journal"),
        # Metadata and content in one message: content must follow the metadata.
        (pb.AppendRequest(journal=J, content=b"content first"), "content: unexpected"),
    ],
    ids=["content-only", "content-with-metadata"],
)
async def test_content_before_metadata(env: Env, first: pb.AppendRequest, detail: str) -> None:
    before = await env.state()
    err = await raw_append(env, "primary", [first, pb.AppendRequest()])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert detail in (err.details() or ""), err.details()
    await env.check_unchanged(before)


async def test_offset_ahead_of_the_journal(env: Env) -> None:
    before = await env.state()
    head, _ = before
    appender = Appender(env.client, pb.AppendRequest(journal=J, offset=head + 1000))
    with pytest.raises(WrongAppendOffsetError):
        # Refused once the broker checks the offset: maybe while the content is still sent.
        await appender.write(b"ahead\n")
        await appender.commit()
    assert appender.response is not None
    assert appender.response.status == pb.WRONG_APPEND_OFFSET
    head = await env.check_unchanged(before)
    # The journal's own head is accepted as an explicit offset.
    resp = await append(env.client, pb.AppendRequest(journal=J, offset=head), b"at the head\n")
    assert resp.commit.begin == head


def stalled_content() -> Iterator[bytes]:
    """The 100 MB the stalling client means to append, chunk by chunk: recognisable lines."""
    for index in range(STALLED_APPEND_BYTES // STALLED_CHUNK_BYTES):
        line = b"stalled append, chunk %06d\n" % index
        yield (line * (STALLED_CHUNK_BYTES // len(line) + 1))[:STALLED_CHUNK_BYTES]


async def stall(call: Any) -> None:
    """Begin the 100 MB append on ``call``, stream its first STALLED_SENT_BYTES, then stall:
    send nothing more, and keep the stream open. Returns once that part is sent."""
    await call.write(pb.AppendRequest(journal=J))
    for chunk in itertools.islice(stalled_content(), STALLED_SENT_BYTES // STALLED_CHUNK_BYTES):
        await call.write(pb.AppendRequest(content=chunk))


@pytest.mark.parametrize("via", ["primary", "proxy"])
async def test_a_stalled_100_mb_append_is_rolled_back(env: Env, via: str) -> None:
    before = await env.state()
    call = env.channels.stub(env.target(via).endpoint).Append()
    await stall(call)
    # The broker's answer is the event: it comes once the client has fallen BURST_S behind.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            await call
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"did not sustain the minimum append rate ({MIN_RATE} B/s)" in (
        info.value.details() or ""
    )
    await env.check_unchanged(before)

    # Fill the current fragment past FRAGMENT_BYTES, and roll it with one more append, so
    # that the brokers persist it: the files then cover the offsets where the stalled content
    # was spooled, and none holds any of it or reaches past the write head.
    await append(env.client, pb.AppendRequest(journal=J), b"fill\n" * (FRAGMENT_BYTES // 4))
    rolled, _ = await env.state()
    await append(env.client, pb.AppendRequest(journal=J), b"tail\n")
    head, content = await env.state()
    stored = await persisted_prefix(env, rolled)
    assert stored == content[: len(stored)]
    for f in fragment_files(env.cluster.fragments_dir, J):
        assert f.end <= head and b"stalled append" not in f.content, (f.begin, f.end)


async def persisted_prefix(env: Env, end: int) -> bytes:
    """The journal's persisted content from offset 0, once the files cover at least ``end``."""
    stored = b""
    try:
        async with asyncio.timeout(PERSIST_TIMEOUT_S):
            while True:
                stored = stored_prefix(fragment_files(env.cluster.fragments_dir, J))
                if len(stored) >= end:
                    break
                await asyncio.sleep(PERSIST_POLL_S)  # A file appearing has no event to await.
    except TimeoutError:
        raise AssertionError(f"persisted files cover {len(stored)} of {end} bytes") from None
    return stored


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--min-append-rate", "0"),
        ("--min-append-rate", "fast"),
        ("--flow-control-burst", "0"),
        ("--flow-control-burst", "-1"),
        ("--flow-control-burst", "nan"),
    ],
)
async def test_serve_refuses_bad_flow_control_flags(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    with pytest.raises(SystemExit) as info:
        gazette_main(["serve", flag, value])
    assert info.value.code == 2
    assert f"argument {flag}: " in capsys.readouterr().err
