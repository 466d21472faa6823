"""The etcd transaction of an Apply RPC (journals here, shards in gazette_consumer): run it, map
etcd's refusals to the status a client can act on, and wait until the local mirror shows it.

- etcd out of space: RESOURCE_EXHAUSTED (nothing written; a retry is refused alike until an
  operator compacts, defragments or raises the quota, which the message says);
- etcd unreachable or failing: UNAVAILABLE (nothing written that the client knows of: it retries
  under its expectation of the specs' revisions);
- any other refusal of the request itself: INVALID_ARGUMENT;
- applied, but the mirror did not reach the revision in time: UNAVAILABLE, naming the revision.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from broker.keyspace.backend import (
    Backend,
    BackendFailedError,
    Compare,
    KeySpaceError,
    NoSpaceError,
    OpDelete,
    OpPut,
    UnavailableError,
)
from broker.keyspace.keyspace import KeySpace
from broker.read_resolve import Context


async def apply_txn(
    backend: Backend,
    ks: KeySpace[Any],
    compares: Sequence[Compare],
    ops: Sequence[OpPut | OpDelete],
    context: Context,
    *,
    revision_wait_s: float,
    viewer: str,
) -> tuple[bool, int]:
    """Whether the guarded transaction applied, and etcd's revision after it; aborts the RPC
    as the module docstring says. `viewer` names the process in the catch-up message."""
    try:
        txn = await backend.txn(compares, ops)
    except NoSpaceError as err:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"etcd transaction: {err}")
    except (UnavailableError, BackendFailedError) as err:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"etcd transaction: {err}")
    except KeySpaceError as err:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"etcd transaction: {err}")
    revision = txn.header.revision
    if txn.succeeded and ops:
        try:
            await ks.wait_for_revision(revision, revision_wait_s)
        except (TimeoutError, KeySpaceError) as err:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"applied at revision {revision}, but {viewer}'s view of etcd did not catch up:"
                f" {err}",
            )
    return txn.succeeded, revision
