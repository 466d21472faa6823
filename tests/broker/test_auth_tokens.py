"""Tokens, keys, claims and the client-side authorizers of broker.auth (no broker needed)."""

from __future__ import annotations

import base64
import json
import time

import jwt
import pytest

from broker.auth import (
    ALL,
    APPEND,
    APPLY,
    LIST,
    READ,
    REPLICATE,
    AuthKeysError,
    CapabilityError,
    Claims,
    ForwardingAuthorizer,
    InvalidTokenError,
    KeyedAuth,
    KeyedAuthorizer,
    MissingAuthError,
    TokenAuthorizer,
    authorizer_from_env,
    capability_of,
    decode_keys,
    forward_authorization,
    forwarded_authorization,
    selector_from_json,
    selector_to_json,
    verified_claims,
)
from broker.auth_server import covering_selector, covers
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.selector import format_selector, parse_selector

K1, K2, K3 = b"k" * 32, b"second key, also 32 bytes long!!", b"a third, unrelated 32-byte key.."
B64 = {k: base64.b64encode(k).decode() for k in (K1, K2, K3)}
NOW = 1_700_000_000.0


def auth(*keys: bytes, now: float = NOW, allow_missing: bool = False) -> KeyedAuth:
    return KeyedAuth(list(keys), allow_missing=allow_missing, clock=lambda: now)


def bearer(token: str) -> str:
    return f"Bearer {token}"


def test_keys_are_base64_separated_by_commas_or_spaces() -> None:
    keys, allow_missing = decode_keys(f" {B64[K1]},{B64[K2]}\n {B64[K3]} ")
    assert keys == [K1, K2, K3] and not allow_missing
    keys, allow_missing = decode_keys(f"{B64[K1]}, AA==")
    assert keys == [K1] and allow_missing


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "at least one non-empty key"),
        ("AA==", "at least one non-empty key"),
        (f"{B64[K1]}, not*base64", "auth_keys[1]: not valid base64"),
        ("abc", "auth_keys[0]: not valid base64"),  # Bad padding.
    ],
)
def test_bad_keys_are_refused_naming_the_key(text: str, message: str) -> None:
    with pytest.raises(AuthKeysError) as info:
        decode_keys(text)
    assert message in str(info.value)


def test_the_first_key_signs_and_any_verifies() -> None:
    signer = auth(K1, K2)
    token = signer.sign(Claims(APPEND | READ), 60)
    # Mid-rotation, a broker that lists the keys the other way round still verifies it.
    claims = auth(K2, K1).verify(bearer(token), APPEND)
    assert claims.capability == APPEND | READ
    assert (claims.issued_at, claims.expires_at) == (int(NOW), int(NOW) + 60)
    with pytest.raises(InvalidTokenError) as info:
        auth(K3).verify(bearer(token), APPEND)
    assert "signature matches none of our keys" in str(info.value)


def test_tokens_are_gazettes_hs256_jwts() -> None:
    token = auth(K1).sign(Claims(LIST, parse_selector("name:prefix=a/")), 60)
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "HS256"
    payload = jwt.decode(token, K1, algorithms=["HS256"], options={"verify_exp": False})
    assert payload == {
        "cap": LIST,
        "sel": {
            "include": {"labels": [{"name": "name", "value": "a/", "prefix": True}]},
            "exclude": {"labels": []},
        },
        "iat": int(NOW),
        "exp": int(NOW) + 60,
    }


def test_a_token_signed_elsewhere_in_gazettes_encoding_verifies() -> None:
    # As Go's encoder writes a LabelSelector: "labels": null for an empty set, omitted values.
    payload = {
        "cap": APPEND,
        "sel": {
            "include": {"labels": [{"name": "name", "value": "x/y"}]},
            "exclude": {"labels": None},
        },
        "iat": int(NOW),
        "exp": int(NOW) + 60,
    }
    key = b"a key of 48 bytes, as HS384 wants it: 0123456789"
    token = jwt.encode(payload, key, algorithm="HS384")
    claims = auth(key).verify(bearer(token), APPEND)
    assert claims.selector == parse_selector("name=x/y")


def test_missing_and_malformed_authorizations_are_unauthenticated() -> None:
    a = auth(K1)
    with pytest.raises(MissingAuthError, match="missing or empty authorization token"):
        a.verify(None, READ)
    with pytest.raises(InvalidTokenError, match="expected 'Bearer <token>'"):
        a.verify("Basic dXNlcjpwYXNz", READ)
    with pytest.raises(InvalidTokenError, match="verifying authorization"):
        a.verify("Bearer not.a.token", READ)
    unsigned = jwt.encode({"cap": ALL, "exp": int(NOW) + 60}, "", algorithm="none")
    with pytest.raises(InvalidTokenError, match="verifying authorization"):
        a.verify(bearer(unsigned), READ)


