"""A real etcd serving TLS, requiring client certificates and a user and password: a broker
connects to it and serves appends; a client without a certificate, trusting another CA, with a
wrong password or no user, or dialing in the clear, is refused with an error saying why; a
token etcd no longer accepts is replaced and the request applied once."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.client import Appender, JournalClient, Reader
from broker.keyspace.backend import KeySpaceError, UnavailableError
from broker.keyspace.etcd import EndpointError, EtcdAuthError, EtcdBackend
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import OffsetNotYetAvailableError
from broker.server import Broker, BrokerConfig
from broker.testing.etcd_server import EtcdServer, EtcdServerTls
from broker.tls import ClientTls, load_client_tls
from broker.topology import DEFAULT_ROOT, assignment_key, item_key
from tests.broker.broker_testkit import journal_spec
from tests.security.tls_testkit import CertAuthority

pytestmark = pytest.mark.etcd

PASSWORD = "etcd root's password"
J = "secure/journal"
# Refused connections give up after this long (each refusal below waits for it once).
refused_dial_s = 0.5


class SecureEtcd:
    def __init__(self, server: EtcdServer, ca: CertAuthority, client: ClientTls) -> None:
        self.server = server
        self.ca = ca
        self.client = client

    def backend(self, **overrides: Any) -> EtcdBackend:
        options: dict[str, Any] = {
            "tls": self.client,
            "user": "root",
            "password": PASSWORD,
            "dial_timeout_s": 5,
            "request_timeout_s": 5,
        }
        options.update(overrides)
        return EtcdBackend([self.server.url], **options)


@pytest.fixture
async def etcd(tmp_path: Path) -> AsyncIterator[SecureEtcd]:
    if shutil.which("etcd") is None:
        pytest.skip("etcd not installed: run `make system-deps`")
    ca = CertAuthority.new(tmp_path / "ca", "etcd-ca")
    server_cert, client_cert = ca.issue("etcd"), ca.issue("gazette")
    client = load_client_tls(ca.cert, client_cert.cert, client_cert.key)
    tls = EtcdServerTls(server_cert.cert, server_cert.key, client, client_ca_file=ca.cert)
    async with EtcdServer(tmp_path / "etcd", tls=tls) as server:
        await server.enable_auth(PASSWORD)
        yield SecureEtcd(server, ca, client)


async def test_a_broker_serves_over_an_etcd_with_tls_and_auth(etcd: SecureEtcd) -> None:
    assert etcd.server.url.startswith("https://")
    broker = Broker(
        etcd.backend(),
        BrokerConfig(zone="zone-a", suffix="broker-a", memory_spools=True, stop_grace_s=0.0),
    )
    admin = etcd.backend()
    await broker.start()
    client = JournalClient(broker.endpoint)
    try:
        await admin.put(item_key(DEFAULT_ROOT, J).encode(), journal_spec(J).SerializeToString())
        header = await admin.put(
            assignment_key(DEFAULT_ROOT, J, "zone-a", "broker-a", 0).encode(),
            b"",
            lease=broker.lease_id,
        )
        await broker.ks.wait_for_revision(header.revision, 10.0)
        appender = Appender(client, pb.AppendRequest(journal=J))
        await appender.write(b"over etcd with TLS and auth")
        commit = await appender.commit()
        assert (commit.begin, commit.end) == (0, 27)
        reader = Reader(client, pb.ReadRequest(journal=J, offset=0))
        assert await reader.read() == b"over etcd with TLS and auth"
        with pytest.raises(OffsetNotYetAvailableError):
            await reader.read()
    finally:
        await client.close()
        await broker.stop()
        await broker.backend.close()
        await admin.close()


async def test_clients_etcd_refuses_are_told_why(etcd: SecureEtcd, tmp_path: Path) -> None:
    impostor_ca = CertAuthority.new(tmp_path / "other", "other-ca")
    cases: list[tuple[str, dict[str, Any], type[KeySpaceError], str]] = [
        (
            "no client certificate",
            {"tls": load_client_tls(etcd.ca.cert)},
            UnavailableError,
            "requires client certificates",
        ),
        (
            "another CA",
            {"tls": load_client_tls(impostor_ca.cert, *_pair(etcd.client, tmp_path))},
            UnavailableError,
            "not signed by a CA this client trusts, or does not name the host dialed: check"
            " --etcd-ca",
        ),
        ("a wrong password", {"password": "guess"}, EtcdAuthError, "authentication failed"),
        ("no user", {"user": "", "password": ""}, EtcdAuthError, "requires a user: --etcd-user"),
    ]
    for name, overrides, error, text in cases:
        backend = etcd.backend(**overrides, dial_timeout_s=refused_dial_s)
        try:
            with pytest.raises(error) as err:
                await backend.put(b"/refused", name.encode())
        finally:
            await backend.close()
        assert text in str(err.value), (name, str(err.value))
    # In the clear: refused before dialing when TLS options are given, unanswered otherwise.
    with pytest.raises(EndpointError, match="plain http://"):
        EtcdBackend([etcd.server.url.replace("https://", "http://")], tls=etcd.client)
    plain = EtcdBackend([etcd.server.endpoint], dial_timeout_s=refused_dial_s)
    try:
        with pytest.raises(UnavailableError):
            await plain.put(b"/refused", b"plaintext")
    finally:
        await plain.close()
    # None of them wrote anything.
    admin = etcd.backend()
    try:
        assert (await admin.range(b"/refused")).kvs == ()
    finally:
        await admin.close()


async def test_a_stale_token_is_replaced_and_the_request_applied_once(etcd: SecureEtcd) -> None:
    backend = etcd.backend()
    try:
        await backend.put(b"/k", b"1")
        # As if etcd had expired our token (etcd's simple tokens last 5 minutes by default).
        for conn in backend._conns.values():
            conn.token.value = "no-longer-valid.1"
        await backend.put(b"/k", b"2")
        [kv] = (await backend.range(b"/k")).kvs
        assert (kv.value, kv.version) == (b"2", 2)
    finally:
        await backend.close()


def _pair(tls: ClientTls, tmp_path: Path) -> tuple[str, str]:
    """Files of `tls`'s certificate and key (for a ClientTls trusting another CA)."""
    assert tls.certificate_chain is not None and tls.private_key is not None
    cert, key = tmp_path / "pair.crt", tmp_path / "pair.key"
    cert.write_bytes(tls.certificate_chain)
    key.write_bytes(tls.private_key)
    return str(cert), str(key)
