"""etcd's errors as KeySpaceErrors: which failures are the transport's (retried elsewhere or
later) and which are etcd's answer, told apart by status and by etcd's message text.

Used by EtcdBackend (broker/keyspace/etcd.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import grpc
import grpc.aio

from broker.grpc_transport import send_failed
from broker.keyspace import backend as b

unavailable_codes = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# etcd's answers to a token it no longer accepts (rpctypes): authenticate again, and re-send.
stale_token_errors = ("invalid auth token", "revision of auth store is old")
# etcd's answer to a write once its database reached its quota (rpctypes.ErrGRPCNoSpace,
# RESOURCE_EXHAUSTED): the NOSPACE alarm is raised and stays until an operator disarms it.
no_space_error = "database space exceeded"


def failure_line(err: b.KeySpaceError, endpoints: Sequence[str]) -> str:
    """One line for a process ending on a keyspace error (etcd unreachable at start-up, most
    often): the --etcd endpoints, the error, and for an unreachable etcd what to check."""
    if not endpoints:
        return f"keyspace: {err}"
    where = "--etcd " + ",".join(endpoints)
    text = " ".join(str(err).split())
    if isinstance(err, b.UnavailableError):
        return (
            f"cannot reach etcd at {where}: {text} (is etcd running there? check --etcd and"
            " any --etcd-ca/--etcd-cert/--etcd-user)"
        )
    return f"etcd at {where}: {text}"


class EtcdAuthError(b.KeySpaceError):
    """etcd refused our user and password (or requires them and we have none)."""


class EtcdError(b.KeySpaceError):
    """An etcd error with no more specific KeySpaceError (e.g. an invalid request)."""

    def __init__(self, rpc: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"etcd {rpc}: {code.name}: {details}")
        self.code = code
        self.details = details


async def translate(
    rpc: str,
    err: grpc.aio.AioRpcError,
    lease: int,
    revision: int,
    *,
    with_user: bool,
    compact_revision: Callable[[], Awaitable[int]],
) -> b.KeySpaceError:
    """The KeySpaceError for a non-UNAVAILABLE etcd error status. etcd's statuses are
    coarse (OUT_OF_RANGE covers both compaction and future revisions), so the message text,
    which etcd keeps stable as API (rpctypes), tells them apart."""
    details = err.details() or ""
    if any(text in details for text in ("user name is empty", "permission denied",
                                        *stale_token_errors)):  # fmt: skip
        hint = "" if with_user else " (this etcd requires a user: --etcd-user)"
        return EtcdAuthError(f"etcd {rpc}: {err.code().name}: {details}{hint}")
    if "lease not found" in details:
        return b.LeaseNotFoundError(lease)
    if "future revision" in details:
        return b.FutureRevisionError(f"etcd {rpc}: revision {revision}: {details}")
    if "has been compacted" in details:
        return b.CompactedError(revision, await compact_revision())
    if no_space_error in details:
        return b.NoSpaceError(rpc, details)
    return EtcdError(rpc, err.code(), details)


def transport_failed(err: grpc.aio.AioRpcError) -> bool:
    """Whether ``err`` is the transport's failure (retried elsewhere or later), not etcd's
    answer."""
    # send_failed: e.g. the first message of a Watch or LeaseKeepAlive stream opened on a
    # connection that just broke (etcd restarting); etcd itself never answers that.
    return err.code() in unavailable_codes or send_failed(err)


def describe(err: grpc.aio.AioRpcError) -> str:
    return f"{err.code().name}: {err.details()}"
