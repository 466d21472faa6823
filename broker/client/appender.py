"""Appender: one Append RPC, streamed in chunks, committed on close.

An append is a transaction: everything written to one Appender lands in the journal together,
contiguously, or none of it does. The first write starts the RPC at the journal's primary (as
far as the route cache knows; any broker proxies it otherwise) by sending the request's
metadata; each write then streams content in chunks of at most `chunk_bytes_max`; `commit`
sends the empty chunk that asks the broker to commit, and returns the committed span of the
journal (`AppendResponse.commit`). `abort` (or any exception inside `async with`) cancels the
RPC, which the broker rolls back.

A non-OK status raises its typed error (`WrongAppendOffsetError`, `RegisterMismatchError`,
`NotJournalPrimaryBrokerError`, ...), with the broker's response kept in `response`.

Brokers come and go (a graceful exit hands journals to other brokers, a crash fails them over),
so a remembered primary may be unreachable. An Appender whose first message cannot reach the
cached primary starts over at the client's default endpoint, which proxies to whichever broker
serves the journal now: nothing was sent yet, so this is always safe. Content already streamed is
not buffered, so a failure after that is the caller's to handle.

`append()` wraps a whole append of in-memory content with retries of the failures that leave
nothing behind: an unreachable broker, or a stale route (the broker answered a status, having
committed nothing). An unreachable broker also makes it forget the journal's route, so that the
next attempt goes through the default endpoint. (As in Gazette, a commit whose response is lost
to a broken connection may then be appended twice: callers that need exactly-once use `offset`
or registers to make a retry conditional.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Final

import grpc
import grpc.aio
from grpc._cython import cygrpc

from broker.client.route_cache import JournalClient
from broker.grpc_transport import close_stream_call, send_failed
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.protocol.content_wire import encode_append_content, passthrough_serializer
from broker.protocol.status import GazetteError, StatusError, raise_for_status
from broker.protocol.validate import ValidationError, at, validate_journal_name, validate_label_set

log = get_logger(__name__)

# Content is sent in messages of at most this size: large enough that per-message overhead is
# negligible (docs/architecture.md, "Physical limits": ~680 MB/s at 1 MiB), well under gRPC's
# message limits.
chunk_bytes_max_default: Final = 1 << 20
# Attempts of `append()` (the first included) before the last error is raised.
attempts_max_default: Final = 10
# Back-off between attempts of `append()`: doubling from the initial delay, capped.
backoff_initial_s: Final = 0.05
backoff_max_s: Final = 5.0
# How long a failed write waits for the call's status: the broker's answer (a refusal, say),
# which explains the failure better than the transport's view of the write.
answer_wait_s: Final = 5.0


_APPEND_METHOD: Final = "/protocol.Journal/Append"
_APPEND_SERIALIZER: Final = passthrough_serializer(pb.AppendRequest.SerializeToString)


def _open_append(channel: grpc.aio.Channel) -> Any:
    """Start an Append RPC on `channel` that sends AppendRequests, and also bytes as they are:
    content chunks encoded by `encode_append_content`. Returns a grpc.aio.StreamUnaryCall."""
    return channel.stream_unary(
        _APPEND_METHOD,
        request_serializer=_APPEND_SERIALIZER,
        response_deserializer=pb.AppendResponse.FromString,
    )()


class AppenderStateError(RuntimeError):
    """The Appender was used after it committed or aborted."""


class AppendCallBrokenError(ConnectionError):
    """The Append RPC broke as its request side was closed, and gave no answer in time: the
    broker went away (the append may have committed, as after UNAVAILABLE). Retriable."""

    def __init__(self, journal: str, cause: BaseException) -> None:
        detail = str(cause) or type(cause).__name__
        super().__init__(f"appending to {journal}: the Append call broke as it closed: {detail}")
        self.journal = journal


def validate_append_request(request: pb.AppendRequest) -> None:
    """The metadata of an append (the first message of the RPC), with the field named."""
    with at("journal"):
        validate_journal_name(request.journal)
    if request.offset < 0:
        raise ValidationError(f"must be >= 0 (got {request.offset})", "offset")
    if request.content:
        raise ValidationError("must be empty in the request metadata (write it instead)", "content")
    for name in ("union_registers", "subtract_registers"):
        if request.HasField(name):
            with at(name):
                validate_label_set(getattr(request, name))
    if request.HasField("check_registers"):
        with at("check_registers"):
            validate_label_set(request.check_registers.include, in_selector=True)
            validate_label_set(request.check_registers.exclude, in_selector=True)


class Appender:
    """See the module docstring. Use once: write, then commit or abort."""

    def __init__(
        self,
        client: JournalClient,
        request: pb.AppendRequest,
        *,
        chunk_bytes_max: int = chunk_bytes_max_default,
    ) -> None:
        if chunk_bytes_max < 1:
            raise ValueError(f"chunk_bytes_max: must be >= 1 (got {chunk_bytes_max})")
        validate_append_request(request)
        self.client = client
        self.request = pb.AppendRequest()
        self.request.CopyFrom(request)
        self.response: pb.AppendResponse | None = None
        self.bytes_written = 0
        self._chunk_bytes_max = chunk_bytes_max
        self._call: Any = None  # grpc.aio.StreamUnaryCall; the generated stubs are untyped.
        self._finished = False

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Stream `data` as part of the append (it commits only with `commit`)."""
        self._check_usable()
        view = memoryview(data).cast("B")
        if not view:
            return  # An empty chunk means "commit" on the wire: never send one by accident.
        try:
            await self._start()
            for start in range(0, len(view), self._chunk_bytes_max):
                piece = view[start : start + self._chunk_bytes_max]
                # Encoded straight from the caller's buffer: one copy, not three.
                await self._send(encode_append_content(piece))
                self.bytes_written += len(piece)
        except BaseException:
            # A failed write leaves the append unusable: roll it back now.
            self._finished = True
            await self._cancel()
            raise

    async def commit(self) -> pb.Fragment:
        """Commit everything written; return the journal span it landed in. Raises the typed
        status error if the broker refused (nothing was appended then)."""
        self._check_usable()
        self._finished = True
        try:
            await self._start()
            await self._send(pb.AppendRequest())  # The empty chunk: commit.
            await self._half_close()
            response = await self._call
        except BaseException:
            await self._cancel()
            raise
        return self._on_response(response).commit

    close = commit

    async def abort(self) -> None:
        """Roll the append back (nothing written is appended). Idempotent."""
        self._finished = True
        await self._cancel()

    async def _start(self) -> None:
        if self._call is not None:
            return
        journal = self.request.journal
        endpoint = self.client.endpoint_for(journal, require_primary=True)
        self._call = _open_append(self.client.channels.get(endpoint))
        if endpoint == self.client.default_endpoint():
            await self._send(self.request)
            return
        try:
            await self._call.write(self.request)
            return
        except (asyncio.InvalidStateError, grpc.aio.AioRpcError) as err:
            if not await self._settled() or await self._call.code() != grpc.StatusCode.UNAVAILABLE:
                await self._raise_answer(err)
        # The cached primary is unreachable (it exited, or crashed). Nothing was sent, so start
        # over at the default endpoint, which proxies to whoever serves the journal now, and
        # whose answer teaches the new route.
        log.info("append: cached primary unreachable; using the default broker", journal=journal)
        self.client.update_route(journal, None)
        await self._cancel()
        self._call = _open_append(self.client.channels.get(self.client.default_endpoint()))
        await self._send(self.request)

    async def _half_close(self) -> None:
        """Close the request side after the commit chunk. grpc lets its core's failure to do
        so on a call that is ending escape raw (`cygrpc.ExecuteBatchError`: seen in the soak
        when two brokers were killed at once), which no retry policy knows: the call's own
        answer (awaited next: its status, typed) then says what happened, or, with none in
        time, AppendCallBrokenError (retriable)."""
        try:
            await self._call.done_writing()
        except (asyncio.InvalidStateError, grpc.aio.AioRpcError, cygrpc.BaseError) as err:
            if not await self._settled():
                raise AppendCallBrokenError(self.request.journal, err) from err

    async def _send(self, message: pb.AppendRequest | bytes) -> None:
        try:
            await self._call.write(message)
        except (asyncio.InvalidStateError, grpc.aio.AioRpcError) as err:
            await self._raise_answer(err)

    async def _settled(self) -> bool:
        """Whether the call ends within ``answer_wait_s``. A write fails because the call is
        ending, but its status may arrive a moment after the failed write returns."""
        try:
            async with asyncio.timeout(answer_wait_s):
                await self._call.code()
        except TimeoutError:
            return False
        return True

    async def _raise_answer(self, err: Exception) -> None:
        """Raise why writing to the call failed (``err``). If the broker answered (it refuses
        the append: not the primary, no permission...), its response or gRPC error says why."""
        if not await self._settled():
            raise err
        self._finished = True
        self._on_response(await self._call)
        raise err  # An OK response before the commit is a broker bug; do not hide it.

    def _on_response(self, response: pb.AppendResponse) -> pb.AppendResponse:
        self.response = response
        if response.HasField("header"):
            self.client.update_route(self.request.journal, response.header)
        detail = f" ({response.store_health_error})" if response.store_health_error else ""
        raise_for_status(response.status, f"appending to {self.request.journal}{detail}")
        if not response.HasField("commit"):
            raise ValidationError("expected with status OK", "AppendResponse", "commit")
        return response

    async def _cancel(self) -> None:
        # Also when the broker already ended the call: its request side must still be finished.
        call, self._call = self._call, None
        if call is not None:
            await close_stream_call(call)

    def _check_usable(self) -> None:
        if self._finished:
            raise AppenderStateError("appender already committed or aborted")

    async def __aenter__(self) -> Appender:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            await self.abort()
        elif not self._finished:
            await self.commit()


