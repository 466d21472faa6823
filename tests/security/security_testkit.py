"""Tables of RPCs and tokens, for tests that every RPC refuses every bad token.

An ``Rpc`` makes one call with given metadata and sums its outcome up as an ``Outcome``: the
status code of a failed call with its details, or, for a call that returned, a word of what it
answered (a response status, the journals or shards listed). ``TOKENS`` are the kinds of token
each RPC is called with; ``mismatches`` runs the table and lists what did not go as expected.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc
import grpc.aio

from broker.auth import ALL, Claims, KeyedAuth
from broker.protocol import protocol_pb2 as pb
from broker.protocol.selector import parse_selector

KEY = b"the cluster's pre-shared key (32B)"
OTHER_KEY = b"someone else's key, 32 bytes long"
KEYS = base64.b64encode(KEY).decode()
SIGNER = KeyedAuth([KEY])
FORGER = KeyedAuth([OTHER_KEY])
# Signs tokens that expired an hour ago (well past the verifier's leeway).
PAST = KeyedAuth([KEY], clock=lambda: time.time() - 3600)


@dataclass(frozen=True)
class Outcome:
    """``kind`` is a gRPC status code name for a failed call, else "answered"; ``text`` the
    details of the failure, or what was answered."""

    kind: str
    text: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.text}"


def answered(text: str) -> Outcome:
    return Outcome("answered", text)


def refused(code: grpc.StatusCode, text: str) -> Outcome:
    return Outcome(code.name, text)


Metadata = Sequence[tuple[str, str]]


@dataclass(frozen=True)
class Rpc:
    """One RPC of a service. ``call`` runs it with the given metadata; ``capability`` is what
    it needs; ``in_scope`` and ``out_of_scope`` are what a token with every capability, whose
    selector covers the RPC's journal (or shard) or not, makes it answer (None: not asked)."""

    name: str
    capability: int
    call: Callable[[Metadata], Awaitable[Outcome]]
    in_scope: Outcome | None
    out_of_scope: Outcome | None


async def outcome_of(call: Awaitable[Outcome]) -> Outcome:
    try:
        return await call
    except grpc.aio.AioRpcError as err:
        return refused(err.code(), err.details() or "")


def bearer(token: str | None) -> Metadata:
    return [] if token is None else [("authorization", f"Bearer {token}")]


@dataclass(frozen=True)
class TokenCase:
    """A kind of token: made for an RPC's capability by ``token``, expected to be refused with
    ``code`` and details containing ``text``."""

    name: str
    token: Callable[[int], str | None]
    code: grpc.StatusCode
    text: str


TOKENS = (
    TokenCase(
        "missing",
        lambda cap: None,
        grpc.StatusCode.UNAUTHENTICATED,
        "missing or empty authorization token",
    ),
    TokenCase(
        "expired",
        lambda cap: PAST.sign(Claims(ALL), 60),
        grpc.StatusCode.UNAUTHENTICATED,
        "token has expired",
    ),
    TokenCase(
        "wrongly signed",
        lambda cap: FORGER.sign(Claims(ALL), 600),
        grpc.StatusCode.UNAUTHENTICATED,
        "signature matches none of our keys",
    ),
    TokenCase(
        "without the capability",
        lambda cap: SIGNER.sign(Claims(ALL & ~cap), 600),
        grpc.StatusCode.PERMISSION_DENIED,
        "authorization is missing required",
    ),
)


def scoped_token(selector: str) -> str:
    """A token with every capability over what `selector` matches."""
    return SIGNER.sign(Claims(ALL, parse_selector(selector)), 600)


def _matches(got: Outcome, want: Outcome) -> bool:
    """An answer must be exactly the one expected; a refusal's details must contain the
    expected text."""
    if want.kind == "answered":
        return got == want
    return got.kind == want.kind and want.text in got.text


async def refusal_mismatches(rpcs: Sequence[Rpc], out_of_scope: str) -> list[str]:
    """Call every RPC with every bad token and with a token scoped by `out_of_scope`; one line
    per outcome that was not the expected one."""
    problems: list[str] = []
    for rpc in rpcs:
        for case in TOKENS:
            got = await outcome_of(rpc.call(bearer(case.token(rpc.capability))))
            want = refused(case.code, case.text)
            if not _matches(got, want):
                problems.append(f"{rpc.name}, token {case.name}: got {got}; want {want}")
        if rpc.out_of_scope is not None:
            got = await outcome_of(rpc.call(bearer(scoped_token(out_of_scope))))
            if not _matches(got, rpc.out_of_scope):
                problems.append(
                    f"{rpc.name}, token out of scope: got {got}; want {rpc.out_of_scope}"
                )
    return problems


async def accepted_mismatches(rpcs: Sequence[Rpc], in_scope: str) -> list[str]:
    """Call every RPC with a token scoped by `in_scope`; one line per unexpected outcome."""
    problems: list[str] = []
    for rpc in rpcs:
        if rpc.in_scope is None:
            continue
        got = await outcome_of(rpc.call(bearer(scoped_token(in_scope))))
        if not _matches(got, rpc.in_scope):
            problems.append(f"{rpc.name}, token in scope: got {got}; want {rpc.in_scope}")
    return problems


def status_name(status: int) -> str:
    return str(pb.Status.Name(status))  # type: ignore[arg-type]
