"""etcd out of space (a real etcd with a 4 MiB ``--quota-backend-bytes``, filled by another
client until its NOSPACE alarm is raised; two ``gazette serve`` processes): etcd then refuses
every write until an operator makes room and disarms the alarm, while reads, watches, lease
renewals and deletes go on.

What a user must see: the data plane goes on (appends to a journal assigned before the alarm are
acknowledged and read back whole); a change of journals (``gazctl journals apply``) fails, exit
1, with an error that says etcd is out of space and how to recover, and changes nothing; a
broker killed meanwhile (its lease expires: a delete, which etcd still takes) leaves its
journals unassigned, and the allocator of the broker that stays keeps trying without giving up
(the process goes on serving; before, the allocator's refused transaction ended the process,
and the next broker to lead went the same way, down to the last); a broker started while the
alarm lasts exits at once saying why. Once the operator compacts, defragments and disarms
(with etcdctl, as etcd's documentation says), the same apply succeeds and the allocator assigns
the orphaned journals again: they take appends, and nothing acknowledged was lost."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import aiohttp
import pytest
from e2e_workload import apply_json_journals, gazctl, journal_spec, requires_etcd
from etcd_space_kit import QUOTA_ARGS, fill, make_room, requires_etcdctl
from google.protobuf.duration_pb2 import Duration

from broker.client.appender import append
from broker.keyspace.etcd import EtcdBackend
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import protocol_pb2 as pb
from broker.testing.process_cluster import BrokerProcess, ProcessCluster, ProcessClusterError
from gazette_consumer.shard_client import ShardClient
from gazette_consumer.shard_client import upsert as shard_upsert
from tests.broker.test_spool_recovery_serve import read_exactly
from tests.gazette_consumer.consumer_testkit import ConsumerProcess, stat_through

pytestmark = [
    pytest.mark.etcd,
    requires_etcd,
    requires_etcdctl,
]

JOURNALS = [f"nospace/j{i}" for i in range(6)]
NEW_JOURNAL = "nospace/new"
# Bound of each wait on the processes (a lease of 3 s expires, an allocator round runs).
wait_s = 30.0


def _gazctl(b: BrokerProcess, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return gazctl("--broker", b.endpoint.removeprefix("http://"), *args, stdin=stdin)


def _new_journal_yaml(cluster: ProcessCluster) -> str:
    return (
        f"name: {NEW_JOURNAL}\nreplication: 1\n"
        "fragment: {length: 1048576, compression_codec: NONE, refresh_interval: 1s,"
        f" stores: ['{cluster.store_url}']}}\n"
    )


async def _no_space_rounds(b: BrokerProcess) -> float:
    """The allocator rounds etcd refused, as `b` counts them on /debug/metrics."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{b.http_endpoint}/debug/metrics") as resp,
    ):
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith('gazette_allocator_round_failures_total{reason="no_space"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _append_all(
    cluster: ProcessCluster, b: BrokerProcess, acked: dict[str, bytearray]
) -> None:
    client = cluster.client(b)
    for journal, content in acked.items():
        data = f"{journal} {len(content)}\n".encode()
        resp = await append(client, pb.AppendRequest(journal=journal), data)
        assert resp.commit.begin == len(content), (journal, resp.commit)
        content += data


