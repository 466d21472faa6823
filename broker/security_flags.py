"""Command-line options of authorization and TLS, shared by ``gazette serve``,
``gazette-consumer serve`` and ``gazctl`` (docs/security.md explains them).

Servers (``add_server_tls_options``):

- ``--tls-cert`` / ``--tls-key``: serve TLS with this certificate, advertising an ``https://``
  endpoint (Gazette's ``--server-cert-file`` / ``--server-cert-key-file`` are aliases);
- ``--tls-client-ca``: mutual TLS: require client certificates signed by this CA (Gazette's
  ``--server-ca-file``);
- ``--tls-ca``: the CAs trusted when dialing ``https://`` peers and brokers (default: the
  system's; Gazette's ``--peer-ca-file``);
- ``--tls-peer-cert`` / ``--tls-peer-key``: the certificate presented when dialing them
  (default: ``--tls-cert`` / ``--tls-key``; Gazette's ``--peer-cert-file`` /
  ``--peer-cert-key-file``).

etcd (``add_etcd_options``): ``--etcd-ca``, ``--etcd-cert`` / ``--etcd-key`` (a client
certificate, for etcd's ``--client-cert-auth``), ``--etcd-user`` / ``--etcd-password``.

Clients (``add_client_options``): ``--auth-token`` (a token to present) or ``--auth-keys``
(keys to sign tokens with), and ``--tls-ca``, ``--tls-cert`` / ``--tls-key``.

Every option defaults to its environment variable (``GAZETTE_TLS_CERT``, ...: see each help).
Files are read and checked when the options are loaded, before anything binds or dials; a bad
one raises ``TlsConfigError`` naming the option.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from broker.auth import (
    AuthKeysError,
    Authorizer,
    KeyedAuth,
    KeyedAuthorizer,
    TokenAuthorizer,
    decode_keys,
)
from broker.auth import client_interceptors as _client_interceptors
from broker.tls import (
    ENV_CA,
    ENV_CERT,
    ENV_CLIENT_CA,
    ENV_KEY,
    ClientTls,
    ServerTls,
    TlsConfigError,
    load_client_tls,
    load_server_tls,
)

if TYPE_CHECKING:
    from broker.client.route_cache import ChannelPool

# Channels of a client (gazctl talks to a handful of brokers at most).
client_channels_max = 64


def _env(name: str) -> str:
    return os.environ.get(name, "")


def add_server_tls_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS (docs/security.md)")
    group.add_argument(
        "--tls-cert",
        "--server-cert-file",
        dest="tls_cert",
        default=_env(ENV_CERT),
        help="serve TLS with this PEM certificate (chain), advertising an https:// endpoint;"
        f" default ${ENV_CERT}",
    )
    group.add_argument(
        "--tls-key",
        "--server-cert-key-file",
        dest="tls_key",
        default=_env(ENV_KEY),
        help=f"the PEM private key of --tls-cert; default ${ENV_KEY}",
    )
    group.add_argument(
        "--tls-client-ca",
        "--server-ca-file",
        dest="tls_client_ca",
        default=_env(ENV_CLIENT_CA),
        help="mutual TLS: refuse clients without a certificate signed by a CA of this PEM file;"
        f" default ${ENV_CLIENT_CA}",
    )
    group.add_argument(
        "--tls-ca",
        "--peer-ca-file",
        dest="tls_ca",
        default=_env(ENV_CA),
        help="PEM CAs trusted when dialing https:// peers and brokers (default: the system's);"
        f" default ${ENV_CA}",
    )
    group.add_argument(
        "--tls-peer-cert",
        "--peer-cert-file",
        dest="tls_peer_cert",
        default="",
        help="the PEM certificate presented when dialing https:// peers (default: --tls-cert)",
    )
    group.add_argument(
        "--tls-peer-key",
        "--peer-cert-key-file",
        dest="tls_peer_key",
        default="",
        help="the PEM private key of --tls-peer-cert (default: --tls-key)",
    )


def add_etcd_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("etcd security (docs/security.md)")
    group.add_argument(
        "--etcd-ca",
        "--etcd.trusted-ca-file",
        dest="etcd_ca",
        default=_env("GAZETTE_ETCD_CA"),
        help="PEM CAs trusted for etcd's certificate; with any --etcd-ca/-cert, bare host:port"
        " --etcd endpoints are dialed with TLS; default $GAZETTE_ETCD_CA",
    )
    group.add_argument(
        "--etcd-cert",
        "--etcd.cert-file",
        dest="etcd_cert",
        default=_env("GAZETTE_ETCD_CERT"),
        help="PEM client certificate for etcd (its --client-cert-auth); default $GAZETTE_ETCD_CERT",
    )
    group.add_argument(
        "--etcd-key",
        "--etcd.cert-key-file",
        dest="etcd_key",
        default=_env("GAZETTE_ETCD_KEY"),
        help="the PEM private key of --etcd-cert; default $GAZETTE_ETCD_KEY",
    )
    group.add_argument(
        "--etcd-user",
        default=_env("GAZETTE_ETCD_USER"),
        help="etcd user (etcd auth); default $GAZETTE_ETCD_USER",
    )
    group.add_argument(
        "--etcd-password",
        default=_env("GAZETTE_ETCD_PASSWORD"),
        help="password of --etcd-user; default $GAZETTE_ETCD_PASSWORD (preferred: a command"
        " line is visible to other users of the machine)",
    )


def add_client_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("authorization and TLS (docs/security.md)")
    group.add_argument(
        "--auth-token",
        default=_env("GAZETTE_AUTH_TOKEN"),
        help="bearer token presented with every request; default $GAZETTE_AUTH_TOKEN",
    )
    group.add_argument(
        "--auth-keys",
        default=_env("GAZETTE_AUTH_KEYS"),
        help="base64 pre-shared keys to sign a token per request with (when no --auth-token);"
        " default $GAZETTE_AUTH_KEYS",
    )
    group.add_argument(
        "--tls-ca",
        default=_env(ENV_CA),
        help=f"PEM CAs trusted for https:// endpoints (default: the system's); default ${ENV_CA}",
    )
    group.add_argument(
        "--tls-cert",
        default=_env(ENV_CERT),
        help=f"PEM client certificate, for servers requiring one (mutual TLS); default ${ENV_CERT}",
    )
    group.add_argument(
        "--tls-key",
        default=_env(ENV_KEY),
        help=f"the PEM private key of --tls-cert; default ${ENV_KEY}",
    )


# --- Loading ----------------------------------------------------------------------------------


def server_tls_of(args: argparse.Namespace) -> ServerTls | None:
    """The server TLS the options configure (None: serve in the clear)."""
    if not args.tls_cert and not args.tls_key:
        if args.tls_client_ca:
            raise TlsConfigError("needs --tls-cert and --tls-key (a server to serve TLS)",
                                 "--tls-client-ca")  # fmt: skip
        return None
    return load_server_tls(args.tls_cert, args.tls_key, args.tls_client_ca or None)


def peer_tls_of(args: argparse.Namespace) -> ClientTls | None:
    """What a server dials https:// peers with (None: the system's CAs, no certificate)."""
    if args.tls_peer_cert or args.tls_peer_key:
        cert, key = args.tls_peer_cert, args.tls_peer_key
        options = ("--tls-ca", "--tls-peer-cert", "--tls-peer-key")
    else:
        cert, key = args.tls_cert, args.tls_key
        options = ("--tls-ca", "--tls-cert", "--tls-key")
    if not (args.tls_ca or cert or key):
        return None
    return load_client_tls(args.tls_ca or None, cert or None, key or None, options=options)


