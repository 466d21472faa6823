"""Calling a consumer's Shard service: List, Apply, Unassign, Stat and GetHints.

Any consumer process of a group answers every request (Stat is proxied to the shard's primary),
so a client talks to one endpoint. Non-OK statuses raise their typed ``ShardStatusError``
subclasses (``ShardNotFoundError``, ``ShardEtcdTransactionFailedError``, ...), and a request the
consumer refuses as malformed raises ``ShardRequestError`` with the consumer's explanation.

    async with ShardClient("127.0.0.1:9000") as shards:
        listing = await shards.list_shards("app.gazette.dev/tag=counts")
        await shards.apply([upsert(spec)])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Final

import grpc
import grpc.aio

from broker.auth import client_interceptors_from_env
from broker.client.route_cache import ChannelPool
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import consumer_pb2_grpc as cpbg
from broker.protocol import protocol_pb2 as pb
from broker.protocol.selector import parse_selector
from broker.protocol.status import raise_for_shard_status
from broker.protocol.validate import ValidationError
from broker.tls import client_tls_from_env

# Shard RPCs are short unary exchanges, except a Stat that waits for read-through offsets.
rpc_timeout_s_default: Final = 60.0


class ShardRequestError(ValidationError):
    """The consumer refused a request as malformed (INVALID_ARGUMENT); nothing was changed."""


def upsert(spec: cpb.ShardSpec, expect_mod_revision: int = 0) -> cpb.ApplyRequest.Change:
    """A change creating (expect_mod_revision 0) or updating (its current mod revision, or -1
    for no check) ``spec``."""
    return cpb.ApplyRequest.Change(upsert=spec, expect_mod_revision=expect_mod_revision)


def delete(shard: str, expect_mod_revision: int = -1) -> cpb.ApplyRequest.Change:
    """A change deleting ``shard`` (-1: whatever its revision)."""
    return cpb.ApplyRequest.Change(delete=shard, expect_mod_revision=expect_mod_revision)


class ShardClient:
    """A client of one consumer endpoint (``host:port``, ``http://host:port`` or, for a
    consumer serving TLS, ``https://host:port``). ``channels`` authorize and secure its calls;
    by default, as the environment says (``GAZETTE_AUTH_TOKEN`` or ``GAZETTE_AUTH_KEYS``;
    ``GAZETTE_TLS_CA``, ``GAZETTE_TLS_CERT`` and ``GAZETTE_TLS_KEY``), as JournalClient's."""

    def __init__(
        self,
        endpoint: str,
        *,
        timeout_s: float = rpc_timeout_s_default,
        channels: ChannelPool | None = None,
    ) -> None:
        if channels is None:
            channels = ChannelPool(
                channels_max=1,
                interceptors=client_interceptors_from_env(),
                tls=client_tls_from_env(),
            )
        self._channels = channels
        self._endpoint = endpoint
        self._timeout_s = timeout_s

    async def __aenter__(self) -> ShardClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channels.close()

    def stub(self) -> cpbg.ShardStub:
        return cpbg.ShardStub(self._channels.get(self._endpoint))  # type: ignore[no-untyped-call]

    async def list_shards(self, selector: pb.LabelSelector | str | None = None) -> cpb.ListResponse:
        """The shards matching ``selector`` (a LabelSelector or its string form; None: all)."""
        if isinstance(selector, str):
            selector = parse_selector(selector)
        request = cpb.ListRequest(selector=selector or pb.LabelSelector())
        response: cpb.ListResponse = await _call(self.stub().List, request, self._timeout_s)
        raise_for_shard_status(response.status, "listing shards")
        return response

    async def apply(
        self, changes: cpb.ApplyRequest | Iterable[cpb.ApplyRequest.Change]
    ) -> cpb.ApplyResponse:
        """Apply ``changes`` in one etcd transaction."""
        request = (
            changes
            if isinstance(changes, cpb.ApplyRequest)
            else cpb.ApplyRequest(changes=list(changes))
        )
        response: cpb.ApplyResponse = await _call(self.stub().Apply, request, self._timeout_s)
        raise_for_shard_status(response.status, "applying shard changes")
        return response

    async def unassign(
        self, shards: Iterable[str], *, only_failed: bool = False, dry_run: bool = False
    ) -> list[str]:
        """Remove the assignments of ``shards`` (their primaries', and failed ones; only the
        failed ones with ``only_failed``); the shards that had some. ``dry_run`` only tells."""
        request = cpb.UnassignRequest(shards=list(shards), only_failed=only_failed, dry_run=dry_run)
        response: cpb.UnassignResponse = await _call(self.stub().Unassign, request, self._timeout_s)
        raise_for_shard_status(response.status, f"unassigning {', '.join(request.shards)}")
        return list(response.shards)

    async def stat(
        self, shard: str, read_through: Mapping[str, int] | None = None
    ) -> cpb.StatResponse:
        """The shard's progress, once it has read through ``read_through`` (journal → offset)."""
        request = cpb.StatRequest(shard=shard, read_through=dict(read_through or {}))
        response: cpb.StatResponse = await _call(self.stub().Stat, request, self._timeout_s)
        raise_for_shard_status(response.status, f"stat of shard {shard}")
        return response

    async def get_hints(self, shard: str) -> cpb.GetHintsResponse:
        request = cpb.GetHintsRequest(shard=shard)
        response: cpb.GetHintsResponse = await _call(self.stub().GetHints, request, self._timeout_s)
        raise_for_shard_status(response.status, f"hints of shard {shard}")
        return response


async def _call(method: Any, request: object, timeout_s: float) -> Any:
    try:
        return await method(request, timeout=timeout_s)
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
            raise ShardRequestError(err.details() or "invalid request") from None
        raise
