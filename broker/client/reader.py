"""Reader: one Read RPC of a journal, as a stream of content chunks.

A broker answers a Read with a *metadata* response (status, the header with the journal's route,
the offset the read resolved to, the write head, the fragment covering that offset and, for a
persisted fragment, a signed URL of its file), then the fragment's content in chunks, then
metadata of the next fragment, and so on. The Reader follows that stream:

- Chunks come out as `Chunk(offset, content)`, so a caller sees where each one starts. The
  offset of a chunk is usually the end of the previous one; it is larger after an *offset jump*
  (the broker skipped a gap left by deleted fragments, or resolved a read of -1 to the write
  head). Jumps are followed, counted in `jumps`, and visible in the chunk offsets; a jump past
  content the reader asked for (from an offset above 0, not a metadata read) is also counted in
  the process's metrics (read_metrics.py) and logged as a WARNING.
- A metadata response with a non-OK status ends the read: once the broker closes the stream,
  `read_chunk` raises that status's typed error (e.g. `OffsetNotYetAvailableError` for a
  non-blocking read at the write head).
- With `do_not_proxy`, a broker does not stream the content of a persisted fragment: it closes
  the stream after the metadata, and the Reader reads the fragment's file itself, from the signed
  URL (or, given a StoreRegistry, through the store named by the fragment's backing store),
  decompressing it and skipping to the offset.
- Content that is lost or corrupt raises `DataLossError`: the broker answered the gRPC status
  DATA_LOSS (a fragment file failed verification, or is missing), or a directly read fragment
  file failed verification (`FragmentIntegrityError`, which names the fragment and store).
  Reading again would read the same bytes: it is never retried.
- The end of the stream (or of a directly read fragment, or `end_offset`) is the end of the
  Reader: `read_chunk` returns an empty chunk. Resuming from there is `RetryReader`'s business.

`FragmentContentReader` (the decompressing, verifying, seeking reader of a fragment file) is
also what the broker uses to serve reads of persisted fragments.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import grpc
import grpc.aio

from broker.client.read_metrics import count_jump
from broker.client.route_cache import JournalClient
from broker.fragment.stores.base import FragmentNotFoundError, FragmentReader
from broker.fragment.verify import (
    DataLossError,
    FragmentContentError,
    FragmentIntegrityError,
    IntegrityFailure,
    VerifyingDecoder,
)
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import raise_for_status
from broker.protocol.validate import ValidationError, at, validate_fragment, validate_journal_name

if TYPE_CHECKING:
    # The registry pulls in every store backend (boto3 among them); a reader needs it only
    # when it reads fragment files itself, so it is imported then.
    from broker.fragment.stores.registry import StoreRegistry

log = get_logger(__name__)

# Stored (compressed) bytes are read and decompressed in pieces of at most this size. It bounds
# the memory one decompression step takes: even gzip's worst ratio (~1000:1) stays in tens of MiB.
raw_chunk_bytes_max: Final = 32 << 10
# The decompressed output is handed out in pieces of at most this size.
content_chunk_bytes_max: Final = 1 << 17
# A fragment of at most this many (uncompressed) bytes is decoded and verified whole before any
# of it is handed out, so that a corrupt one yields no byte at all. It bounds the memory one
# reader holds; a larger fragment is verified as it streams (its SHA1 at its end).
verify_whole_bytes_max_default: Final = 1 << 20

__all__ = [
    "Chunk",
    "DataLossError",
    "FragmentContentError",
    "FragmentContentReader",
    "FragmentIntegrityError",
    "OpenURL",
    "ReadProtocolError",
    "Reader",
    "open_fragment",
    "open_url",
    "validate_read_request",
    "validate_read_response",
]


class ReadProtocolError(ValidationError):
    """A broker sent a ReadResponse that breaks the Read API's contract."""


class Chunk(NamedTuple):
    """Journal content starting at `offset`. Empty content marks the end of a reader."""

    offset: int
    content: bytes


