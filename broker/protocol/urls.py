"""Validation of the URLs of specs: fragment stores and endpoints, as Go's url.Parse reads them
(Gazette's fragment_store.go and endpoint.go)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from broker.protocol.validation_error import ValidationError
from broker.protocol.validation_error import quote as _quote

FRAGMENT_STORE_SCHEMES = ("s3", "gs", "azure", "azure-ad", "file")

_CONTROL_CHAR = re.compile(r"[\x00-\x1f\x7f]")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _parse_url(url: str) -> tuple[str, str, str]:
    """(scheme, host, path) of an absolute URL, refusing what Go's url.Parse refuses and
    urlsplit would let through: control characters and malformed %-escapes."""
    if _CONTROL_CHAR.search(url):
        raise ValidationError(f"must not contain control characters (got {_quote(url)})")
    # Go validates escapes of everything but the raw query; check up to the query.
    if _BAD_ESCAPE.search(url.split("?", 1)[0]):
        raise ValidationError(f"has an invalid %-escape (got {_quote(url)})")
    try:
        parts = urlsplit(url)
    except ValueError as err:  # An unbalanced '[' or ']' of an IPv6 host, for one.
        raise ValidationError(f"must be a valid URL: {err} (got {_quote(url)})") from None
    try:
        parts.port  # noqa: B018 -- evaluated for the ValueError of a malformed port.
    except ValueError:
        raise ValidationError(
            f"must have a numeric port in [0, 65535] (got {_quote(url)})"
        ) from None
    if not parts.scheme:
        raise ValidationError(f"must be an absolute URL with a scheme (got {_quote(url)})")
    host = parts.netloc.rpartition("@")[2]
    return parts.scheme, host, parts.path


def validate_fragment_store(url: str) -> None:
    """A fragment store is an absolute URL of a known scheme whose path ends in '/'."""
    scheme, host, path = _parse_url(url)
    if scheme in ("s3", "gs", "azure"):
        if not host:
            raise ValidationError(f"must name a bucket as the URL host (got {_quote(url)})")
    elif scheme == "azure-ad":
        # azure-ad://<tenant-id>/<storage-account>/<container>/<prefix...>/
        segments = path[1:].split("/")
        if not host:
            raise ValidationError(f"must name a tenant ID as the URL host (got {_quote(url)})")
        if segments[0] == "":
            raise ValidationError(
                f"must name a storage account as the first path segment (got {_quote(url)})"
            )
        if len(segments) < 2 or segments[1] == "":
            raise ValidationError(
                f"must name a storage container as the second path segment (got {_quote(url)})"
            )
    elif scheme == "file":
        if host:
            raise ValidationError(f"must not have a host with the file scheme (got {_quote(url)})")
    else:
        raise ValidationError(
            f"scheme must be one of {', '.join(FRAGMENT_STORE_SCHEMES)} (got {_quote(scheme)})"
        )
    if not path.endswith("/"):
        raise ValidationError(f"path must end in '/' (got {_quote(path)})")


def validate_endpoint(url: str) -> None:
    """An endpoint is an absolute URL with a host (http://host:port, unix://host/path)."""
    _, host, _ = _parse_url(url)
    if not host:
        raise ValidationError(f"must have a host (got {_quote(url)})")
