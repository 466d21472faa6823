"""Authorization: bearer tokens that carry capabilities and a selector of journals or shards.

Tokens are Gazette's, so that ours and Gazette's tools interoperate: an HS256 (or HS384) JWT
whose claims are ``cap``, a bitmask of capabilities (`LIST`, `APPLY`, `READ`, `APPEND`,
`REPLICATE`, with Gazette's bit values), ``sel``, a LabelSelector (JSON, as Gazette encodes it)
limiting the journals (of brokers) or shards (of consumers) the token may touch, and the
registered ``iat`` / ``exp``. It travels in the ``authorization: Bearer <token>`` gRPC metadata
of every RPC. Brokers and consumers use the same keys and claims; each RPC needs one
capability (`capability_of`): a consumer's Stat and GetHints READ, List LIST, Apply and
Unassign APPLY, as in Gazette.

Keys are pre-shared: ``--auth-keys`` is a list of base64 keys separated by commas or spaces.
The first signs, and any verifies, so that keys can be rotated by adding the new one second,
then first, then dropping the old one. The special key ``AA==`` (one zero byte) lets requests
without a token through, for rolling authorization out on a running cluster.

Who signs what:

- A client with ``GAZETTE_AUTH_TOKEN`` presents that token as is; one with
  ``GAZETTE_AUTH_KEYS`` signs, per RPC, a token with the capability that RPC needs and no
  selector (`authorizer_from_env`; `JournalClient` does this by default).
- A broker signs its own tokens with its first key: its Replicate streams carry REPLICATE over
  every journal; a request it proxies carries the claims it verified on the way in (the
  caller's capabilities and selector, never more), taken from `verified_claims`.
- The HTTP gateway passes the HTTP ``Authorization`` header through (`forwarded_authorization`).

- A consumer signs its Stat requests proxied to peers likewise (the caller's claims), and its
  shards' calls to brokers with the capability each needs.

Brokers verify (`KeyedAuth.verify`) in their server interceptor (`broker.auth_server`),
consumers in theirs (`gazette_consumer.shard_auth`).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final, Protocol

import grpc
import grpc.aio

from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import ValidationError, at, validate_label_selector

if TYPE_CHECKING:
    from jwt import PyJWS

log = get_logger(__name__)

# Capabilities: Gazette's bit values (applications may use bits from 1 << 16).
LIST: Final = 1 << 1
APPLY: Final = 1 << 2
READ: Final = 1 << 3
APPEND: Final = 1 << 4
REPLICATE: Final = 1 << 5
ALL: Final = (1 << 32) - 1
CAPABILITY_NAMES: Final = ((LIST, "LIST"), (APPLY, "APPLY"), (READ, "READ"), (APPEND, "APPEND"),
                           (REPLICATE, "REPLICATE"))  # fmt: skip

# The capability each Journal RPC needs.
_JOURNAL_SERVICE: Final = "/protocol.Journal/"
METHOD_CAPABILITIES: Final = {
    "List": LIST,
    "Apply": APPLY,
    "Read": READ,
    "Append": APPEND,
    "Replicate": REPLICATE,
    "ListFragments": READ,
    "FragmentStoreHealth": READ,
}
# The capability each Shard RPC (a consumer's) needs: Gazette's.
_SHARD_SERVICE: Final = "/consumer.Shard/"
SHARD_METHOD_CAPABILITIES: Final = {
    "Stat": READ,
    "List": LIST,
    "Apply": APPLY,
    "GetHints": READ,
    "Unassign": APPLY,
}
_SERVICES: Final = (
    (_JOURNAL_SERVICE, METHOD_CAPABILITIES),
    (_SHARD_SERVICE, SHARD_METHOD_CAPABILITIES),
)
# Lifetimes of tokens we sign: long for streams that stay open, short for the rest (Gazette's).
stream_token_ttl_s: Final = 3600.0
unary_token_ttl_s: Final = 60.0
_STREAMING: Final = frozenset(
    _JOURNAL_SERVICE + name for name in ("List", "Read", "Append", "Replicate")
)
_REPLICATE: Final = _JOURNAL_SERVICE + "Replicate"
# Clock skew tolerated between signer and verifier (Gazette's).
leeway_s_default: Final = 5.0
# The key that lets requests without a token through (Gazette's rollout value).
ALLOW_MISSING_KEY: Final = "AA=="
# Shorter HMAC keys are weak (RFC 7518 §3.2); Gazette accepts them, so we do, with a warning.
_STRONG_KEY_BYTES: Final = 32

AUTHORIZATION: Final = "authorization"
_BEARER: Final = "Bearer "


class AuthKeysError(ValidationError):
    """An unusable --auth-keys value."""


class AuthError(Exception):
    """An RPC's authorization is refused. `code` is the gRPC status to answer with, `reason`
    a short label for metrics."""

    code: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED
    reason = "invalid"


class MissingAuthError(AuthError):
    reason = "missing"


class InvalidTokenError(AuthError):
    reason = "invalid"


class CapabilityError(AuthError):
    code = grpc.StatusCode.PERMISSION_DENIED
    reason = "capability"


@dataclass(frozen=True)
class Claims:
    """What a token grants: `capability` over the journals `selector` matches (an empty
    selector matches every journal), from `issued_at` until `expires_at` (Unix seconds)."""

    capability: int
    selector: pb.LabelSelector = field(default_factory=pb.LabelSelector)
    issued_at: int = 0
    expires_at: int = 0

    def to_payload(self) -> dict[str, Any]:
        return {
            "cap": self.capability,
            "sel": selector_to_json(self.selector),
            "iat": self.issued_at,
            "exp": self.expires_at,
        }


def capability_of(method: str) -> int:
    """The capability a full gRPC method name needs (0 outside the Journal and Shard
    services: any valid token will do)."""
    for service, capabilities in _SERVICES:
        if method.startswith(service):
            return capabilities.get(method[len(service) :], 0)
    return 0


def check_capability(have: int, require: int) -> None:
    """Raise CapabilityError naming the first missing capability."""
    if have & require == require:
        return
    for bit, name in CAPABILITY_NAMES:
        if require & bit and not have & bit:
            raise CapabilityError(f"authorization is missing required {name} capability")
    raise CapabilityError(
        f"authorization is missing required capability (have {have:b}, require {require:b})"
    )


# --- Selector JSON (Gazette's field names: include/exclude, labels, name/value/prefix) ---------


def selector_to_json(selector: pb.LabelSelector) -> dict[str, Any]:
    def labels(label_set: pb.LabelSet) -> dict[str, Any]:
        out = []
        for label in label_set.labels:
            item: dict[str, Any] = {"name": label.name, "value": label.value}
            if label.prefix:
                item["prefix"] = True
            out.append(item)
        return {"labels": out}

    return {"include": labels(selector.include), "exclude": labels(selector.exclude)}


def selector_from_json(doc: Any) -> pb.LabelSelector:
    """A validated LabelSelector from its JSON form (null and missing parts are empty)."""
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ValidationError(f"must be an object (got {type(doc).__name__})", "sel")
    selector = pb.LabelSelector()
    selector.include.SetInParent()  # Both present, as parse_selector makes them.
    selector.exclude.SetInParent()
    for side in ("include", "exclude"):
        part = doc.get(side) or {}
        labels = part.get("labels") if isinstance(part, dict) else part
        if not isinstance(labels, list | type(None)):
            raise ValidationError("must be a list of labels", "sel", side, "labels")
        for index, label in enumerate(labels or []):
            name, value, prefix = _label_fields(label, side, index)
            getattr(selector, side).labels.add(name=name, value=value, prefix=prefix)
    with at("sel"):
        validate_label_selector(selector)
    return selector


def _label_fields(label: Any, side: str, index: int) -> tuple[str, str, bool]:
    where = ("sel", side, f"labels[{index}]")
    if not isinstance(label, dict):
        raise ValidationError("must be an object with name and value", *where)
    name, value, prefix = label.get("name", ""), label.get("value", ""), label.get("prefix", False)
    if not isinstance(name, str) or not isinstance(value, str) or not isinstance(prefix, bool):
        raise ValidationError("name and value must be strings, prefix a boolean", *where)
    return name, value, prefix


# --- Signing and verifying ------------------------------------------------------------------


_ALGORITHMS: Final = ("HS256", "HS384")


@functools.cache
def _jws() -> PyJWS:
    """The token codec, built when keys are first given (KeyedAuth): PyJWT imports
    `cryptography` (~0.1-0.25 s), which a process without keys (a Spark task, a streaming
    query's source process) never needs."""
    from jwt import PyJWS
    from jwt.algorithms import HMACAlgorithm

    class _HMAC(HMACAlgorithm):
        def check_key_length(self, key: bytes) -> str | None:
            return None  # Weak keys are reported once, when parsed: see KeyedAuth.parse.

    jws = PyJWS(algorithms=list(_ALGORITHMS))
    jws.unregister_algorithm("HS256")
    jws.unregister_algorithm("HS384")
    jws.register_algorithm("HS256", _HMAC(HMACAlgorithm.SHA256))
    jws.register_algorithm("HS384", _HMAC(HMACAlgorithm.SHA384))
    return jws


def decode_keys(text: str) -> tuple[list[bytes], bool]:
    """(keys, allow_missing) of a base64 key list, comma and/or whitespace separated.
    Raises AuthKeysError naming the bad key."""
    keys: list[bytes] = []
    allow_missing = False
    for index, word in enumerate(text.replace(",", " ").split()):
        if word == ALLOW_MISSING_KEY:
            allow_missing = True
            continue
        try:
            keys.append(base64.b64decode(word, validate=True))
        except (binascii.Error, ValueError):
            raise AuthKeysError("not valid base64", "auth_keys", f"[{index}]") from None
    if not keys or not all(keys):
        raise AuthKeysError("at least one non-empty key (besides AA==) is required", "auth_keys")
    return keys, allow_missing


class KeyedAuth:
    """Pre-shared HMAC keys: `sign` with the first, `verify` with any (see the module
    docstring). `clock` returns Unix seconds."""

    def __init__(
        self,
        keys: Sequence[bytes],
        *,
        allow_missing: bool = False,
        leeway_s: float = leeway_s_default,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not keys or any(not key for key in keys):
            raise AuthKeysError("at least one non-empty key is required", "auth_keys")
        self._keys = tuple(keys)
        _jws()  # Built with the keys: the first request does not pay for PyJWT's import.
        self.allow_missing = allow_missing
        self._leeway_s = leeway_s
        self._clock = clock

    @classmethod
    def parse(cls, text: str, **kwargs: Any) -> KeyedAuth:
        """Keys from their base64 list (see `decode_keys`)."""
        keys, allow_missing = decode_keys(text)
        for index, key in enumerate(keys):
            if len(key) < _STRONG_KEY_BYTES:
                log.warning("weak auth key: shorter than 32 bytes", index=index, bytes=len(key))
        return cls(keys, allow_missing=allow_missing, **kwargs)

    def sign(self, claims: Claims, ttl_s: float) -> str:
        """A token of `claims`, issued now and expiring in `ttl_s` (or at `claims.expires_at`,
        if that is set and sooner)."""
        now = int(self._clock())
        expires_at = now + int(ttl_s)
        if claims.expires_at:
            expires_at = min(expires_at, claims.expires_at)
        payload = replace(claims, issued_at=now, expires_at=expires_at).to_payload()
        body = json.dumps(payload, separators=(",", ":")).encode()
        return _jws().encode(body, self._keys[0], algorithm="HS256", headers={"typ": "JWT"})

    def verify(self, authorization: str | None, require: int) -> Claims:
        """The claims of an ``authorization`` header value, which must grant `require`.
        Raises MissingAuthError, InvalidTokenError or CapabilityError."""
        if not authorization:
            if self.allow_missing:
                now = int(self._clock())
                return Claims(require, issued_at=now, expires_at=now + int(stream_token_ttl_s))
            raise MissingAuthError(
                "missing or empty authorization token (expected 'Bearer <token>')"
            )
        if not authorization.startswith(_BEARER):
            raise InvalidTokenError("unsupported authorization header (expected 'Bearer <token>')")
        claims = self._decode(authorization[len(_BEARER) :].strip())
        check_capability(claims.capability, require)
        return claims

    def _decode(self, token: str) -> Claims:
        from jwt.exceptions import InvalidSignatureError, PyJWTError

        jws = _jws()
        payload: bytes | None = None
        try:
            for key in self._keys:
                try:
                    decoded = jws.decode_complete(token, key, algorithms=list(_ALGORITHMS))
                except InvalidSignatureError:
                    continue
                payload = decoded["payload"]
                break
        except PyJWTError as err:
            raise InvalidTokenError(f"verifying authorization: {err}") from None
        if payload is None:
            raise InvalidTokenError("verifying authorization: signature matches none of our keys")
        try:
            doc = json.loads(payload)
            return self._claims_of(doc)
        except (ValueError, ValidationError) as err:
            raise InvalidTokenError(f"verifying authorization: claims: {err}") from None

    def _claims_of(self, doc: Any) -> Claims:
        if not isinstance(doc, dict):
            raise ValidationError("must be a JSON object")
        now = self._clock()
        times: dict[str, int] = {}
        for name in ("exp", "iat", "nbf"):
            value = doc.get(name)
            if value is None:
                continue
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ValidationError(f"must be a number (got {value!r})", name)
            times[name] = int(value)
        if "exp" not in times:
            raise ValidationError("is required", "exp")
        if now > times["exp"] + self._leeway_s:
            raise ValidationError("token has expired", "exp")
        for name in ("iat", "nbf"):
            if name in times and times[name] > now + self._leeway_s:
                raise ValidationError("token is not valid yet", name)
        cap = doc.get("cap", 0)
        if not isinstance(cap, int) or isinstance(cap, bool) or not 0 <= cap <= ALL:
            raise ValidationError(f"must be a 32-bit unsigned integer (got {cap!r})", "cap")
        selector = selector_from_json(doc.get("sel"))
        return Claims(cap, selector, times.get("iat", 0), times["exp"])


# --- Outgoing RPCs ----------------------------------------------------------------------------

# Claims verified for the RPC being served in this context (set by the server interceptor,
# one context per RPC): the broker forwards them, re-signed, with requests it proxies.
verified_claims: ContextVar[Claims | None] = ContextVar("verified_claims", default=None)
# An Authorization header value to pass through as is (set by the HTTP gateway per request).
forwarded_authorization: ContextVar[str | None] = ContextVar(
    "forwarded_authorization", default=None
)


def forward_authorization(value: str | None) -> Token[str | None]:
    """Make RPCs started in this context carry `value` (see `ForwardingAuthorizer`)."""
    return forwarded_authorization.set(value or None)


class Authorizer(Protocol):
    def authorization(self, method: str) -> str | None:
        """The authorization metadata value for a call of full method name `method`."""
        ...


class TokenAuthorizer:
    """Presents one pre-made token on every call."""

    def __init__(self, token: str) -> None:
        self._value = _BEARER + token.strip()

    def authorization(self, method: str) -> str | None:
        return self._value


class KeyedAuthorizer:
    """Signs a token per call: REPLICATE over every journal for Replicate; else the claims
    verified for the RPC being served (a proxied request), else the capability the method
    needs over every journal."""

    def __init__(self, auth: KeyedAuth) -> None:
        self._auth = auth

    def authorization(self, method: str) -> str | None:
        ttl_s = stream_token_ttl_s if method in _STREAMING else unary_token_ttl_s
        claims = verified_claims.get()
        if method == _REPLICATE or claims is None:
            claims = Claims(capability_of(method))
        return _BEARER + self._auth.sign(claims, ttl_s)


class ForwardingAuthorizer:
    """Passes through the `forwarded_authorization` of the calling context, if any."""

    def authorization(self, method: str) -> str | None:
        return forwarded_authorization.get()


def authorizer_from_env(environ: Mapping[str, str] | None = None) -> Authorizer | None:
    """``GAZETTE_AUTH_TOKEN`` (a token to present) or else ``GAZETTE_AUTH_KEYS`` (keys to sign
    with); None if neither is set."""
    env = os.environ if environ is None else environ
    if token := env.get("GAZETTE_AUTH_TOKEN", "").strip():
        return TokenAuthorizer(token)
    if keys := env.get("GAZETTE_AUTH_KEYS", "").strip():
        return KeyedAuthorizer(KeyedAuth.parse(keys))
    return None


class _Interceptor:
    def __init__(self, authorizer: Authorizer) -> None:
        self._authorizer = authorizer

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        method = details.method
        name = method.decode() if isinstance(method, bytes) else method
        value = self._authorizer.authorization(name)
        if value is None:
            return details
        metadata = grpc.aio.Metadata(
            *((k, v) for k, v in (details.metadata or ()) if k != AUTHORIZATION)
        )
        metadata.add(AUTHORIZATION, value)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


class _UnaryUnary(_Interceptor, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _UnaryStream(_Interceptor, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _StreamUnary(_Interceptor, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


class _StreamStream(_Interceptor, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


def client_interceptors(authorizer: Authorizer | None) -> list[grpc.aio.ClientInterceptor]:
    """Channel interceptors adding `authorizer`'s metadata to every call (none if None).
    (grpc.aio files an interceptor under one call kind only, hence one object per kind.)"""
    if authorizer is None:
        return []
    return [cls(authorizer) for cls in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)]


def client_interceptors_from_env(
    environ: Mapping[str, str] | None = None,
) -> list[grpc.aio.ClientInterceptor]:
    return client_interceptors(authorizer_from_env(environ))