class FragmentContentReader:
    """The uncompressed content of a fragment file, from `offset` to the fragment's end,
    verified against the fragment's name (broker/fragment/verify.py).

    Reads return pieces of at most `chunk_bytes_max`, then b"" exactly at the fragment's end. A
    fragment of at most `verify_whole_bytes_max` bytes is decoded and verified whole before its
    first byte is returned; a larger one is verified as it streams, its SHA1 at its end. A file
    that does not hold the fragment's content raises FragmentIntegrityError (a DataLossError),
    saying how many of the fragment's bytes were already returned; a read that stops inside a
    large fragment has not verified it. `store` names the file's store in errors."""

    def __init__(
        self,
        raw: FragmentReader,
        fragment: pb.Fragment,
        offset: int,
        *,
        chunk_bytes_max: int = content_chunk_bytes_max,
        verify_whole_bytes_max: int = verify_whole_bytes_max_default,
        store: str = "",
    ) -> None:
        if not fragment.begin <= offset <= fragment.end:
            raise ValueError(
                f"offset: must be in [{fragment.begin}, {fragment.end}] (got {offset})"
            )
        self.fragment = fragment
        self.offset = offset  # Next offset to return.
        self._raw = raw
        self._decoder = VerifyingDecoder(fragment, store)
        self._chunk_bytes_max = chunk_bytes_max
        # Uncompressed, the file is the content: read it in pieces as large as those handed
        # out (each read may be a hop to a worker thread). Compressed, a raw piece is bounded
        # by what one decompression step may produce.
        self._raw_read_bytes = (
            max(raw_chunk_bytes_max, chunk_bytes_max)
            if fragment.compression_codec == pb.NONE
            else raw_chunk_bytes_max
        )
        self._whole = fragment.end - fragment.begin <= verify_whole_bytes_max
        self._position = fragment.begin  # Journal offset of the next decompressed byte.
        self._delivered = 0  # Bytes of the fragment returned so far.
        self._pending = bytearray()  # Content to return, from _pending_at.
        self._pending_at = 0
        self._eof = False
        self._verified = False

    @property
    def verified(self) -> bool:
        """Whether the whole file was read and verified."""
        return self._verified

    async def read(self) -> bytes:
        while self._whole and not self._eof:
            self._take(await self._decompress_next())
        # Fill a whole piece before handing one out: a raw read decodes to at most
        # raw_chunk_bytes_max (or to whatever a compressed block holds), and a Read response per
        # raw read would cost the broker several messages per piece.
        while not self._eof and len(self._pending) - self._pending_at < self._chunk_bytes_max:
            self._take(await self._decompress_next())
        while True:
            if self._pending_at < len(self._pending):
                at = self._pending_at
                piece = bytes(self._pending[at : at + self._chunk_bytes_max])
                self._pending_at += len(piece)
                if self._pending_at == len(self._pending):
                    self._pending, self._pending_at = bytearray(), 0
                self.offset += len(piece)
                self._delivered += len(piece)
                return piece
            if self._eof:
                return b""
            self._take(await self._decompress_next())

    async def _decompress_next(self) -> bytes:
        data = await self._raw.read(self._raw_read_bytes)
        try:
            if data:
                return self._decoder.feed(data)
            self._eof = True
            out = self._decoder.finish()
            self._verified = True
            return out
        except FragmentIntegrityError as err:
            raise err.with_delivered(self._delivered) from err

    def _take(self, out: bytes) -> None:
        # Drop what lies before the requested offset (a fragment file can only be read from
        # its start), keep the rest. The decoder has checked that it fits the fragment.
        skip = max(0, min(len(out), self.offset - self._position))
        self._pending += out[skip:]
        self._position += len(out)

    async def aclose(self) -> None:
        await self._raw.aclose()


OpenURL = Callable[[str], Awaitable[FragmentReader]]


async def open_url(url: str) -> FragmentReader:
    """A reader of a signed fragment URL (file://, memory://, http(s)://), as stored."""
    from broker.fragment.stores.registry import open_url as open_signed_url

    return await open_signed_url(url)


async def open_fragment(
    fragment: pb.Fragment,
    offset: int,
    *,
    url: str = "",
    registry: StoreRegistry | None = None,
    opener: OpenURL = open_url,
) -> FragmentContentReader:
    """A content reader of a persisted fragment from `offset`: through `registry`'s store of
    the fragment's backing store when a registry is given, else from the signed `url`."""
    store = fragment.backing_store
    try:
        if registry is not None and store:
            raw = await registry.get(store).open(fragment)
        elif url:
            raw = await opener(url)
        else:
            raise ValueError("open_fragment: need a registry and a backing store, or a URL")
    except FragmentNotFoundError as err:
        raise missing_fragment_error(fragment, err) from err
    try:
        return FragmentContentReader(raw, fragment, offset, store=store)
    except BaseException:
        await raw.aclose()
        raise


