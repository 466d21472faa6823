"""etcd endpoints as given on the command line: ``host:port``, ``http://host:port`` or
``https://host:port``, checked and turned into dial targets. No gRPC or etcd stubs: gazctl
checks endpoints without loading them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from broker.tls import ClientTls

PORT_MAX: Final = 65535


class EndpointError(ValueError):
    """An etcd endpoint list or address that cannot be used."""


def split_endpoint(endpoint: str) -> tuple[str, str]:
    """(``host:port``, scheme) of ``host:port``, ``http://host:port`` or ``https://host:port``
    (the scheme is "" for a bare ``host:port``)."""
    target = endpoint.strip()
    scheme = ""
    for prefix in ("http://", "https://"):
        if target.startswith(prefix):
            scheme, target = prefix[:-3], target[len(prefix) :]
            break
    else:
        if "://" in target:
            raise EndpointError(
                f"etcd endpoint {endpoint!r}: expected host:port, http:// or https://"
            )
    target = target.rstrip("/")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit() or "/" in target:
        raise EndpointError(f"etcd endpoint {endpoint!r}: expected host:port")
    if int(port) > PORT_MAX:
        raise EndpointError(f"etcd endpoint {endpoint!r}: port must be in [0, {PORT_MAX}]")
    # An IPv6 address in brackets ([::1]:2379); any other host without brackets or colons.
    # Before, a malformed one ("[::1", "::1:2379") passed here and ended, seconds later, as
    # "cannot reach etcd" (found by the bad-input audit).
    bracketed = host.startswith("[") and host.endswith("]") and len(host) > 2
    inner = host[1:-1] if bracketed else host
    if any(c.isspace() for c in host):
        raise EndpointError(f"etcd endpoint {endpoint!r}: expected host:port")
    if "[" in inner or "]" in inner or (":" in inner and not bracketed):
        raise EndpointError(
            f"etcd endpoint {endpoint!r}: expected host:port (an IPv6 address in brackets:"
            " [::1]:2379)"
        )
    return target, scheme


def parse_endpoint(endpoint: str) -> str:
    """``host:port`` from ``host:port``, ``http://host:port`` or ``https://host:port``."""
    return split_endpoint(endpoint)[0]


def check_endpoints(endpoints: Sequence[str], tls: ClientTls | None) -> list[tuple[str, bool]]:
    """(``host:port``, dial with TLS) of each endpoint: TLS for ``https://``, and for a bare
    ``host:port`` when `tls` is given. Raises EndpointError for a malformed endpoint, or an
    ``http://`` one with `tls` (contradictory)."""
    out: list[tuple[str, bool]] = []
    for endpoint in endpoints:
        target, scheme = split_endpoint(endpoint)
        if scheme == "http" and tls is not None:
            raise EndpointError(
                f"etcd endpoint {endpoint!r}: TLS options are given but the endpoint is plain"
                " http:// (use https://)"
            )
        out.append((target, scheme == "https" or (scheme == "" and tls is not None)))
    return out
