"""Streaming compression codecs of fragment files.

A fragment file holds the journal bytes of [begin, end) compressed with the journal's codec.
Brokers compress incrementally, as content commits to the spool, so the work of compressing a
large fragment is spread over its appends rather than paid all at once when it is persisted.
Readers decompress incrementally too, as bytes arrive from a store or a signed URL. Hence the two
small streaming interfaces here: feed chunks in, get whatever output is ready back, and `close()`
for the rest.

The byte formats are Gazette's:

- NONE: the content itself.
- GZIP and GZIP_OFFLOAD_DECOMPRESSION: gzip (RFC 1952). Decompression accepts several
  concatenated gzip members, as Go's gzip reader does, so that files written in several
  flushes (or stitched together by tools) read back as one stream.
- ZSTANDARD: zstd frames; several concatenated frames are accepted on decompression.
- SNAPPY: the snappy *framing* format (stream identifier, then CRC-checked chunks), not raw
  snappy blocks: it is what Go's snappy Writer/Reader produce and consume.

Corrupt or truncated input raises `CodecError`, naming the codec and what was wrong.
"""

from __future__ import annotations

import enum
import zlib
from typing import Protocol

import cramjam
import zstandard


class CompressionCodec(enum.IntEnum):
    """Gazette's protocol.CompressionCodec, with the same numeric values as the wire enum, so
    that values read off a protocol.Fragment convert with `CompressionCodec(fragment.codec)`."""

    INVALID = 0
    NONE = 1
    GZIP = 2
    ZSTANDARD = 3
    SNAPPY = 4
    # GZIP content that a store serves decompressed (HTTP Content-Encoding: gzip), so that
    # readers of signed URLs can get plain content. The bytes at rest are plain gzip.
    GZIP_OFFLOAD_DECOMPRESSION = 5


class CodecError(ValueError):
    """Compressed input is corrupt or truncated, or a codec is not usable."""

    def __init__(self, codec: CompressionCodec | int, what: str) -> None:
        name = codec.name if isinstance(codec, CompressionCodec) else str(codec)
        super().__init__(f"{name} codec: {what}")
        self.codec = codec


class Compressor(Protocol):
    """Incremental compressor: `compress()` each chunk as it commits, `close()` once."""

    def compress(self, data: bytes) -> bytes:
        """Consume `data`; return compressed bytes that are ready (possibly none)."""
        ...

    def close(self) -> bytes:
        """Finish the stream and return its remaining bytes. No calls may follow."""
        ...


class Decompressor(Protocol):
    """Incremental decompressor: `decompress()` each received chunk, `close()` at end of input."""

    def decompress(self, data: bytes) -> bytes:
        """Consume `data`; return decompressed bytes that are ready (possibly none)."""
        ...

    def close(self) -> bytes:
        """Declare end of input; return remaining bytes. Raises CodecError if the input
        stopped part-way through a member, frame or chunk."""
        ...


# Default levels favour throughput: compression runs on the append path of brokers.
gzip_level_default = 6
zstd_level_default = 3

# The snappy framing format's stream identifier chunk: type 0xff, length 6, "sNaPpY".
SNAPPY_STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"
# A frame header is 1 type byte and a 3-byte little-endian length, so no single chunk can
# exceed this: it is the bound of the decompressor's pending buffer.
snappy_chunk_bytes_max = 4 + (1 << 24) - 1
_SNAPPY_HEADER_BYTES = 4
_SNAPPY_CHUNK_COMPRESSED = 0x00
_SNAPPY_CHUNK_UNCOMPRESSED = 0x01
_SNAPPY_CHUNK_PADDING = 0xFE
_SNAPPY_CHUNK_STREAM_IDENTIFIER = 0xFF
# Types 0x02-0x7f are reserved and unskippable; 0x80-0xfd are reserved and skippable.
_SNAPPY_UNSKIPPABLE_MAX = 0x7F


class _Closed:
    """Guards against use after close(), which would silently produce a malformed stream."""

    def __init__(self, codec: CompressionCodec) -> None:
        self._codec = codec
        self._closed = False

    def check(self) -> None:
        if self._closed:
            raise CodecError(self._codec, "used after close()")

    def close(self) -> None:
        self.check()
        self._closed = True


# --- NONE -------------------------------------------------------------------------------------


class _Identity:
    def __init__(self) -> None:
        self._state = _Closed(CompressionCodec.NONE)

    def compress(self, data: bytes) -> bytes:
        self._state.check()
        return bytes(data)

    def decompress(self, data: bytes) -> bytes:
        return self.compress(data)

    def close(self) -> bytes:
        self._state.close()
        return b""