def missing_fragment_error(
    fragment: pb.Fragment, err: FragmentNotFoundError
) -> FragmentIntegrityError:
    """The data loss of a fragment whose file is not where the index (or a URL) says it is."""
    return FragmentIntegrityError(
        fragment,
        fragment.backing_store or err.store_url,
        IntegrityFailure.MISSING,
        f"its file is missing from the store (no file at key {err.key!r})",
    )


def validate_read_request(request: pb.ReadRequest) -> None:
    """Gazette's ReadRequest rules, with the offending field named."""
    with at("journal"):
        validate_journal_name(request.journal)
    if request.offset < -1:
        raise ValidationError(f"must be >= -1 (got {request.offset})", "offset")
    if request.end_offset < 0 or (request.end_offset != 0 and request.end_offset < request.offset):
        raise ValidationError(
            f"must be 0 or >= offset {request.offset} (got {request.end_offset})", "end_offset"
        )


def validate_read_response(response: pb.ReadResponse) -> None:
    """Gazette's ReadResponse rules (a content chunk carries nothing else; metadata is
    consistent with its fragment), raising ReadProtocolError."""
    if response.content:
        for name in ("header", "fragment"):
            if response.HasField(name):
                raise ReadProtocolError("unexpected with content", name)
        if response.status != pb.OK or response.write_head or response.fragment_url:
            raise ReadProtocolError("unexpected status, write_head or fragment_url with content")
        return
    if response.write_head < 0:
        raise ReadProtocolError(f"must be >= 0 (got {response.write_head})", "write_head")
    if response.HasField("fragment"):
        f = response.fragment
        try:
            with at("fragment"):
                validate_fragment(f)
        except ValidationError as err:
            raise ReadProtocolError(err.rule, *err.context) from None
        if not f.begin <= response.offset < f.end:
            raise ReadProtocolError(
                f"must be in [{f.begin}, {f.end}) of its fragment (got {response.offset})", "offset"
            )
        if response.write_head < f.end:
            raise ReadProtocolError(
                f"must be >= the fragment's end {f.end} (got {response.write_head})", "write_head"
            )
    elif response.fragment_url:
        raise ReadProtocolError("unexpected without a fragment", "fragment_url")
    elif response.status == pb.OK and response.offset != 0:
        raise ReadProtocolError(
            f"unexpected without a fragment or content (got {response.offset})", "offset"
        )