# gRPC codes of an append attempt that `append` tries again.
_RETRIED_GRPC_CODES: Final = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})


_MAYBE_LANDED: Final = "gazette_append_maybe_landed"


def maybe_landed(err: BaseException) -> bool:
    """Whether an append that `append()` gave up on with `err` may have been appended all the
    same: an attempt of it ended without a broker's answer (a lost response, a broken call),
    and may have committed first, whatever the attempts after it were told. False only when
    every attempt was refused by a broker's status, which appends nothing."""
    return bool(getattr(err, _MAYBE_LANDED, not isinstance(err, StatusError)))


def retriable(err: BaseException) -> bool:
    """Whether `append` tries a failed attempt again: the broker says so, or it was
    unreachable (or the connection to it broke)."""
    if isinstance(err, GazetteError):
        return err.retriable
    if isinstance(err, AppendCallBrokenError):
        return True  # The broker went away as the call closed: as UNAVAILABLE.
    if isinstance(err, grpc.aio.AioRpcError):
        # A broken connection (broker killed or restarting) shows as either; a broker that
        # stops at once (its lease lost: `server.stop(0)`) cancels the RPCs it serves, which
        # reaches us as CANCELLED. (Our own cancellation is asyncio's CancelledError, never an
        # AioRpcError.) The append may have committed before, as after UNAVAILABLE: a retry
        # may land twice, and readers of Gazette's message UUIDs and recovery logs' seq_nos
        # skip the second copy.
        return err.code() in _RETRIED_GRPC_CODES or send_failed(err)
    return False


