"""Queries of the word counts, served by the consumer processes themselves (Gazette's word-count
example serves its n-gram counts the same way).

``WordCount.register_services`` adds the gRPC method ``/examples.word_count.Counts/Query`` to
every consumer process (``gazette-consumer serve`` calls it). A request names a shard and words;
any process answers it: it resolves the shard (``ServiceContext.resolver``) and, if the shard's
primary runs here, reads the counts its store last *committed*; otherwise it proxies the request
to the primary's process, attaching the resolution's header, which the primary checks (same
etcd cluster, addressed to it) and never proxies again. A shard without a primary, or unknown,
is answered with that status (``NO_SHARD_PRIMARY``, ``SHARD_NOT_FOUND``), as Gazette's shard
APIs do.

Messages are JSON (no proto to compile for an example):

    request   {"shard": "word-count-000", "words": ["gazette", "go"], "header": "<base64>"?}
    response  {"status": "OK", "counts": {"gazette": 3, "go": 0}}

    counts = await query_counts("127.0.0.1:9000", "word-count-000", ["gazette", "go"])
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from broker.protocol import consumer_pb2 as cpb
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import raise_for_shard_status
from broker.protocol.validate import ValidationError, validate_shard_id
from gazette_consumer.application import ServiceContext
from gazette_consumer.local_shards import LocalShardsStoppedError
from gazette_consumer.resolver import ResolveError
from gazette_consumer.stores.jsonfile import STATE_FILE

if TYPE_CHECKING:
    from examples.word_count.app import WordCount

SERVICE: Final = "examples.word_count.Counts"
QUERY: Final = f"/{SERVICE}/Query"
# Words one query may ask about.
query_words_max: Final = 1000
# A query's request (JSON) may be at most this large.
query_request_bytes_max: Final = 1 << 20
# How long a query waits for its shard's primary to be ready (gRPC deadlines usually cut first).
query_wait_s: Final = 30.0


class QueryError(ValidationError):
    """A malformed query (INVALID_ARGUMENT); the message names the field."""


def encode_request(shard: str, words: list[str], header: pb.Header | None = None) -> bytes:
    request: dict[str, Any] = {"shard": shard, "words": words}
    if header is not None:
        request["header"] = base64.b64encode(header.SerializeToString()).decode()
    return json.dumps(request).encode()


def decode_request(data: bytes) -> tuple[str, list[str], pb.Header | None]:
    if len(data) > query_request_bytes_max:
        raise QueryError(f"must be at most {query_request_bytes_max} bytes (got {len(data)})")
    try:
        request = json.loads(data)
    except ValueError as err:
        raise QueryError(f"not JSON: {err}") from None
    if not isinstance(request, dict):
        raise QueryError("must be a JSON object")
    shard, words = request.get("shard"), request.get("words", [])
    if not isinstance(shard, str):
        raise QueryError("must be a string", "shard")
    validate_shard_id(shard)
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise QueryError("must be a list of strings", "words")
    if len(words) > query_words_max:
        raise QueryError(f"must hold at most {query_words_max} words (got {len(words)})", "words")
    header = None
    if "header" in request:
        try:
            header = pb.Header.FromString(base64.b64decode(request["header"], validate=True))
        except (TypeError, binascii.Error, DecodeError) as err:
            raise QueryError(f"not a base64 protocol.Header: {err}", "header") from None
    return shard, [w.lower() for w in words], header


async def committed_counts(directory: Path) -> dict[str, int]:
    """The counts of the document the store last committed (none before its first commit)."""
    path = directory / STATE_FILE
    try:
        data = await asyncio.to_thread(path.read_bytes)
    except FileNotFoundError:
        return {}
    return dict(json.loads(data)["state"].get("counts", {}))


class CountsService:
    """The Query method of one consumer process (see the module docstring)."""

    def __init__(self, app: WordCount, context: ServiceContext) -> None:
        self._app = app
        self._context = context

    def register(self, server: grpc.aio.Server) -> None:
        handler = grpc.unary_unary_rpc_method_handler(self.query)  # Bytes in, bytes out.
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {"Query": handler}),)
        )

    async def query(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            shard, words, header = decode_request(data)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"query: {err}")
        try:
            # A request proxied by a peer (it carries the peer's header) is not proxied again.
            resolution = await self._context.resolver.resolve(
                shard, may_proxy=header is None, proxy_header=header, wait_s=query_wait_s
            )
        except ResolveError as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"query: {err}")
        except (TimeoutError, LocalShardsStoppedError) as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"query of {shard}: {err}")
        if resolution.status != cpb.OK:
            return json.dumps({"status": cpb.Status.Name(resolution.status)}).encode()
        if not resolution.is_local:
            route = resolution.header.route
            endpoint = route.endpoints[route.primary]
            call = self._context.channels.get(endpoint).unary_unary(QUERY)
            try:
                answer: bytes = await call(encode_request(shard, words, resolution.header))
            except grpc.aio.AioRpcError as err:
                await context.abort(err.code(), f"query via {endpoint}: {err.details()}")
            return answer
        store = self._app.store_of(shard)
        counts = await committed_counts(store.directory)
        return json.dumps({"status": "OK", "counts": {w: counts.get(w, 0) for w in words}}).encode()


async def query_counts(endpoint: str, shard: str, words: list[str]) -> dict[str, int]:
    """Ask the consumer process at ``endpoint`` (any of them) for ``shard``'s committed counts
    of ``words``. Raises the shard status's error (ShardNotFoundError, ...) if not OK."""
    target = endpoint.removeprefix("http://")
    async with grpc.aio.insecure_channel(target) as channel:
        answer = json.loads(await channel.unary_unary(QUERY)(encode_request(shard, words)))
    raise_for_shard_status(cpb.Status.Value(answer["status"]), f"query of shard {shard}")
    return dict(answer["counts"])