async def test_a_full_etcd_keeps_the_data_plane_refuses_changes_clearly_and_recovers() -> None:
    cluster = ProcessCluster(
        [("zone-a", "broker-a"), ("zone-b", "broker-b"), ("zone-a", "broker-c")],
        lease_ttl_s=3,
        http_gateway=True,
        etcd_args=QUOTA_ARGS,
    )
    async with cluster:
        await cluster.apply([journal_spec(j, 1, cluster.store_url) for j in JOURNALS])
        await cluster.wait_until(cluster.journals_ready(JOURNALS, 1))
        survivor, victim, leaver = cluster.brokers
        kept = [j for j in JOURNALS if cluster.primary(j) is survivor]
        orphaned = [j for j in JOURNALS if cluster.primary(j) in (victim, leaver)]
        if not kept or len(orphaned) != len(JOURNALS) - len(kept):  # the allocator spreads them
            pytest.fail(f"journals not on every broker: {kept} {orphaned}")
        acked = {j: bytearray() for j in kept}
        await _append_all(cluster, survivor, acked)

        admin = EtcdBackend([cluster.etcd.endpoint])
        try:
            refused = await fill(admin)
            assert "etcdctl alarm disarm" in str(refused), refused

            # The data plane goes on.
            await _append_all(cluster, survivor, acked)
            # A change is refused, saying why and what to do, and changes nothing.
            applied = _gazctl(
                survivor, "journals", "apply", "-f", "-", stdin=_new_journal_yaml(cluster)
            )
            assert applied.returncode == 1, applied
            assert "etcd is out of space" in applied.stderr, applied.stderr
            assert "etcdctl alarm disarm" in applied.stderr, applied.stderr
            assert (
                NEW_JOURNAL not in _gazctl(survivor, "journals", "list", "--format", "json").stdout
            )

            # A broker asked to stop (SIGTERM) cannot announce its hand-off: it stops all the
            # same, exit 0, saying why (it ended with the refusal, exit 1).
            code, _ = await cluster.terminate(leaver)
            assert code == 0, leaver.log_path.read_text(errors="replace")[-3000:]
            assert "hand-off not announced" in leaver.log_path.read_text(errors="replace")
            # A broker killed meanwhile: its lease expires (etcd takes the delete), and the
            # survivor's allocator, leading now, cannot reassign the journals of either. It
            # keeps trying, and keeps serving.
            await cluster.kill(victim)
            await cluster.wait_until(cluster.member_gone(victim), wait_s)
            async with asyncio.timeout(wait_s):
                # A count in another process, polled: it offers no event to await.
                while survivor.running and await _no_space_rounds(survivor) < 1:  # noqa: ASYNC110
                    await asyncio.sleep(0.1)
            assert survivor.running, "the survivor exited: its allocator gave up"
            await _append_all(cluster, survivor, acked)
            # A broker started while the alarm lasts exits 1, saying why, on one line.
            logged = victim.log_path.stat().st_size
            with pytest.raises(ProcessClusterError):
                await cluster.start_broker(victim)
            assert victim.returncode == 1
            with victim.log_path.open("rb") as log:
                log.seek(logged)
                said = log.read().decode(errors="replace")
            assert "gazette serve: etcd LeaseGrant: " in said, said
            assert "etcd is out of space" in said and "Traceback" not in said, said

            # The operator makes room: the filler goes, etcd is compacted, defragmented and
            # disarmed.
            await make_room(cluster, admin)
        finally:
            await admin.close()

        applied = _gazctl(
            survivor, "journals", "apply", "-f", "-", stdin=_new_journal_yaml(cluster)
        )
        assert applied.returncode == 0, applied.stderr
        await cluster.wait_until(cluster.journals_ready([*orphaned, NEW_JOURNAL], 1), wait_s)
        assert all(cluster.primary(j) is survivor for j in [*orphaned, NEW_JOURNAL])
        for journal in [*orphaned, NEW_JOURNAL]:
            acked[journal] = bytearray()
        await _append_all(cluster, survivor, acked)
        client = cluster.client(survivor)
        for journal, content in acked.items():
            assert await read_exactly(client, len(content), journal) == bytes(content)


SHARD = "nospace-000"
SOURCE = "nospace/in"
OUTPUT = "nospace/out"
CONSUMER_ROOT = "/gazette/consumers/e2e-nospace"


def _count(path: Path, text: str) -> int:
    return path.read_text(errors="replace").count(text)


async def _log_says(path: Path, text: str, times: int = 1) -> None:
    """Wait (bounded) until the log at `path` holds `text` at least `times` times: another
    process's log offers no event to await."""
    async with asyncio.timeout(wait_s):
        while _count(path, text) < times:  # noqa: ASYNC110
            await asyncio.sleep(0.1)


