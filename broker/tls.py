"""TLS for gRPC: a server's certificate (and, for mutual TLS, the CA its clients' certificates
must chain to), and a client's trusted CA bundle (and, for mutual TLS, its own certificate).

Which connections use TLS is told by endpoints, as in Gazette: a process serving TLS advertises
``https://host:port`` in its member spec, and clients and peers dial an ``https://`` endpoint
with TLS, an ``http://`` one (or a bare ``host:port``) in the clear. So a cluster can be moved to
TLS one process at a time, provided every process trusts the CA (``--tls-ca``) first.

Certificates and keys are PEM files, read and checked once, at start-up (`load_server_tls`,
`load_client_tls`): a missing or unreadable file, a key that does not match its certificate, a
CA file without certificates each raise `TlsConfigError` naming the option and the file, before
anything binds or dials. Replacing certificates means restarting the process.

Clients configured from the environment (`client_tls_from_env`, as `JournalClient` and
`ShardClient` do by default) read ``GAZETTE_TLS_CA`` (trusted CAs; default: the system's) and,
for mutual TLS, ``GAZETTE_TLS_CERT`` / ``GAZETTE_TLS_KEY`` (the client's certificate).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import grpc

from broker.protocol.validate import ValidationError

ENV_CA: Final = "GAZETTE_TLS_CA"
ENV_CERT: Final = "GAZETTE_TLS_CERT"
ENV_KEY: Final = "GAZETTE_TLS_KEY"
ENV_CLIENT_CA: Final = "GAZETTE_TLS_CLIENT_CA"
# PEM files larger than this are not certificates or keys (a CA bundle is a few hundred KiB).
pem_file_bytes_max: Final = 4 << 20


class TlsConfigError(ValidationError):
    """An unusable TLS option: the path names the option, the rule the file and the reason."""


@dataclass(frozen=True)
class ServerTls:
    """A server's certificate chain and key (PEM), and, for mutual TLS, the CAs its clients'
    certificates must chain to (then a client without a valid certificate is refused during
    the handshake)."""

    certificate_chain: bytes
    private_key: bytes = field(repr=False)
    client_ca: bytes | None = None
    # The files they were read from (ssl.SSLContext, for the HTTP gateway, loads files).
    files: tuple[str, str] | None = None

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None

    def ssl_context(self) -> ssl.SSLContext:
        """The same for an HTTPS server (the HTTP gateway): certificate, and client CA."""
        if self.files is None:
            raise TlsConfigError("made without files: load it with load_server_tls")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*self.files)
        if self.client_ca is not None:
            context.load_verify_locations(cadata=self.client_ca.decode("ascii", "replace"))
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.private_key, self.certificate_chain)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )


@dataclass(frozen=True)
class ClientTls:
    """What a client trusts (PEM CA bundle; None: the system's CAs) and, for servers that
    require client certificates, its own certificate chain and key."""

    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = field(default=None, repr=False)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )


def _read_pem(path: str, option: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(pem_file_bytes_max + 1)
    except OSError as err:
        raise TlsConfigError(f"cannot read {path}: {err.strerror or err}", option) from None
    if len(data) > pem_file_bytes_max:
        raise TlsConfigError(f"{path}: larger than {pem_file_bytes_max} bytes", option)
    if b"-----BEGIN " not in data:
        raise TlsConfigError(f"{path}: not a PEM file (no '-----BEGIN' line)", option)
    return data


def _check_pair(cert_file: str, key_file: str, cert_option: str, key_option: str) -> None:
    """Refuse a certificate that does not parse, or a key that is not its key."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as err:
        reason = err.reason or str(err)
        if "KEY_VALUES_MISMATCH" in str(err):
            raise TlsConfigError(
                f"{key_file} is not the private key of the certificate in {cert_file}", key_option
            ) from None
        raise TlsConfigError(
            f"{cert_file} / {key_file}: not a usable certificate and key ({reason})",
            f"{cert_option}/{key_option}",
        ) from None


def _check_ca(path: str, option: str) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=path)
    except ssl.SSLError as err:
        raise TlsConfigError(
            f"{path}: no usable CA certificate ({err.reason or err})", option
        ) from None


def _missing_pair(cert_file: str | None, cert_option: str, key_option: str) -> TlsConfigError:
    """The error of a certificate without its key, or a key without its certificate."""
    if cert_file:
        return TlsConfigError(f"is required with {cert_option}", key_option)
    return TlsConfigError(f"is required with {key_option}", cert_option)