def test_expiry_and_issue_time_are_checked_with_leeway() -> None:
    token = auth(K1).sign(Claims(READ), 60)
    assert auth(K1, now=NOW + 64).verify(bearer(token), READ).capability == READ  # Leeway.
    with pytest.raises(InvalidTokenError, match="exp: token has expired"):
        auth(K1, now=NOW + 66).verify(bearer(token), READ)
    with pytest.raises(InvalidTokenError, match="iat: token is not valid yet"):
        auth(K1, now=NOW - 10).verify(bearer(token), READ)
    no_exp = jwt.encode({"cap": READ, "iat": int(NOW)}, K1, algorithm="HS256")
    with pytest.raises(InvalidTokenError, match="exp: is required"):
        auth(K1).verify(bearer(no_exp), READ)


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ({"cap": -1}, "cap: must be a 32-bit unsigned integer"),
        ({"cap": "READ"}, "cap: must be a 32-bit unsigned integer"),
        ({"cap": READ, "sel": "name=x"}, "sel: must be an object"),
        (
            {"cap": READ, "sel": {"include": {"labels": [{"name": "bad name"}]}}},
            "sel.include.labels",
        ),
        ({"cap": READ, "sel": {"include": {"labels": [7]}}}, "sel.include.labels[0]"),
    ],
)
def test_bad_claims_are_refused_naming_the_field(claims: dict[str, object], message: str) -> None:
    token = jwt.encode({**claims, "iat": int(NOW), "exp": int(NOW) + 60}, K1, algorithm="HS256")
    with pytest.raises(InvalidTokenError) as info:
        auth(K1).verify(bearer(token), 0)
    assert message in str(info.value)


def test_a_missing_capability_is_named() -> None:
    token = auth(K1).sign(Claims(READ | LIST), 60)
    with pytest.raises(CapabilityError, match="missing required APPEND capability"):
        auth(K1).verify(bearer(token), APPEND)
    with pytest.raises(CapabilityError, match="missing required capability"):
        auth(K1).verify(bearer(token), 1 << 20)  # An application's bit.


def test_allow_missing_lets_requests_without_a_token_through() -> None:
    a = KeyedAuth.parse(f"{B64[K1]},AA==", clock=lambda: NOW)
    assert a.verify(None, APPEND).capability == APPEND
    # A token that is presented is still verified.
    with pytest.raises(InvalidTokenError):
        a.verify("Bearer x.y.z", APPEND)


def test_capabilities_of_methods() -> None:
    assert capability_of("/protocol.Journal/Append") == APPEND
    assert capability_of("/protocol.Journal/Replicate") == REPLICATE
    assert capability_of("/protocol.Journal/ListFragments") == READ
    assert capability_of("/protocol.Journal/Apply") == APPLY
    # A consumer's Shard RPCs: Gazette's capabilities.
    assert capability_of("/consumer.Shard/Stat") == READ
    assert capability_of("/consumer.Shard/GetHints") == READ
    assert capability_of("/consumer.Shard/List") == LIST
    assert capability_of("/consumer.Shard/Apply") == APPLY
    assert capability_of("/consumer.Shard/Unassign") == APPLY
    # Other services (an application's own) need a valid token only.
    assert capability_of("/app.Queries/Get") == 0


def test_selector_json_round_trips() -> None:
    selector = parse_selector("name:prefix=a/, app in (x, y), !secret")
    assert selector_from_json(json.loads(json.dumps(selector_to_json(selector)))) == selector
    assert format_selector(selector_from_json(None)) == ""


def test_covering_selectors_match_as_list_does() -> None:
    labels = gl.label_set([("app", "x")])
    assert covering_selector(Claims(READ)) is None  # Everything.
    by_prefix = covering_selector(Claims(READ, parse_selector("prefix=a/b/")))
    assert covers(by_prefix, "a/b/c", labels) and not covers(by_prefix, "a/bc", labels)
    by_name_prefix = covering_selector(Claims(READ, parse_selector("name:prefix=a/b")))
    assert covers(by_name_prefix, "a/bc", labels)
    by_label = covering_selector(Claims(READ, parse_selector("app=x")))
    assert covers(by_label, "q/r", labels) and not covers(by_label, "q/r", pb.LabelSet())
    excluding = covering_selector(Claims(READ, parse_selector("!app")))
    assert not covers(excluding, "q/r", labels)


def test_keyed_authorizer_forwards_verified_claims_but_signs_replication_itself() -> None:
    a = auth(K1, now=time.time())
    authorizer = KeyedAuthorizer(a)

    def claims_of(value: str | None) -> Claims:
        assert value is not None and value.startswith("Bearer ")
        return a.verify(value, 0)

    own = claims_of(authorizer.authorization("/protocol.Journal/Read"))
    assert own.capability == READ and covering_selector(own) is None
    caller = Claims(APPEND, parse_selector("name=j/1"), expires_at=int(time.time()) + 30)
    token = verified_claims.set(caller)
    try:
        forwarded = claims_of(authorizer.authorization("/protocol.Journal/Append"))
        assert (forwarded.capability, forwarded.selector) == (APPEND, caller.selector)
        assert forwarded.expires_at <= caller.expires_at  # Never outlives the caller's.
        replication = claims_of(authorizer.authorization("/protocol.Journal/Replicate"))
        assert replication.capability == REPLICATE and covering_selector(replication) is None
    finally:
        verified_claims.reset(token)


def test_other_authorizers() -> None:
    assert TokenAuthorizer(" abc ").authorization("/x/Y") == "Bearer abc"
    forwarding = ForwardingAuthorizer()
    assert forwarding.authorization("/x/Y") is None
    token = forward_authorization("Bearer zzz")
    try:
        assert forwarding.authorization("/x/Y") == "Bearer zzz"
    finally:
        forwarded_authorization.reset(token)
    assert authorizer_from_env({}) is None
    from_token = authorizer_from_env({"GAZETTE_AUTH_TOKEN": "t", "GAZETTE_AUTH_KEYS": B64[K1]})
    assert isinstance(from_token, TokenAuthorizer)
    assert isinstance(authorizer_from_env({"GAZETTE_AUTH_KEYS": B64[K1]}), KeyedAuthorizer)
    with pytest.raises(AuthKeysError):
        authorizer_from_env({"GAZETTE_AUTH_KEYS": "???"})