class Reader:
    """One Read RPC (see the module docstring). `request` is copied; `request.offset` is kept
    current as the next offset to read, and `response` is the latest metadata response."""

    def __init__(
        self,
        client: JournalClient,
        request: pb.ReadRequest,
        *,
        registry: StoreRegistry | None = None,
        opener: OpenURL = open_url,
    ) -> None:
        self.client = client
        self.request = pb.ReadRequest()
        self.request.CopyFrom(request)
        self.response = pb.ReadResponse()
        # The header of the latest response that carried one: a broker sends it with its first
        # metadata response only, and `response` moves on to later ones (a fragment persisted
        # under the read is answered again, without it).
        self.header = pb.Header()
        self.jumps = 0
        # OK responses received (metadata or content): lets a retrying caller tell a stream
        # that made progress from one that failed or ended before it got going.
        self.ok_responses = 0
        self._registry = registry
        self._opener = opener
        self._call: Any = None  # grpc.aio.UnaryStreamCall; the generated stubs are untyped.
        self._last: pb.ReadResponse | None = None
        self._direct: FragmentContentReader | None = None
        # Whether the stream handed over to a fragment read directly from its store: such a
        # reader ends when the fragment is read through, an ordinary end (see RetryReader).
        self.read_directly = False
        self._done = False

    @property
    def offset(self) -> int:
        """The next journal offset to read (-1 until a read of the write head resolves)."""
        return self.request.offset

    @property
    def done(self) -> bool:
        return self._done

    async def read(self) -> bytes:
        """The next chunk's content; b"" at the end of the reader."""
        return (await self.read_chunk()).content

    async def read_chunk(self) -> Chunk:
        """The next chunk of content. An empty chunk marks the end of the reader. Raises the
        typed status error of a non-OK response, DataLossError for lost or corrupt content, and
        other gRPC errors as they come."""
        if self._done:
            return Chunk(self.request.offset, b"")
        if self._direct is not None:
            return await self._read_direct(self._direct)
        try:
            return await self._read_stream()
        except grpc.aio.AioRpcError as err:
            await self.close()
            if err.code() == grpc.StatusCode.DATA_LOSS:
                raise DataLossError(
                    self.request.journal, f"DATA_LOSS: {err.details() or 'content lost'}"
                ) from err
            raise
        except BaseException:
            await self.close()
            raise

    async def _read_stream(self) -> Chunk:
        if self._call is None:
            validate_read_request(self.request)
            stub = self.client.stub_for(self.request.journal, require_primary=False)
            self._call = stub.Read(self.request)
        while True:
            response = await self._call.read()
            if response is grpc.aio.EOF:
                return await self._on_end_of_stream()
            validate_read_response(response)
            if response.status == pb.OK:
                self.ok_responses += 1
            self._last = response
            if response.HasField("header"):
                self.header = response.header
                self.client.update_route(self.request.journal, response.header)
            if response.offset > self.request.offset:
                if self.request.offset != -1:  # A read of -1 resolving is no jump.
                    self.jumps += 1
                    if self.request.offset > 0 and not self.request.metadata_only:
                        # Content this reader asked for and will never see: counted and said
                        # (read_metrics.py). A read from offset 0 starts at the journal's first
                        # content, wherever retention left it; a metadata read (a probe of the
                        # write head) reads nothing.
                        count_jump(self.request.journal, response.offset - self.request.offset)
                        log.warning(
                            "read offset jump: content between was removed or lost",
                            journal=self.request.journal,
                            offset=self.request.offset,
                            to=response.offset,
                        )
                    else:
                        log.info(
                            "read offset jump",
                            journal=self.request.journal,
                            offset=self.request.offset,
                            to=response.offset,
                        )
                self.request.offset = response.offset
            elif response.status == pb.OK and response.offset < self.request.offset:
                raise ReadProtocolError(
                    f"must be >= the requested offset {self.request.offset} (got"
                    f" {response.offset})",
                    "offset",
                )
            if response.content:
                start = self.request.offset
                self.request.offset += len(response.content)
                return Chunk(start, response.content)
            self.response = response

    async def _on_end_of_stream(self) -> Chunk:
        self._call = None
        last = self._last
        if last is not None and last.status != pb.OK:
            self._done = True
            raise_for_status(
                last.status, f"reading {self.request.journal} at offset {self.request.offset}"
            )
        if (
            last is not None
            and last.fragment_url
            and last.HasField("fragment")
            and not self.request.metadata_only
            and not self.reached_end_offset
        ):
            self.read_directly = True
            self._direct = await open_fragment(
                last.fragment,
                self.request.offset,
                url=last.fragment_url,
                registry=self._registry,
                opener=self._opener,
            )
            return await self._read_direct(self._direct)
        self._done = True
        return Chunk(self.request.offset, b"")

    async def _read_direct(self, direct: FragmentContentReader) -> Chunk:
        try:
            content = b"" if self.reached_end_offset else await direct.read()
        except BaseException:
            await self.close()
            raise
        if self.request.end_offset:
            content = content[: self.request.end_offset - self.request.offset]
        if not content:
            # The fragment (or the requested range) is read through: this reader is done.
            await self.close()
            return Chunk(self.request.offset, b"")
        start = self.request.offset
        self.request.offset += len(content)
        return Chunk(start, content)

    @property
    def reached_end_offset(self) -> bool:
        """Whether the request has an `end_offset` and the read got to it."""
        end = self.request.end_offset
        return end != 0 and self.request.offset >= end

    async def close(self) -> None:
        """Cancel the RPC and close a directly read fragment. Idempotent."""
        self._done = True
        call, self._call = self._call, None
        if call is not None:
            call.cancel()
        direct, self._direct = self._direct, None
        if direct is not None:
            await direct.aclose()

    def __aiter__(self) -> AsyncIterator[Chunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[Chunk]:
        while True:
            chunk = await self.read_chunk()
            if not chunk.content:
                return
            yield chunk