# --- GZIP -------------------------------------------------------------------------------------

# zlib's wbits for a gzip (not zlib or raw deflate) container.
_GZIP_WBITS = 31


class _GzipCompressor:
    def __init__(self, level: int) -> None:
        self._obj = zlib.compressobj(level, zlib.DEFLATED, _GZIP_WBITS)
        self._state = _Closed(CompressionCodec.GZIP)

    def compress(self, data: bytes) -> bytes:
        self._state.check()
        return self._obj.compress(data)

    def close(self) -> bytes:
        self._state.close()
        return self._obj.flush(zlib.Z_FINISH)


class _GzipDecompressor:
    """Decompresses a sequence of gzip members. A new member begins right after the previous
    one's trailer; anything there that is not a gzip header is corruption."""

    def __init__(self, codec: CompressionCodec) -> None:
        self._codec = codec
        self._obj = zlib.decompressobj(_GZIP_WBITS)
        # True once the current member has consumed any byte: empty input (no member at all) is
        # a valid empty stream, a member cut short is not.
        self._in_member = False
        self._state = _Closed(codec)

    def decompress(self, data: bytes) -> bytes:
        self._state.check()
        out: list[bytes] = []
        while data:
            self._in_member = True
            try:
                out.append(self._obj.decompress(data))
            except zlib.error as err:
                raise CodecError(self._codec, f"corrupt gzip stream ({err})") from err
            if not self._obj.eof:
                break
            # Member complete: whatever follows starts the next member.
            data = self._obj.unused_data
            self._obj = zlib.decompressobj(_GZIP_WBITS)
            self._in_member = False
        return b"".join(out)

    def close(self) -> bytes:
        self._state.close()
        if self._in_member:
            raise CodecError(self._codec, "truncated gzip stream (member is incomplete)")
        return b""


# --- ZSTANDARD --------------------------------------------------------------------------------


class _ZstdCompressor:
    def __init__(self, level: int) -> None:
        self._obj = zstandard.ZstdCompressor(level=level).compressobj()
        self._state = _Closed(CompressionCodec.ZSTANDARD)

    def compress(self, data: bytes) -> bytes:
        self._state.check()
        return self._obj.compress(data)

    def close(self) -> bytes:
        self._state.close()
        return self._obj.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)


class _ZstdDecompressor:
    """Decompresses a sequence of zstd frames, restarting after each frame's end so that a
    frame cut short at close() can be told apart from a complete stream."""

    def __init__(self) -> None:
        self._dctx = zstandard.ZstdDecompressor()
        self._obj = self._dctx.decompressobj()
        self._in_frame = False
        self._state = _Closed(CompressionCodec.ZSTANDARD)

    def decompress(self, data: bytes) -> bytes:
        self._state.check()
        out: list[bytes] = []
        while data:
            self._in_frame = True
            try:
                out.append(self._obj.decompress(data))
            except zstandard.ZstdError as err:
                raise CodecError(
                    CompressionCodec.ZSTANDARD, f"corrupt zstd stream ({err})"
                ) from err
            if not self._obj.eof:
                break
            data = self._obj.unused_data
            self._obj = self._dctx.decompressobj()
            self._in_frame = False
        return b"".join(out)

    def close(self) -> bytes:
        self._state.close()
        if self._in_frame:
            raise CodecError(
                CompressionCodec.ZSTANDARD, "truncated zstd stream (frame is incomplete)"
            )
        return b""


# --- SNAPPY (framing format) ------------------------------------------------------------------


class _SnappyCompressor:
    def __init__(self) -> None:
        self._obj = cramjam.snappy.Compressor()
        self._wrote_identifier = False
        self._state = _Closed(CompressionCodec.SNAPPY)

    def compress(self, data: bytes) -> bytes:
        self._state.check()
        if not data:
            return b""
        self._obj.compress(data)
        out = bytes(self._obj.flush())
        self._wrote_identifier = self._wrote_identifier or bool(out)
        return out

    def close(self) -> bytes:
        self._state.close()
        out = bytes(self._obj.finish())
        # An empty stream is still written as a stream identifier, so that every file we
        # produce is a well-formed framed stream that any reader can recognise.
        if not self._wrote_identifier and not out:
            return SNAPPY_STREAM_IDENTIFIER
        return out


