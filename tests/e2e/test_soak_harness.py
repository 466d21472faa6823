"""The soak harness's process controls: brokers that keep their ports across restarts and serve
their HTTP gateway, a broker paused past its lease (SIGSTOP) and resumed, consumer processes
restarted under their identity, a durable PostgreSQL crashed and restarted with its data, an S3
server paused and resumed with its objects; a quorum member's read served by itself."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import sqlalchemy as sa
from e2e_workload import journal_spec, requires_etcd

from broker.client.appender import append
from broker.client.route_cache import ChannelPool
from broker.keyspace.etcd import EtcdBackend
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.testing.consumer_process import ConsumerProcess
from broker.testing.moto_server import MotoServer
from broker.testing.pg_server import BIN_DIR, PgServer
from broker.testing.ports import reserve_port
from broker.testing.process_cluster import ProcessCluster
from broker.topology import lookup_member, member_key
from examples.stream_sum.soak.checks import ReadFailedError, read_member
from examples.stream_sum.soak.fault_kit import see_resumed_through


def test_reserved_ports_are_free_and_below_the_ephemeral_range() -> None:
    port = reserve_port()
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    assert 10000 <= port < low
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # Free: nobody holds it.


@pytest.mark.etcd
@requires_etcd
async def test_kept_ports_survive_restarts_and_a_paused_broker_loses_its_lease() -> None:
    brokers = [("zone-a", "broker-a"), ("zone-b", "broker-b")]
    async with ProcessCluster(brokers, http_gateway=True, keep_ports=True) as cluster:
        a = cluster.broker("broker-a")
        first, first_http = a.endpoint, a.http_endpoint
        assert first_http.startswith("http://127.0.0.1:")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{first_http}/debug/ready") as resp:
                assert resp.status == 200
        await cluster.restart(a)
        assert (a.endpoint, a.http_endpoint, a.starts) == (first, first_http, 2)

        cluster.pause(a)
        assert a.paused and a.running
        await cluster.wait_until(cluster.member_gone(a), timeout_s=30.0)
        cluster.resume(a)
        assert not a.paused
        # A resumed zombie either exits (its lease is gone) or announces itself again.
        proc = a.process
        assert proc is not None

        def back() -> str | None:
            return None if lookup_member(cluster.ks, cluster.root, a.zone, a.suffix) else "gone"

        exited = asyncio.ensure_future(proc.wait())
        announced = asyncio.ensure_future(cluster.wait_until(back, timeout_s=30.0))
        done, pending = await asyncio.wait(
            {exited, announced}, timeout=30.0, return_when=asyncio.FIRST_COMPLETED
        )
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        assert done, "the resumed broker neither exited nor came back"


@pytest.mark.etcd
@requires_etcd
async def test_a_broker_resumed_with_its_key_announced_and_its_lease_lost_is_restarted() -> None:
    # What a soak saw: a zombie resumed while its member key was still announced, then found
    # its lease expired (stopped for nearly a TTL) and exited; the fault checked its key once,
    # at the resume, and left the broker down for the rest of its measurements (90 s without
    # an R=3 journal's appends). Here the lease goes just after the resume: revoked.
    brokers = [("zone-a", "broker-a"), ("zone-b", "broker-b")]
    async with ProcessCluster(brokers) as cluster:
        a = cluster.broker("broker-a")
        admin = EtcdBackend([cluster.etcd.endpoint])
        try:
            resp = await admin.range(member_key(cluster.root, a.zone, a.suffix).encode())
            assert resp.kvs and resp.kvs[0].lease
            cluster.pause(a)
            cluster.resume(a)
            assert cluster.member_gone(a)() is not None  # Still announced at the resume.
            settled = asyncio.ensure_future(
                see_resumed_through(cluster, a, lease_ttl_s=cluster.lease_ttl_s, exit_s=30.0)
            )
            await asyncio.sleep(0)  # Its first look: the key announced.
            assert not settled.done()
            await admin.lease_revoke(resp.kvs[0].lease)
            code = await asyncio.wait_for(settled, 60.0)
        finally:
            await admin.close()
        assert code is not None and code != 0, f"not restarted (exit code {code})"
        assert a.running and a.starts == 2

        def back() -> str | None:
            return None if lookup_member(cluster.ks, cluster.root, a.zone, a.suffix) else "gone"

        await cluster.wait_until(back, timeout_s=30.0)

        # A broker that keeps its lease is left running, after one lease TTL of watching.
        cluster.pause(a)
        cluster.resume(a)
        assert (
            await see_resumed_through(cluster, a, lease_ttl_s=cluster.lease_ttl_s, exit_s=30.0)
            is None
        )
        assert a.running and a.starts == 2


@pytest.mark.etcd
@requires_etcd
async def test_a_consumer_process_restarts_under_its_identity_and_port(tmp_path: Path) -> None:
    async with ProcessCluster([("zone-a", "broker-a")]) as cluster:
        consumer = ConsumerProcess(
            "zone-a",
            "consumer-1",
            app="examples.stream_sum:Summer",
            etcd=cluster.etcd.endpoint,
            broker=cluster.brokers[0].endpoint,
            root="/test/soak-harness",
            data_dir=tmp_path / "consumer-1",
        )
        try:
            await consumer.start()
            first = consumer.endpoint
            await consumer.kill()
            assert not consumer.running
            await consumer.start()
            assert consumer.endpoint == first and consumer.starts == 2
            assert consumer.running
        finally:
            await consumer.kill()
        assert "serving on" in consumer.log_tail()


@pytest.mark.skipif(not (BIN_DIR / "initdb").exists(), reason="PostgreSQL 15 not installed")
async def test_a_crashed_postgres_comes_back_durable_with_its_data() -> None:
    async with PgServer() as pg:
        engine = sa.create_engine(pg.url)
        try:
            with engine.connect() as c:
                assert c.execute(sa.text("SHOW fsync")).scalar() == "on"
                assert c.execute(sa.text("SHOW synchronous_commit")).scalar() == "on"
            with engine.begin() as c:
                c.execute(sa.text("CREATE TABLE t (x int)"))
                c.execute(sa.text("INSERT INTO t VALUES (7)"))
            await pg.crash()
            with pytest.raises(sa.exc.OperationalError), engine.connect() as c:
                c.execute(sa.text("SELECT 1"))
            await pg.start()
            with engine.connect() as c:
                assert c.execute(sa.text("SELECT x FROM t")).scalars().all() == [7]
        finally:
            engine.dispose()


def test_a_paused_s3_server_hangs_and_resumes_with_its_objects() -> None:
    with MotoServer() as moto:
        moto.create_bucket("soak-harness")
        client = moto.client()
        client.put_object(Bucket="soak-harness", Key="k", Body=b"v")
        moto.pause()
        try:
            with pytest.raises(OSError):
                urllib.request.urlopen(moto.endpoint + "/moto-api/", timeout=0.5)
        finally:
            moto.resume()
        assert client.get_object(Bucket="soak-harness", Key="k")["Body"].read() == b"v"
        client.close()


@pytest.mark.etcd
@requires_etcd
async def test_a_member_read_is_served_by_the_member_itself_and_a_proxied_one_refused() -> None:
    """The soak's `read_member` on a quorum journal (R=3 on four brokers): each member serves
    the committed range itself, identical bytes; through the broker outside the route the read
    is proxied, which a member read must refuse (it would only show the leader's bytes)."""
    four = [
        *(("zone-a", f"broker-a{i}") for i in (1, 2)),
        *(("zone-b", f"broker-b{i}") for i in (1, 2)),
    ]
    journal = "soak/member-read"
    async with ProcessCluster(four, lease_ttl_s=3) as cluster:
        spec = journal_spec(journal, 3, cluster.store_url)
        spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
        await cluster.apply([spec])
        await cluster.wait_until(cluster.journals_ready([journal], 3, zones_min=2))
        expected = b"".join(f"line-{i:03d}\n".encode() for i in range(20))
        resp = await append(
            cluster.client(), pb.AppendRequest(journal=journal), expected, attempts_max=50
        )
        assert resp.status == pb.OK and resp.commit.begin == 0
        end = resp.commit.end
        members = {m.suffix for m in cluster.route(journal).members}
        outsider = next(b for b in cluster.brokers if b.suffix not in members)
        channels = ChannelPool()
        try:
            for b in cluster.brokers:
                if b is outsider:
                    continue
                got = await read_member(channels, b.endpoint, b.suffix, journal, 0, end)
                assert got == expected, b.suffix
                assert (
                    await read_member(channels, b.endpoint, b.suffix, journal, 5, end)
                    == expected[5:]
                )
            with pytest.raises(ReadFailedError, match=f"not by {outsider.suffix} itself"):
                await read_member(channels, outsider.endpoint, outsider.suffix, journal, 0, end)
        finally:
            await channels.close()
