"""The HTTP gateway: journals read with GET and appended with PUT, plus metrics and readiness.

Requests map onto the broker's gRPC API through an ordinary `JournalClient` (normally pointed
at the serving broker itself), so routing, proxying and authorization work exactly as for any
other client:

- ``GET /<journal>?offset=N&block=true|false`` is a Read, through a `ReroutingReader`: when a
  broker answers UNAVAILABLE (it died, or is starting) or that the route is stale, the cached
  route is dropped and the read re-dispatched, at most ``read_attempts_max`` times in a row,
  after a growing back-off, so that a gateway never keeps routing to a dead broker; a read
  broken off mid-body resumes where it stopped. The response (206) carries Gazette's
  headers: ``Content-Range: bytes <offset>-<MaxInt64>/<MaxInt64>`` (the offset the read resolved
  to: -1 resolves to the write head, a gap in the journal jumps forward), ``X-Write-Head``,
  ``X-Fragment-Name``, ``X-Fragment-Location`` (a signed URL, for persisted fragments),
  ``X-Fragment-Last-Modified`` and ``X-Route-Token``; the body streams content. A non-blocking
  read ends at the write head; a blocking one waits there for more, until the client goes away.
  A later offset jump ends the body (its bytes would not follow on), as in Gazette: the client
  continues from the offset it reached. A Read the broker ends early (its replica of the journal
  went away) is read on from where it stopped, so a non-blocking body reaches the write head
  (Gazette's gateway ends such a body short, as if complete). ``HEAD`` is the same without content.
- ``PUT /<journal>`` appends the request body as ONE transaction: it is streamed through an
  `Appender` (never held in memory), and commits only once the whole body has arrived. A client
  that disconnects, or a body over ``append_bytes_max``, rolls everything back. The answer (200)
  is JSON naming the committed span, with Gazette's ``X-Commit-Begin``, ``X-Commit-End``,
  ``X-Commit-SHA1-Sum`` and ``X-Write-Head`` headers.
- A refusal maps the broker's status to an HTTP code (``http_status_of``) and names the status
  in the text body (``JOURNAL_NOT_FOUND``); gRPC errors map likewise (``UNAUTHENTICATED`` 401,
  ``PERMISSION_DENIED`` 403, ...); malformed requests are 400 with the field named.
- The ``Authorization`` header of a request travels with its RPCs (see `broker.auth`), so a
  broker requiring tokens requires them of HTTP clients too.
- ``GET /debug/journals?selector=...``: the journals as JSON, each quorum journal with its
  quorum state (term, leader, electing or a blocked election), as `gazctl journals list`
  (``broker.http_journals``).
- ``/debug/metrics``: Prometheus text. ``/debug/ready``: 200 once the broker serves, 503 while
  it starts or stops (``ready``); its body then lists each fragment store the broker checks and
  its health (``store_health``: a store's error does not make the broker unready, since every
  broker shares the store).
- With ``start(..., tls=...)`` the gateway serves HTTPS (the broker's certificate, under
  ``gazette serve --tls-cert``), requiring client certificates when the TLS has a client CA;
  ``attach(..., tls=...)`` is what it dials an ``https://`` broker with.

Usage: ``gw = HttpGateway(ready=broker.is_ready); port = await gw.start(host, 0)``, then
``gw.attach(broker.endpoint)`` (journal requests get 503 until then; a `client` may also be
given to the constructor), and finally ``await gw.stop()`` (which closes the client).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from typing import Final

import grpc
import grpc.aio
from aiohttp import web
from google.protobuf import text_format
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from broker import auth, metrics
from broker.client.appender import Appender, validate_append_request
from broker.client.reader import (
    Chunk,
    DataLossError,
    FragmentContentError,
    ReadProtocolError,
    validate_read_request,
)
from broker.client.rerouting_reader import ReadEndedEarlyError, ReroutingReader
from broker.client.route_cache import ChannelPool, JournalClient
from broker.fragment.naming import content_name, digest_of_sum
from broker.http_journals import LISTING_PATH, journal_listing
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.protocol.selector import parse_selector
from broker.protocol.status import GazetteError, OffsetNotYetAvailableError
from broker.protocol.validate import ValidationError, at
from broker.quorum_shell.status import StatusDecodeError
from broker.tls import ClientTls, ServerTls

log = get_logger(__name__)

# Gazette's header names.
FRAGMENT_LAST_MODIFIED_HEADER: Final = "X-Fragment-Last-Modified"
FRAGMENT_LOCATION_HEADER: Final = "X-Fragment-Location"
FRAGMENT_NAME_HEADER: Final = "X-Fragment-Name"
ROUTE_TOKEN_HEADER: Final = "X-Route-Token"
WRITE_HEAD_HEADER: Final = "X-Write-Head"
COMMIT_BEGIN_HEADER: Final = "X-Commit-Begin"
COMMIT_END_HEADER: Final = "X-Commit-End"
COMMIT_SUM_HEADER: Final = "X-Commit-SHA1-Sum"

_MAX_INT64: Final = (1 << 63) - 1
# A PUT body is read (and appended) in pieces of at most this size: one gRPC message each.
body_chunk_bytes_default: Final = 256 << 10
# The largest PUT body appended; a larger one is refused with 413 and rolled back. One append
# holds the journal's pipeline while it streams, so very large ones belong to a native client.
append_bytes_max_default: Final = 1 << 30
# Consecutive failed Read RPCs of one GET (each re-dispatched after dropping the route it used)
# before the gateway answers with the last failure (with the back-off, about a second and a
# half: the serving broker itself re-routes reads it proxies meanwhile).
read_attempts_max_default: Final = 6
# How long stopping waits for requests in flight (blocking reads never finish by themselves).
shutdown_timeout_s_default: Final = 1.0

_STATUS_CODES: Final[dict[int, int]] = {
    pb.JOURNAL_NOT_FOUND: 404,
    pb.NO_JOURNAL_PRIMARY_BROKER: 503,
    pb.NOT_JOURNAL_PRIMARY_BROKER: 503,
    pb.NOT_JOURNAL_BROKER: 503,
    pb.INSUFFICIENT_JOURNAL_BROKERS: 503,
    pb.WRONG_ROUTE: 503,
    pb.SUSPENDED: 503,
    pb.FRAGMENT_STORE_UNHEALTHY: 503,
    pb.OFFSET_NOT_YET_AVAILABLE: 416,
    pb.NOT_ALLOWED: 403,
    pb.WRONG_APPEND_OFFSET: 409,
    pb.REGISTER_MISMATCH: 409,
    pb.ETCD_TRANSACTION_FAILED: 409,
    pb.PROPOSAL_MISMATCH: 409,
}
_GRPC_CODES: Final[dict[grpc.StatusCode, int]] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


def http_status_of(status: int) -> int:
    """The HTTP code answering a non-OK protocol.Status: 404 for an unknown journal, 503 for
    routing and assignment states the cluster converges out of (retry later), 416 for a
    non-blocking read at the write head, 409 for a failed precondition, 500 otherwise
    (INDEX_HAS_GREATER_OFFSET needs an operator)."""
    return _STATUS_CODES.get(status, 500)


def http_status_of_grpc(code: grpc.StatusCode) -> int:
    """The HTTP code answering a failed RPC (502 for errors a client cannot act on)."""
    return _GRPC_CODES.get(code, 502)


class _BodyTooLargeError(Exception):
    pass


def _text(status: int, text: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=text + "\n", headers=headers)


def _header_fields(header: pb.Header | None) -> dict[str, str]:
    if header is None or not header.route.members:
        return {}
    return {ROUTE_TOKEN_HEADER: text_format.MessageToString(header.route, as_one_line=True)}


def _read_fields(response: pb.ReadResponse) -> dict[str, str]:
    fields = _header_fields(response.header if response.HasField("header") else None)
    if response.HasField("fragment"):
        fragment = response.fragment
        fields[FRAGMENT_NAME_HEADER] = content_name(fragment)
        if fragment.mod_time:
            fields[FRAGMENT_LAST_MODIFIED_HEADER] = formatdate(fragment.mod_time, usegmt=True)
        if response.fragment_url:
            fields[FRAGMENT_LOCATION_HEADER] = response.fragment_url
        fields["Content-Range"] = f"bytes {response.offset}-{_MAX_INT64}/{_MAX_INT64}"
    if response.write_head:
        fields[WRITE_HEAD_HEADER] = str(response.write_head)
    return fields


def _parse_int(text: str, name: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise ValidationError(f"must be an integer (got {text!r})", name) from None
    if not -_MAX_INT64 - 1 <= value <= _MAX_INT64:
        raise ValidationError(f"must fit in 64 bits (got {text!r})", name)
    return value


_BOOLS: Final = {"1": True, "t": True, "true": True, "0": False, "f": False, "false": False}


def _parse_bool(text: str, name: str) -> bool:
    value = _BOOLS.get(text.lower())
    if value is None:
        raise ValidationError(f"must be true or false (got {text!r})", name)
    return value


def _query(request: web.Request, allowed: tuple[str, ...]) -> dict[str, str]:
    """The query parameters, each at most once and all known (as Gazette's gateway, which
    refuses unknown keys rather than ignore a misspelt one)."""
    query = request.rel_url.query
    out: dict[str, str] = {}
    for key in query:
        if key not in allowed:
            known = ", ".join(allowed) or "none"
            raise ValidationError(f"unknown parameter (known: {known})", "query", key)
        values = query.getall(key)
        if len(values) > 1:
            raise ValidationError(f"given {len(values)} times (expected once)", "query", key)
        out[key] = values[0]
    return out


def parse_read_request(request: web.Request) -> pb.ReadRequest:
    """The ReadRequest of a GET or HEAD, validated (ValidationError names the bad field)."""
    query = _query(request, ("offset", "block"))
    read = pb.ReadRequest(
        journal=request.match_info["journal"],
        offset=_parse_int(query.get("offset", "0"), "offset"),
        block=_parse_bool(query.get("block", "false"), "block"),
        metadata_only=request.method == "HEAD",
    )
    validate_read_request(read)
    return read


def parse_append_request(request: web.Request) -> pb.AppendRequest:
    """The AppendRequest of a PUT, validated."""
    _query(request, ())
    append = pb.AppendRequest(journal=request.match_info["journal"])
    validate_append_request(append)
    return append


class HttpGateway:
    """See the module docstring. `ready` answers /debug/ready; `registry` is what
    /debug/metrics exposes."""

    def __init__(
        self,
        client: JournalClient | None = None,
        *,
        ready: Callable[[], bool] = lambda: True,
        store_health: Callable[[], list[tuple[str, str | None]]] = list,
        registry: CollectorRegistry = REGISTRY,
        append_bytes_max: int = append_bytes_max_default,
        body_chunk_bytes: int = body_chunk_bytes_default,
        shutdown_timeout_s: float = shutdown_timeout_s_default,
        read_attempts_max: int = read_attempts_max_default,
    ) -> None:
        if append_bytes_max < 0 or body_chunk_bytes < 1 or read_attempts_max < 1:
            raise ValueError(
                "append_bytes_max: must be >= 0; body_chunk_bytes, read_attempts_max: must be >= 1"
            )
        self._read_attempts_max = read_attempts_max
        self.client = client
        self._ready = ready
        self._store_health = store_health
        self._registry = registry
        self._append_bytes_max = append_bytes_max
        self._body_chunk_bytes = body_chunk_bytes
        self._shutdown_timeout_s = shutdown_timeout_s
        self.app = web.Application(middlewares=[_count_requests])
        self.app.router.add_get("/debug/metrics", self._metrics)
        self.app.router.add_get("/debug/ready", self._readiness)
        self.app.router.add_get(LISTING_PATH, self._list_journals)
        self.app.router.add_route("*", "/{journal:.+}", self._journal)
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, host: str, port: int, *, tls: ServerTls | None = None) -> int:
        """Listen on host:port (0: a free port), HTTPS with `tls` (and, if it has a client CA,
        requiring client certificates); return the bound port."""
        if self._runner is not None:
            raise RuntimeError("gateway already started")
        # handler_cancellation: a client that goes away cancels its request, which closes a
        # blocking read's RPC and rolls back a PUT whose body was cut short.
        runner = web.AppRunner(
            self.app,
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=self._shutdown_timeout_s,
        )
        await runner.setup()
        try:
            context = tls.ssl_context() if tls is not None else None
            await web.TCPSite(runner, host, port, ssl_context=context).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        return self.port

    def attach(self, endpoint: str, *, tls: ClientTls | None = None) -> JournalClient:
        """Serve journals through a new client of the broker at `endpoint`, which passes the
        Authorization header of each HTTP request on with the RPCs it causes; `tls` is what
        it dials https:// brokers with."""
        forwarding = auth.client_interceptors(auth.ForwardingAuthorizer())
        channels = ChannelPool(interceptors=forwarding, tls=tls)
        self.client = JournalClient(endpoint, channels=channels)
        return self.client

    async def stop(self) -> None:
        """Stop listening (requests in flight get `shutdown_timeout_s`, then are cancelled),
        and close the client."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        if self.client is not None:
            await self.client.close()

    # --- Debug endpoints ---

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _readiness(self, request: web.Request) -> web.Response:
        stores = "".join(
            f"\nfragment store {url}: " + ("healthy" if error is None else f"unhealthy: {error}")
            for url, error in self._store_health()
        )
        if self._ready():
            return _text(200, "ready" + stores)
        return _text(503, "not ready: the broker is starting or stopping" + stores)

    async def _list_journals(self, request: web.Request) -> web.Response:
        client = self.client
        if client is None:
            return _text(503, "not ready: the broker is starting")
        try:
            query = _query(request, ("selector",))
            with at("selector"):
                selector = parse_selector(query.get("selector", ""))
        except ValidationError as err:
            return _text(400, str(err))
        token = auth.forward_authorization(request.headers.get("Authorization"))
        try:
            listing = await journal_listing(client, selector)
        except GazetteError as err:
            return _failed(err.status, {})
        except StatusDecodeError as err:
            log.warning("http gateway: quorum status answer rejected", error=str(err))
            return _text(502, f"bad answer from the broker: {err}")
        except BaseException as err:
            if (failed := _rpc_failure(err)) is None:
                raise
            return failed
        finally:
            auth.forwarded_authorization.reset(token)
        return web.json_response(listing, dumps=json.dumps)

    # --- Journals ---

    async def _journal(self, request: web.Request) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD", "PUT"):
            return _text(405, f"unknown method {request.method}", {"Allow": "GET, HEAD, PUT"})
        client = self.client
        if client is None:
            return _text(503, "not ready: the broker is starting")
        try:
            if request.method == "PUT":
                append = parse_append_request(request)
            else:
                read = parse_read_request(request)
        except ValidationError as err:
            return _text(400, str(err))
        # Whatever authorization the HTTP client presented goes with the RPCs it causes.
        token = auth.forward_authorization(request.headers.get("Authorization"))
        try:
            if request.method == "PUT":
                return await self._append(request, client, append)
            return await self._read(request, client, read)
        finally:
            auth.forwarded_authorization.reset(token)

    async def _read(
        self, request: web.Request, client: JournalClient, read: pb.ReadRequest
    ) -> web.StreamResponse:
        reader = ReroutingReader(client, read, attempts_max=self._read_attempts_max)
        try:
            first = await reader.read_chunk()
        except OffsetNotYetAvailableError:
            await reader.close()
            return _failed(pb.OFFSET_NOT_YET_AVAILABLE, _read_fields(reader.response))
        except GazetteError as err:
            await reader.close()
            return _failed(err.status, _read_fields(reader.response))
        except BaseException as err:
            await reader.close()
            if (failed := _rpc_failure(err)) is None:
                raise
            return failed
        try:
            response = web.StreamResponse(status=206, headers=_read_fields(reader.response))
            response.content_type = "application/octet-stream"
            await response.prepare(request)
            if await self._stream(request, reader, first, response):
                await response.write_eof()
            return response
        finally:
            await reader.close()

    async def _stream(
        self,
        request: web.Request,
        reader: ReroutingReader,
        chunk: Chunk,
        response: web.StreamResponse,
    ) -> bool:
        """Copy content to the response; False if it broke off on an error (the connection
        is then closed without the final chunk, so that the client sees the body cut)."""
        expected = chunk.offset
        try:
            while chunk.content and chunk.offset == expected:
                await response.write(chunk.content)
                expected += len(chunk.content)
                chunk = await reader.read_chunk()
        except OffsetNotYetAvailableError:
            pass  # A non-blocking read reached the write head: the body is complete.
        except ConnectionError:
            return False  # The client went away.
        except (
            GazetteError,
            grpc.aio.AioRpcError,
            ReadProtocolError,
            FragmentContentError,
            DataLossError,
            ReadEndedEarlyError,
        ) as err:
            log.warning("http gateway: read broke off", journal=reader.request.journal, error=err)
            if request.transport is not None:
                request.transport.close()
            return False
        return True

    async def _append(
        self, request: web.Request, client: JournalClient, append: pb.AppendRequest
    ) -> web.Response:
        appender = Appender(client, append, chunk_bytes_max=self._body_chunk_bytes)
        try:
            commit = await self._stream_body(request, appender)
        except _BodyTooLargeError:
            return _text(413, f"request body: must be at most {self._append_bytes_max} bytes")
        except GazetteError as err:
            fields = _header_fields(appender.response.header if appender.response else None)
            return _failed(err.status, fields)
        except BaseException as err:
            if (failed := _rpc_failure(err)) is None:
                raise
            return failed
        fields = _header_fields(appender.response.header if appender.response else None)
        digest = digest_of_sum(commit.sum).hex()
        fields.update(
            {
                COMMIT_BEGIN_HEADER: str(commit.begin),
                COMMIT_END_HEADER: str(commit.end),
                COMMIT_SUM_HEADER: digest,
                WRITE_HEAD_HEADER: str(commit.end),
            }
        )
        body = {
            "status": "OK",
            "journal": commit.journal,
            "begin": commit.begin,
            "end": commit.end,
            "sha1": digest,
        }
        return web.json_response(body, headers=fields, dumps=json.dumps)

    async def _stream_body(self, request: web.Request, appender: Appender) -> pb.Fragment:
        """Append the request body through `appender` and commit; on any failure (the client
        went away, the body is too large, the broker refused) the append is rolled back."""
        total = 0
        try:
            async for data in request.content.iter_chunked(self._body_chunk_bytes):
                total += len(data)
                if total > self._append_bytes_max:
                    raise _BodyTooLargeError()
                await appender.write(data)
            return await appender.commit()
        except BaseException:
            await appender.abort()
            raise


def _failed(status: int, fields: dict[str, str]) -> web.Response:
    return _text(http_status_of(status), pb.Status.Name(status), fields)


def _rpc_failure(err: BaseException) -> web.Response | None:
    """The answer to an RPC that failed outright, or None if `err` is not such a failure."""
    if isinstance(err, DataLossError):  # Lost or corrupt content: an operator must look.
        return _text(500, f"DATA_LOSS: {err}")
    if isinstance(err, grpc.aio.AioRpcError):
        code = err.code()
        headers = {"WWW-Authenticate": "Bearer"} if code == grpc.StatusCode.UNAUTHENTICATED else {}
        return _text(http_status_of_grpc(code), f"{code.name}: {err.details()}", headers)
    if isinstance(err, ReadEndedEarlyError):  # The journal's replicas kept going away.
        return _text(503, f"UNAVAILABLE: {err}")
    if isinstance(err, ReadProtocolError | FragmentContentError | ValidationError):
        log.warning("http gateway: broker answer rejected", error=str(err))
        return _text(502, f"bad answer from the broker: {err}")
    return None


@web.middleware
async def _count_requests(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    response = await handler(request)
    metrics.HTTP_REQUESTS.labels(request.method, str(response.status)).inc()
    return response