def _gazctl_shards_apply(consumer: ConsumerProcess, space: str) -> subprocess.CompletedProcess[str]:
    address = consumer.endpoint.removeprefix("http://")
    return gazctl("shards", "apply", "-f", "-", stdin=space, env={"CONSUMER_ADDRESS": address})


async def test_a_consumer_keeps_serving_while_etcd_is_full_and_its_status_shows_after(
    tmp_path: Path,
) -> None:
    # A consumer process counting a journal; etcd fills; the shard fails (a line that is not
    # JSON in its source), and its FAILED status cannot be written. The process keeps trying
    # instead of ending (the first refusal ended it), and once etcd has room the status shows.
    cluster = ProcessCluster(
        [("zone-a", "broker-a")],
        lease_ttl_s=3,
        etcd_args=QUOTA_ARGS,
    )
    async with cluster:
        await apply_json_journals(cluster, [SOURCE, OUTPUT])
        broker = cluster.brokers[0].endpoint.removeprefix("http://")
        log_path = tmp_path / "consumer.log"
        consumer = ConsumerProcess(
            [
                *("--app", "examples.counter:Counter", "--etcd", cluster.etcd.endpoint),
                *("--root", CONSUMER_ROOT, "--zone", "zone-a", "--id", "consumer-a"),
                *("--port", "0", "--broker", broker),
            ],
            log_path,
            env={"COUNTER_DATA_DIR": str(tmp_path / "db")},
        )
        client = cluster.client()
        admin = EtcdBackend([cluster.etcd.endpoint])
        try:
            await consumer.start()
            async with ShardClient(consumer.endpoint) as shards:
                await shards.apply(
                    [
                        shard_upsert(
                            cpb.ShardSpec(
                                id=SHARD,
                                sources=[cpb.ShardSpec.Source(journal=SOURCE)],
                                max_txn_duration=Duration(nanos=200_000_000),
                            )
                        )
                    ]
                )
            first = await append(client, pb.AppendRequest(journal=SOURCE), b'{"key": "red"}\n')
            await stat_through(consumer, SHARD, {SOURCE: first.commit.end})

            await fill(admin)
            space = (
                f"shards:\n- id: nospace-001\n  max_txn_duration: 1s\n"
                f"  sources:\n  - journal: {SOURCE}\n"
            )
            applied = _gazctl_shards_apply(consumer, space)
            assert applied.returncode == 1, applied
            assert "etcd is out of space" in applied.stderr, applied.stderr

            await append(client, pb.AppendRequest(journal=SOURCE), b"not json\n")
            # Refused twice (a retry after the longest back-off): the process outlived one.
            await _log_says(log_path, "shard status write refused", times=2)
            assert consumer.running, "the consumer process gave up"
            # A consumer process started while the alarm lasts cannot take a lease: it exits
            # 1, saying why on one line (no traceback).
            late_log = tmp_path / "late-consumer.log"
            late = ConsumerProcess(
                [*consumer.args[: consumer.args.index("--id")], "--id", "consumer-b",
                 *("--port", "0", "--broker", broker)],
                late_log,
                env={"COUNTER_DATA_DIR": str(tmp_path / "late-db")},
            )  # fmt: skip
            with pytest.raises(ProcessClusterError):
                await late.start()
            assert late.returncode == 1, late_log.read_text(errors="replace")[-2000:]
            said = late_log.read_text(errors="replace")
            assert "etcd is out of space" in said and "Traceback" not in said, said

            await make_room(cluster, admin)
            async with asyncio.timeout(wait_s), ShardClient(consumer.endpoint) as shards:
                while True:
                    listed = await shards.list_shards()
                    statuses = [s for shard in listed.shards for s in shard.status]
                    if any(s.code == cpb.ReplicaStatus.FAILED for s in statuses):
                        break
                    await asyncio.sleep(0.1)
            failed = [s for s in statuses if s.code == cpb.ReplicaStatus.FAILED]
            assert any("not json" in e or "Decode" in e for s in failed for e in s.errors), failed
            assert consumer.running
        finally:
            await admin.close()
            await consumer.kill()
