"""The flags, end to end, with real processes: ``gazette serve`` over an etcd that requires TLS
client certificates and a user, serving TLS with --auth-keys; ``gazette-consumer serve`` (its
embedded broker too) serving TLS with --auth-keys; ``gazctl`` driving both with --tls-ca and
--auth-keys, and refused, one line and exit status 1, without them."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.client.append_service import AppendService
from broker.client.async_append import AsyncAppend
from broker.client.list_apply import apply_journals, upsert
from broker.client.route_cache import JournalClient
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from broker.testing.etcd_server import EtcdServer, EtcdServerTls
from broker.tls import load_client_tls
from examples.counter import Count
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES, Partition, Publisher
from gazette_consumer.shard_client import ShardClient
from gazette_consumer.shard_client import upsert as shard_upsert
from tests.broker.broker_testkit import journal_spec
from tests.broker.serve_testkit import free_port
from tests.gazette_consumer.consumer_testkit import ConsumerProcess, stat_through
from tests.security.security_testkit import KEYS
from tests.security.tls_testkit import CertAuthority

REPO = Path(__file__).resolve().parents[2]
# Upper bound on any one step; each takes well under a second.
step_timeout_s = 60


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAZETTE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return {**env, **extra}


async def gazctl(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "broker.cli.gazctl", *args],
        input=stdin,
        capture_output=True,
        env=_env(),
        timeout=step_timeout_s,
        check=False,
    )


def _failed_with(done: subprocess.CompletedProcess[bytes], *texts: str) -> str | None:
    """None if `done` exited 1 with one line of stderr holding every one of `texts`."""
    err = done.stderr.decode()
    if done.returncode != 1 or len(err.strip().splitlines()) != 1:
        return f"exit {done.returncode}: {err}"
    missing = [t for t in texts if t not in err]
    return f"{missing} not in {err}" if missing else None


async def _serve_broker(
    args: Sequence[str], log: Path, env: dict[str, str]
) -> tuple[asyncio.subprocess.Process, str]:
    with log.open("wb") as log_file:  # A file: a pipe nobody reads would stall the broker.
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-c", "from broker.serve_cli import main; main()", "serve", *args),
            stdout=asyncio.subprocess.PIPE,
            stderr=log_file,
            env=env,
        )
    assert proc.stdout is not None
    async with asyncio.timeout(step_timeout_s):
        line = (await proc.stdout.readline()).decode()
    if not line.startswith("serving on "):
        raise AssertionError(line + await asyncio.to_thread(log.read_text))
    return proc, line.removeprefix("serving on ").strip()


@pytest.mark.etcd
async def test_gazette_serve_with_tls_auth_and_a_secured_etcd(tmp_path: Path) -> None:
    if shutil.which("etcd") is None:
        pytest.skip("etcd not installed: run `make system-deps`")
    ca = CertAuthority.new(tmp_path / "ca", "cluster-ca")
    etcd_cert, client_cert, broker_cert = ca.issue("etcd"), ca.issue("client"), ca.issue("broker")
    probe = load_client_tls(ca.cert, client_cert.cert, client_cert.key)
    etcd_tls = EtcdServerTls(etcd_cert.cert, etcd_cert.key, probe, client_ca_file=ca.cert)
    async with EtcdServer(tmp_path / "etcd", tls=etcd_tls) as etcd:
        await etcd.enable_auth("etcd-password")
        proc, endpoint = await _serve_broker(
            [
                *("--port", str(free_port()), "--file-root", str(tmp_path)),
                *("--etcd", etcd.url, "--etcd-ca", ca.cert),
                *("--etcd-cert", client_cert.cert, "--etcd-key", client_cert.key),
                *("--etcd-user", "root"),
                *("--tls-cert", broker_cert.cert, "--tls-key", broker_cert.key),
                *("--tls-ca", ca.cert, "--auth-keys", KEYS, "--lease-ttl", "2"),
            ],
            tmp_path / "broker.log",
            _env(GAZETTE_ETCD_PASSWORD="etcd-password"),
        )
        try:
            assert endpoint.startswith("https://127.0.0.1:"), endpoint
            secured = ("--broker", endpoint, "--tls-ca", ca.cert, "--auth-keys", KEYS)
            space = tmp_path / "space.yaml"
            space.write_text(
                "name: secure/\nreplication: 1\n"
                "fragment: {length: 1048576, compression_codec: NONE, refresh_interval: 30s}\n"
                "children: [{name: secure/words}]\n"
            )
            applied = await gazctl(*secured, "journals", "apply", "-f", str(space))
            assert applied.returncode == 0, applied.stderr.decode()
            appended = await gazctl(
                *secured, "journals", "append", "-j", "secure/words", stdin=b"hello\n"
            )
            assert appended.returncode == 0, appended.stderr.decode()
            read = await gazctl(*secured, "journals", "read", "-j", "secure/words")
            assert (read.returncode, read.stdout) == (0, b"hello\n"), read.stderr.decode()

            untrusting, anonymous = await asyncio.gather(
                gazctl("--broker", endpoint, "--auth-keys", KEYS, "journals", "list"),
                gazctl("--broker", endpoint, "--tls-ca", ca.cert, "journals", "list"),
            )
            assert _failed_with(untrusting, "CERTIFICATE_VERIFY_FAILED", "--tls-ca") is None
            assert _failed_with(anonymous, "UNAUTHENTICATED", "missing") is None
        finally:
            proc.terminate()
            async with asyncio.timeout(step_timeout_s):
                await proc.wait()


def _counter_shard(shard: str, source: str, output: str) -> cpb.ShardSpec:
    return cpb.ShardSpec(
        id=shard,
        sources=[cpb.ShardSpec.Source(journal=source)],
        max_txn_duration=Duration(nanos=100_000_000),
        labels=pb.LabelSet(labels=[pb.Label(name="counter.example/output", value=output)]),
    )


def _json_journal(name: str) -> pb.JournalSpec:
    spec = journal_spec(name)
    spec.labels.CopyFrom(labels.label_set([(labels.CONTENT_TYPE, CONTENT_TYPE_JSON_LINES)]))
    return spec


async def test_gazette_consumer_serve_with_tls_and_auth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = CertAuthority.new(tmp_path / "ca", "cluster-ca")
    cert = ca.issue("consumer")
    consumer = ConsumerProcess(
        [
            *("--app", "examples.counter:Counter", "--id", "consumer-1", "--port", "0"),
            *("--data-dir", str(tmp_path / "data"), "--drain-timeout", "1"),
            *("--auth-keys", KEYS, "--tls-cert", cert.cert, "--tls-key", cert.key),
            *("--tls-ca", ca.cert),
        ],
        tmp_path / "consumer.log",
        env={"COUNTER_DATA_DIR": str(tmp_path / "db")},
    )
    await consumer.start()
    try:
        # The member and its embedded broker both serve TLS.
        broker = consumer.printed["embedded broker"]
        assert consumer.endpoint.startswith("https://"), consumer.endpoint
        assert broker.startswith("https://"), broker
        trusted = ("--tls-ca", ca.cert)
        shards = ("shards", "--consumer", consumer.endpoint, "list")
        journals = ("--broker", broker, "journals", "list")
        # Independent: run together (each is a Python process start, mostly).
        listed, anonymous, listed_journals, anonymous_journals = await asyncio.gather(
            gazctl(*trusted, "--auth-keys", KEYS, *shards),
            gazctl(*trusted, *shards),
            gazctl(*trusted, "--auth-keys", KEYS, *journals),
            gazctl(*trusted, *journals),
        )
        assert listed.returncode == 0, listed.stderr.decode()
        assert _failed_with(anonymous, "UNAUTHENTICATED", "missing") is None
        assert listed_journals.returncode == 0, listed_journals.stderr.decode()
        assert _failed_with(anonymous_journals, "UNAUTHENTICATED") is None

        # A shard runs: it reads its source from the embedded broker (TLS, tokens signed with
        # the consumer's keys), and a Stat waits for it to read through what was appended.
        # These clients take their keys and CA from the environment (as by default).
        monkeypatch.setenv("GAZETTE_AUTH_KEYS", KEYS)
        monkeypatch.setenv("GAZETTE_TLS_CA", ca.cert)
        source, output = "counts/in", "counts/out"
        client = JournalClient(broker)
        try:
            async with ShardClient(consumer.endpoint) as shards, AppendService(client) as appends:
                await apply_journals(client, [upsert(_json_journal(j)) for j in (source, output)])
                await shards.apply([shard_upsert(_counter_shard("counter-0", source, output))])
                publisher: Publisher[AsyncAppend] = Publisher(appends)
                partition = Partition(source, CONTENT_TYPE_JSON_LINES)
                last = await publisher.publish_committed(
                    lambda _m: partition, Count(key="apple", n=3)
                )
                head = (await last).commit.end
                stat = await stat_through(consumer, "counter-0", {source: head})
            assert stat.read_through[source] >= head
        finally:
            await client.close()
    finally:
        assert await consumer.terminate() == 0, consumer.log_tail()