def load_server_tls(
    cert_file: str,
    key_file: str,
    client_ca_file: str | None = None,
    *,
    options: tuple[str, str, str] = ("--tls-cert", "--tls-key", "--tls-client-ca"),
) -> ServerTls:
    """A server's TLS from its PEM files (see ServerTls); `options` name them in errors."""
    cert_option, key_option, ca_option = options
    if not cert_file or not key_file:
        raise _missing_pair(cert_file, cert_option, key_option)
    chain, key = _read_pem(cert_file, cert_option), _read_pem(key_file, key_option)
    _check_pair(cert_file, key_file, cert_option, key_option)
    client_ca = None
    if client_ca_file:
        client_ca = _read_pem(client_ca_file, ca_option)
        _check_ca(client_ca_file, ca_option)
    return ServerTls(chain, key, client_ca, (cert_file, key_file))


def load_client_tls(
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    *,
    options: tuple[str, str, str] = ("--tls-ca", "--tls-cert", "--tls-key"),
) -> ClientTls:
    """A client's TLS from its PEM files (see ClientTls); `options` name them in errors."""
    ca_option, cert_option, key_option = options
    roots = None
    if ca_file:
        roots = _read_pem(ca_file, ca_option)
        _check_ca(ca_file, ca_option)
    chain = key = None
    if cert_file or key_file:
        if not cert_file or not key_file:
            raise _missing_pair(cert_file, cert_option, key_option)
        chain, key = _read_pem(cert_file, cert_option), _read_pem(key_file, key_option)
        _check_pair(cert_file, key_file, cert_option, key_option)
    return ClientTls(roots, chain, key)


def client_tls_from_env(environ: Mapping[str, str] | None = None) -> ClientTls | None:
    """The client TLS ``GAZETTE_TLS_CA``/``_CERT``/``_KEY`` configure; None if none is set
    (``https://`` endpoints are then dialed trusting the system's CAs)."""
    env = os.environ if environ is None else environ
    ca, cert, key = (env.get(name, "").strip() for name in (ENV_CA, ENV_CERT, ENV_KEY))
    if not (ca or cert or key):
        return None
    return load_client_tls(
        ca or None, cert or None, key or None, options=(ENV_CA, ENV_CERT, ENV_KEY)
    )


class PortBindError(OSError):
    """A server could not listen at its address: the port is in use (servers do not share
    ports: grpc_transport.EXCLUSIVE_PORT_SERVER_OPTIONS), or the host is not this machine's."""


def bind_port(server: grpc.aio.Server, address: str, tls: ServerTls | None) -> tuple[int, str]:
    """Add a listening port at `address` (``host:port``; port 0 picks a free one): TLS with
    `tls`, else in the clear. Returns (bound port, endpoint scheme to advertise). Raises
    PortBindError if the address cannot be bound."""
    try:
        if tls is None:
            port, scheme = server.add_insecure_port(address), "http"
        else:
            port, scheme = server.add_secure_port(address, tls.credentials()), "https"
    except RuntimeError as err:  # gRPC's "Failed to bind to address ...".
        raise PortBindError(
            f"cannot listen on {address}: it is in use by another process, or not an address"
            " of this host (pick another --port or --host, or stop the other process)"
        ) from err
    if port == 0:  # Older gRPC answers a failed bind with port 0.
        raise PortBindError(f"cannot listen on {address}")
    return port, scheme


def describe_failure(
    details: str, *, ca_option: str = "--tls-ca", cert_option: str = "--tls-cert/--tls-key"
) -> str:
    """`details` of a failed RPC, with a hint when a TLS handshake is what failed (naming the
    options that would fix it)."""
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return (
            f"{details} (TLS: the server's certificate is not signed by a CA this client trusts,"
            f" or does not name the host dialed: check {ca_option})"
        )
    if "TSI_DATA_CORRUPTED" in details or "Socket closed" in details:
        return (
            f"{details} (the server ended the connection: if it requires client certificates,"
            f" give {cert_option}; if it serves TLS, dial https://)"
        )
    if "handshake" in details.lower() or "SSL_ERROR" in details:
        return f"{details} (TLS handshake failed: is one side not using TLS?)"
    return details
