"""The Broker object: member announcement under a lease, lifecycle, and failing loudly."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from broker_testkit import Cluster, journal_spec

from broker.keyspace.backend import LeaseNotFoundError
from broker.protocol import protocol_pb2 as pb
from broker.serve_cli import _parse_args
from broker.server import BrokerStateError
from broker.topology import Member, lookup_member, member_key

J = "srv/journal"


async def test_broker_announces_itself_under_its_lease(cluster: Cluster) -> None:
    b = await cluster.start_broker("zone-a", "broker-a")
    resp = await cluster.admin.range(member_key(b.config.root, "zone-a", "broker-a").encode())
    (kv,) = resp.kvs
    assert kv.lease == b.lease_id
    spec = pb.BrokerSpec.FromString(kv.value)
    assert spec.process_spec.endpoint == b.endpoint and spec.process_spec.id == b.id
    member = lookup_member(b.ks, b.config.root, "zone-a", "broker-a")
    assert isinstance(member, Member)
    with pytest.raises(BrokerStateError):
        await b.start()

    await cluster.stop_broker(b)
    resp = await cluster.admin.range(member_key(b.config.root, "zone-a", "broker-a").encode())
    assert resp.kvs == ()  # Revoked with the lease.


async def test_a_broker_that_loses_its_lease_fails_and_stops_serving(cluster: Cluster) -> None:
    b = await cluster.start_broker("zone-a", "broker-a", lease_ttl_s=2)
    await cluster.create(journal_spec(J), [b])
    assert (await cluster.append(b, J, [b"x"])).status == pb.OK

    await cluster.admin.lease_revoke(b.lease_id)  # As if etcd expired it.
    with pytest.raises(ExceptionGroup) as info:
        await b.wait()
    assert info.group_contains(LeaseNotFoundError)
    with pytest.raises(grpc.aio.AioRpcError) as rpc:
        await cluster.append(b, J, [b"y"])
    assert rpc.value.code() == grpc.StatusCode.UNAVAILABLE
    cluster.brokers.remove(b)
    with pytest.raises(ExceptionGroup):
        await b.stop()
    await b.backend.close()


# --- gazette serve's arguments ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--id", "b1"], "argument --suffix/--id: length must be in [4, 128] bytes"),
        (["--zone", "a#b"], "argument --zone: "),
        (["--file-root", "/nonexistent/gazette-root"], "--file-root /nonexistent/gazette-root: no"),
    ],
)
def test_serve_refuses_bad_arguments_naming_the_flag(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _parse_args(["serve", *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--data-dir", "--spool-dir"])
def test_serve_creates_its_spool_directory(flag: str, tmp_path: Path) -> None:
    spools = tmp_path / "a" / "b" / "spools"
    args = _parse_args(["serve", flag, str(spools), "--file-root", str(tmp_path)])
    assert getattr(args, flag[2:].replace("-", "_")) == str(spools)
    assert spools.is_dir()


def test_serve_refuses_a_spool_dir_beside_a_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _parse_args(["serve", "--data-dir", str(tmp_path), "--spool-dir", str(tmp_path)])
    assert "--spool-dir: not with --data-dir" in capsys.readouterr().err
    # Memory spools use neither, and are never durable: both are accepted then.
    args = _parse_args(
        ["serve", "--data-dir", str(tmp_path), "--spool-dir", str(tmp_path), "--spool-memory"]
    )
    assert args.spool_memory and not args.fsync