def etcd_options_of(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of EtcdBackend: ``tls``, ``user`` and ``password`` (the ``--etcd``
    endpoints are checked against them)."""
    tls = None
    if args.etcd_ca or args.etcd_cert or args.etcd_key:
        tls = load_client_tls(
            args.etcd_ca or None,
            args.etcd_cert or None,
            args.etcd_key or None,
            options=("--etcd-ca", "--etcd-cert", "--etcd-key"),
        )
    if args.etcd_password and not args.etcd_user:
        raise TlsConfigError("needs --etcd-user", "--etcd-password")
    from broker.keyspace.etcd import check_endpoints  # Here: gazctl never loads etcd's stubs.

    check_endpoints(args.etcd, tls)
    return {"tls": tls, "user": args.etcd_user, "password": args.etcd_password}


def check_auth_keys(keys: str, option: str) -> None:
    """Raise AuthKeysError naming `option` (and the key) if `keys` is not a usable key list."""
    try:
        decode_keys(keys)
    except AuthKeysError as err:
        raise AuthKeysError(err.rule, option, *err.context[1:]) from None


def authorizer_of(token: str, keys: str, *, keys_option: str = "--auth-keys") -> Authorizer | None:
    """A TokenAuthorizer of `token`, else a KeyedAuthorizer of `keys`, else None."""
    if token.strip():
        return TokenAuthorizer(token)
    if keys.strip():
        check_auth_keys(keys, keys_option)
        return KeyedAuthorizer(KeyedAuth.parse(keys))
    return None


def client_channels_of(
    args: argparse.Namespace, *, channels_max: int = client_channels_max
) -> ChannelPool:
    """The channels of a client configured by `add_client_options`."""
    from broker.client.route_cache import ChannelPool

    tls = None
    if args.tls_ca or args.tls_cert or args.tls_key:
        tls = load_client_tls(args.tls_ca or None, args.tls_cert or None, args.tls_key or None)
    authorizer = authorizer_of(args.auth_token, args.auth_keys)
    return ChannelPool(
        channels_max=channels_max, interceptors=_client_interceptors(authorizer), tls=tls
    )
