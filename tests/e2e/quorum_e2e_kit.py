"""What the quorum process-level tests share: a journal whose acknowledged appends are
tracked (each must land exactly at the end of everything acknowledged before it), and
whole-journal reads from one broker that must show exactly that content."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from e2e_workload import journal_spec

from broker.client.appender import append
from broker.client.route_cache import ChannelPool
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.testing.process_cluster import BrokerProcess, ProcessCluster

# The brokers' lease: a killed broker's journals move after it expires.
LEASE_TTL_S = 3
THREE_BROKERS = [("zone-a", "broker-a1"), ("zone-a", "broker-a2"), ("zone-b", "broker-b1")]
appends_per_round = 8
# Attempts of the first append after a restart (the client backs off up to 1 s between).
attempts_after_restart_max = 200
retry_backoff_cap_s = 0.1
# Reads of one whole-journal check that a broker may end before its end (read_until).
read_resumes_max = 20
read_backoff_initial_s = 0.05
read_backoff_max_s = 0.5


@contextlib.asynccontextmanager
async def quorum_cluster(
    journal: str,
    *,
    extra_args: Sequence[str] = (),
    http_gateway: bool = False,
    fragment_length: int = 1 << 20,
    etcd_args: Sequence[str] = (),
) -> AsyncIterator[ProcessCluster]:
    """Three broker processes on etcd (two zones), and `journal` at R=3 in quorum mode, ready
    on all three (`extra_args` for `gazette serve`, fragments of `fragment_length`, etcd
    started with `etcd_args`)."""
    async with ProcessCluster(
        THREE_BROKERS,
        lease_ttl_s=LEASE_TTL_S,
        extra_args=extra_args,
        http_gateway=http_gateway,
        etcd_args=etcd_args,
    ) as c:
        spec = journal_spec(journal, 3, c.store_url, length=fragment_length)
        spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
        await c.apply([spec])
        await c.wait_until(c.journals_ready([journal], 3, zones_min=2))
        yield c


class Journal:
    """What the test acknowledged: the expected content and each append's offsets."""

    def __init__(self, cluster: ProcessCluster, name: str) -> None:
        self.cluster = cluster
        self.name = name
        self.expected = bytearray()
        self.leader: BrokerProcess | None = None

    async def append_round(self, tag: str, *, attempts_max: int = 1) -> float:
        """Append `appends_per_round` records (the first through any broker, retried: it
        finds the leader); each acknowledged at exactly the expected end. Returns how long the
        first took."""
        loop = asyncio.get_running_loop()
        request = pb.AppendRequest(journal=self.name)
        started = loop.time()
        first_took = 0.0
        for i in range(appends_per_round):
            data = f"{tag}-{i:03d}\n".encode()
            client = self.cluster.client(self.leader) if i else self.cluster.client()
            resp = await append(
                client,
                request,
                data,
                attempts_max=attempts_after_restart_max if not i else attempts_max,
                # Retry often: the time measured is the cluster's, not the client's backoff.
                backoff_cap_s=retry_backoff_cap_s,
            )
            assert resp.status == pb.OK, pb.Status.Name(resp.status)
            # No offset written twice, nothing acknowledged lost: each append lands exactly
            # at the end of everything acknowledged before it.
            assert (resp.commit.begin, resp.commit.end) == (
                len(self.expected),
                len(self.expected) + len(data),
            ), (tag, i)
            self.expected += data
            if not i:
                first_took = loop.time() - started
                route = resp.header.route
                self.leader = self.cluster.broker(route.members[route.primary].suffix)
        return first_took

    async def check_every_member(self, brokers: Sequence[BrokerProcess] = ()) -> None:
        """Every member (of `brokers`, default all) serves exactly the acknowledged content
        (nothing more: no reader can see content that a later truncation would remove)."""
        channels = ChannelPool()
        try:
            for b in brokers or self.cluster.brokers:
                assert await read_all(channels, b, self.name, len(self.expected)) == bytes(
                    self.expected
                ), b.suffix
        finally:
            await channels.close()

    def others(self, *not_these: BrokerProcess) -> list[BrokerProcess]:
        return [b for b in self.cluster.brokers if b not in not_these]


async def read_until(
    channels: ChannelPool,
    b: BrokerProcess,
    journal: str,
    end: int,
    *,
    timeout_s: float = 15,
    by_itself: bool = False,
) -> bytes:
    """The journal as broker `b` serves it, from 0 until `end` (a blocking read: a follower
    applies a commit a heartbeat after the leader). With `by_itself`, only content `b` serves
    itself counts (each stream's header names it: not proxied), persisted fragments included;
    just restarted, `b` may first proxy the read or answer NOT_JOURNAL_BROKER (it has not seen
    itself assigned yet): such a stream is dropped and tried again. A
    stream the broker ends (its replica went away: a restarted one setting its spool aside) is
    read again from where it stopped, as a client does, after a backoff doubling up to
    `read_backoff_max_s`, at most `read_resumes_max` times."""
    out = bytearray()
    backoff = read_backoff_initial_s
    async with asyncio.timeout(timeout_s):
        for _ in range(read_resumes_max):
            request = pb.ReadRequest(journal=journal, offset=len(out), block=True)
            call = channels.stub(b.endpoint).Read(request)
            first = True
            async for resp in call:
                if by_itself and first:
                    # The stream's first response names who serves it: another broker (`b`
                    # proxied it) or none (NOT_JOURNAL_BROKER) is tried again.
                    assert resp.HasField("header"), resp
                    if resp.header.process_id.suffix != b.suffix:
                        break
                first = False
                assert resp.status == pb.OK, pb.Status.Name(resp.status)
                if by_itself and resp.HasField("header"):
                    assert resp.header.process_id.suffix == b.suffix, resp.header
                if resp.content:
                    assert resp.offset == len(out), (resp.offset, len(out))  # no gap, no overlap
                out += resp.content
                if len(out) >= end:
                    break
            call.cancel()
            if len(out) >= end:
                return bytes(out)
            await asyncio.sleep(backoff)  # a client's backoff, not a synchronisation
            backoff = min(backoff * 2, read_backoff_max_s)
    raise AssertionError(f"{b.suffix}: {len(out)} of {end} bytes after {read_resumes_max} reads")


async def read_all(channels: ChannelPool, b: BrokerProcess, journal: str, end: int) -> bytes:
    """The journal as broker `b` serves it from 0 to `end`, then nothing more for a moment
    (a non-blocking read past `end` finds nothing)."""
    out = await read_until(channels, b, journal, end)
    stub = channels.stub(b.endpoint)
    beyond = stub.Read(pb.ReadRequest(journal=journal, offset=len(out), block=False))
    async for resp in beyond:
        assert resp.status == pb.OFFSET_NOT_YET_AVAILABLE or not resp.content, resp
    return out