class _SnappyDecompressor:
    """Splits the framed stream into chunks itself (so input may arrive in any pieces) and
    hands runs of complete data chunks to cramjam, which verifies each chunk's masked CRC-32C.

    Chunks are parsed here rather than in cramjam because cramjam's streaming decompressor
    expects whole streams; splitting lets us bound buffering to one chunk and detect a stream
    cut short at close().
    """

    def __init__(self) -> None:
        self._pending = bytearray()
        self._seen_identifier = False
        self._state = _Closed(CompressionCodec.SNAPPY)

    def decompress(self, data: bytes) -> bytes:
        self._state.check()
        self._pending += data
        data_chunks: list[bytes] = []
        out: list[bytes] = []
        offset = 0
        while len(self._pending) - offset >= _SNAPPY_HEADER_BYTES:
            kind = self._pending[offset]
            length = int.from_bytes(self._pending[offset + 1 : offset + 4], "little")
            end = offset + _SNAPPY_HEADER_BYTES + length
            if end > len(self._pending):
                break  # Chunk incomplete: wait for more input.
            chunk = bytes(self._pending[offset:end])
            offset = end
            if kind == _SNAPPY_CHUNK_STREAM_IDENTIFIER:
                if chunk != SNAPPY_STREAM_IDENTIFIER:
                    raise CodecError(CompressionCodec.SNAPPY, f"bad stream identifier {chunk!r}")
                self._seen_identifier = True
            elif not self._seen_identifier:
                raise CodecError(
                    CompressionCodec.SNAPPY,
                    f"stream does not begin with a stream identifier (chunk type {kind:#04x})",
                )
            elif kind in (_SNAPPY_CHUNK_COMPRESSED, _SNAPPY_CHUNK_UNCOMPRESSED):
                data_chunks.append(chunk)
            elif kind <= _SNAPPY_UNSKIPPABLE_MAX:
                raise CodecError(
                    CompressionCodec.SNAPPY, f"reserved unskippable chunk type {kind:#04x}"
                )
            # Else padding or a reserved skippable chunk: skipped, as the format requires.
        del self._pending[:offset]
        if data_chunks:
            out.append(self._decode(data_chunks))
        return b"".join(out)

    @staticmethod
    def _decode(chunks: list[bytes]) -> bytes:
        try:
            return bytes(cramjam.snappy.decompress(SNAPPY_STREAM_IDENTIFIER + b"".join(chunks)))
        except cramjam.DecompressionError as err:
            raise CodecError(CompressionCodec.SNAPPY, f"corrupt snappy chunk ({err})") from err

    def close(self) -> bytes:
        self._state.close()
        if self._pending:
            raise CodecError(
                CompressionCodec.SNAPPY,
                f"truncated snappy stream ({len(self._pending)} bytes of an incomplete chunk)",
            )
        return b""


# --- Factories --------------------------------------------------------------------------------


def _checked(codec: CompressionCodec | int) -> CompressionCodec:
    try:
        checked = CompressionCodec(codec)
    except ValueError:
        raise CodecError(codec, "unknown compression codec") from None
    if checked is CompressionCodec.INVALID:
        raise CodecError(checked, "not a usable compression codec")
    return checked


def new_compressor(codec: CompressionCodec | int, *, level: int | None = None) -> Compressor:
    """A streaming compressor for `codec`. `level` applies to GZIP and ZSTANDARD only."""
    checked = _checked(codec)
    if checked is CompressionCodec.NONE:
        return _Identity()
    if checked in (CompressionCodec.GZIP, CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION):
        return _GzipCompressor(gzip_level_default if level is None else level)
    if checked is CompressionCodec.ZSTANDARD:
        return _ZstdCompressor(zstd_level_default if level is None else level)
    return _SnappyCompressor()


def new_decompressor(codec: CompressionCodec | int) -> Decompressor:
    """A streaming decompressor for `codec`."""
    checked = _checked(codec)
    if checked is CompressionCodec.NONE:
        return _Identity()
    if checked in (CompressionCodec.GZIP, CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION):
        return _GzipDecompressor(checked)
    if checked is CompressionCodec.ZSTANDARD:
        return _ZstdDecompressor()
    return _SnappyDecompressor()


def compress(codec: CompressionCodec | int, data: bytes, *, level: int | None = None) -> bytes:
    """One-shot compression of `data`."""
    c = new_compressor(codec, level=level)
    return c.compress(data) + c.close()


def decompress(codec: CompressionCodec | int, data: bytes) -> bytes:
    """One-shot decompression of a complete stream."""
    d = new_decompressor(codec)
    return d.decompress(data) + d.close()