async def append(
    client: JournalClient,
    request: pb.AppendRequest,
    content: bytes | Sequence[bytes] = b"",
    *,
    attempts_max: int = attempts_max_default,
    backoff_cap_s: float = backoff_max_s,
    chunk_bytes_max: int = chunk_bytes_max_default,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> pb.AppendResponse:
    """Append `content` (bytes, or pieces to write in order) as one transaction, retrying
    unreachable brokers and stale routes up to `attempts_max` times, after back-offs doubling
    from `backoff_initial_s` up to `backoff_cap_s`. Returns the response."""
    if attempts_max < 1:
        raise ValueError(f"attempts_max: must be >= 1 (got {attempts_max})")
    if backoff_cap_s < backoff_initial_s:
        raise ValueError(f"backoff_cap_s: must be >= {backoff_initial_s} (got {backoff_cap_s})")
    pieces = [content] if isinstance(content, bytes | bytearray | memoryview) else list(content)
    attempt = 0
    unanswered = False  # Whether an attempt failed without a broker's answer (maybe_landed).
    while True:
        attempt += 1
        appender = Appender(client, request, chunk_bytes_max=chunk_bytes_max)
        try:
            async with appender:
                for piece in pieces:
                    await appender.write(piece)
            if appender.response is None:
                raise AppenderStateError("append finished without a response")
            return appender.response
        except Exception as err:
            unanswered = unanswered or not isinstance(err, StatusError)
            if not retriable(err) or attempt >= attempts_max:
                with contextlib.suppress(AttributeError):
                    setattr(err, _MAYBE_LANDED, unanswered)
                raise
            if isinstance(err, grpc.aio.AioRpcError):
                # The broker we sent to may be gone: ask the default broker next time.
                client.update_route(request.journal, None)
            delay = min(backoff_cap_s, backoff_initial_s * 2.0 ** (attempt - 1))
            log.warning(
                "append failed (will retry)",
                journal=request.journal,
                attempt=attempt,
                delay_s=delay,
                error=str(err),
            )
            await sleep(delay)
