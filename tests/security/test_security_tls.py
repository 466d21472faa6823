"""TLS set-up: certificates and keys are checked when loaded, each error naming its option
and file; a client that does not trust the server's CA, or has no certificate for a server
requiring one, is refused with an error saying so, and nothing is served."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import grpc.aio
import pytest

from broker.client import JournalClient, list_journals
from broker.client.route_cache import ChannelPool
from broker.http_gateway import HttpGateway
from broker.server import Broker
from broker.tls import (
    TlsConfigError,
    client_tls_from_env,
    describe_failure,
    load_client_tls,
    load_server_tls,
)
from tests.broker.broker_testkit import Cluster, journal_spec
from tests.security.security_testkit import KEYS, scoped_token
from tests.security.tls_testkit import CertAuthority, Issued


@pytest.fixture
def ca(tmp_path: Path) -> CertAuthority:
    return CertAuthority.new(tmp_path / "ca", "cluster-ca")


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster()
    try:
        yield c
    finally:
        await c.close()


# --- Loading ----------------------------------------------------------------------------------


def test_bad_certificate_files_are_refused_naming_the_option(
    ca: CertAuthority, tmp_path: Path
) -> None:
    server = ca.issue("server")
    other = ca.issue("other")
    text = tmp_path / "notes.txt"
    text.write_text("not a certificate\n")
    cases: list[tuple[str, object, str]] = [
        ("--tls-cert", lambda: load_server_tls(str(tmp_path / "nope.crt"), server.key),
         "cannot read"),
        ("--tls-key", lambda: load_server_tls(server.cert, ""), "is required with --tls-cert"),
        ("--tls-cert", lambda: load_server_tls("", server.key), "is required with --tls-key"),
        ("--tls-cert", lambda: load_server_tls(str(text), server.key), "not a PEM file"),
        ("--tls-key", lambda: load_server_tls(server.cert, other.key),
         "is not the private key of the certificate"),
        ("--tls-client-ca", lambda: load_server_tls(server.cert, server.key, server.key),
         "no usable CA certificate"),
        ("--tls-ca", lambda: load_client_tls(str(text)), "not a PEM file"),
        ("--tls-key", lambda: load_client_tls(ca.cert, server.cert, None),
         "is required with --tls-cert"),
    ]  # fmt: skip
    for option, load, text_part in cases:
        with pytest.raises(TlsConfigError) as err:
            load()  # type: ignore[operator]
        assert str(err.value).startswith(f"{option}:"), (option, str(err.value))
        assert text_part in str(err.value), (option, str(err.value))


def test_client_tls_from_the_environment(ca: CertAuthority) -> None:
    client = ca.issue("client")
    assert client_tls_from_env({}) is None
    tls = client_tls_from_env({"GAZETTE_TLS_CA": ca.cert})
    assert tls is not None and tls.root_certificates is not None and tls.private_key is None
    mutual = client_tls_from_env(
        {"GAZETTE_TLS_CA": ca.cert, "GAZETTE_TLS_CERT": client.cert, "GAZETTE_TLS_KEY": client.key}
    )
    assert mutual is not None and mutual.certificate_chain is not None
    with pytest.raises(
        TlsConfigError, match=r"^GAZETTE_TLS_KEY: is required with GAZETTE_TLS_CERT"
    ):
        client_tls_from_env({"GAZETTE_TLS_CERT": client.cert})


# --- Handshakes -------------------------------------------------------------------------------


async def _tls_broker(
    cluster: Cluster, ca: CertAuthority, *, mutual: bool = False
) -> tuple[Broker, Issued]:
    cert = ca.issue("broker")
    broker = await cluster.start_broker(
        "zone-a", "broker-a", tls=load_server_tls(cert.cert, cert.key, ca.cert if mutual else None)
    )
    await cluster.create(journal_spec("tls/journal"), [broker])
    return broker, cert


def _client(broker: Broker, tls: object) -> JournalClient:
    return JournalClient(broker.endpoint, channels=ChannelPool(tls=tls))  # type: ignore[arg-type]


async def test_a_client_trusting_another_ca_is_refused_with_a_clear_error(
    cluster: Cluster, ca: CertAuthority, tmp_path: Path
) -> None:
    broker, _ = await _tls_broker(cluster, ca)
    impostor_ca = CertAuthority.new(tmp_path / "other", "other-ca")
    client = _client(broker, load_client_tls(impostor_ca.cert))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await list_journals(client)
    finally:
        await client.close()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    details = err.value.details() or ""
    assert "CERTIFICATE_VERIFY_FAILED" in details
    assert "not signed by a CA this client trusts" in describe_failure(details)
    # Trusting the right CA, the same request is served.
    client = _client(broker, load_client_tls(ca.cert))
    try:
        listing = await list_journals(client)
    finally:
        await client.close()
    assert [j.spec.name for j in listing.journals] == ["tls/journal"]


async def test_mutual_tls_refuses_a_client_without_a_certificate(
    cluster: Cluster, ca: CertAuthority, tmp_path: Path
) -> None:
    broker, _ = await _tls_broker(cluster, ca, mutual=True)
    impostor = CertAuthority.new(tmp_path / "other", "other-ca").issue("impostor")
    for name, tls in [
        ("no certificate", load_client_tls(ca.cert)),
        ("a certificate of another CA", load_client_tls(ca.cert, impostor.cert, impostor.key)),
    ]:
        client = _client(broker, tls)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await list_journals(client)
        finally:
            await client.close()
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, name
        assert "requires client certificates" in describe_failure(err.value.details() or ""), name
    own = ca.issue("client")
    client = _client(broker, load_client_tls(ca.cert, own.cert, own.key))
    try:
        assert len((await list_journals(client)).journals) == 1
    finally:
        await client.close()


async def test_a_plaintext_client_of_a_tls_broker_is_refused(
    cluster: Cluster, ca: CertAuthority
) -> None:
    broker, _ = await _tls_broker(cluster, ca)
    assert broker.endpoint.startswith("https://")
    client = JournalClient(broker.endpoint.replace("https://", "http://"))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await list_journals(client)
    finally:
        await client.close()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_the_http_gateway_serves_https_in_front_of_a_tls_broker(
    cluster: Cluster, ca: CertAuthority
) -> None:
    """The gateway serves HTTPS with the broker's certificate and dials the broker's https://
    endpoint trusting the CA; a bearer token passes through, a plaintext request is refused."""
    cert = ca.issue("broker")
    server_tls = load_server_tls(cert.cert, cert.key)
    broker = await cluster.start_broker(
        "zone-a", "broker-a", auth_keys=KEYS, tls=server_tls, peer_tls=load_client_tls(ca.cert)
    )
    await cluster.create(journal_spec("tls/journal"), [broker])
    gateway = HttpGateway(ready=broker.is_ready)
    port = await gateway.start("127.0.0.1", 0, tls=server_tls)
    gateway.attach(broker.endpoint, tls=load_client_tls(ca.cert))
    url = f"https://127.0.0.1:{port}/tls/journal"
    trusting = ssl.create_default_context(cafile=ca.cert)
    headers = {"Authorization": f"Bearer {scoped_token('prefix=tls/')}"}
    try:
        async with aiohttp.ClientSession() as http:
            async with http.put(url, data=b"over https", headers=headers, ssl=trusting) as resp:
                assert resp.status == 200, await resp.text()
            async with http.get(f"{url}?block=false", headers=headers, ssl=trusting) as resp:
                assert resp.status == 206 and await resp.read() == b"over https"
            async with http.get(url, ssl=trusting) as resp:
                assert resp.status == 401  # No token.
            with pytest.raises(aiohttp.ClientError):
                async with http.get(url.replace("https://", "http://"), headers=headers):
                    pass
    finally:
        await gateway.stop()


async def test_the_http_gateway_under_mutual_tls_refuses_clients_without_a_certificate(
    ca: CertAuthority,
) -> None:
    cert, client = ca.issue("broker"), ca.issue("client")
    gateway = HttpGateway()
    port = await gateway.start("127.0.0.1", 0, tls=load_server_tls(cert.cert, cert.key, ca.cert))
    url = f"https://127.0.0.1:{port}/debug/ready"
    anonymous = ssl.create_default_context(cafile=ca.cert)
    identified = ssl.create_default_context(cafile=ca.cert)
    identified.load_cert_chain(client.cert, client.key)
    try:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientError):
                async with http.get(url, ssl=anonymous) as resp:
                    await resp.read()
            async with http.get(url, ssl=identified) as resp:
                assert resp.status == 200
    finally:
        await gateway.stop()
