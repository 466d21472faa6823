"""Streaming codecs: round trips over arbitrary chunkings, Gazette's byte formats, corruption."""

from __future__ import annotations

import gzip

import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from broker.fragment.codecs import (
    SNAPPY_STREAM_IDENTIFIER,
    CodecError,
    CompressionCodec,
    compress,
    decompress,
    new_compressor,
    new_decompressor,
)

USABLE = [c for c in CompressionCodec if c is not CompressionCodec.INVALID]


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in [*points, len(data)]:
        pieces.append(data[last:p])
        last = p
    return pieces


def _stream_compress(codec: CompressionCodec, pieces: list[bytes]) -> bytes:
    c = new_compressor(codec)
    return b"".join(c.compress(p) for p in pieces) + c.close()


def _stream_decompress(codec: CompressionCodec, pieces: list[bytes]) -> bytes:
    d = new_decompressor(codec)
    return b"".join(d.decompress(p) for p in pieces) + d.close()


@pytest.mark.parametrize("codec", USABLE, ids=lambda c: c.name)
@given(
    content=st.binary(max_size=4096) | st.text(max_size=3000).map(str.encode),
    write_cuts=st.lists(st.integers(min_value=0), max_size=8),
    read_cuts=st.lists(st.integers(min_value=0), max_size=8),
)
def test_round_trip_over_any_chunking(
    codec: CompressionCodec, content: bytes, write_cuts: list[int], read_cuts: list[int]
) -> None:
    compressed = _stream_compress(codec, _split(content, write_cuts))
    assert _stream_decompress(codec, _split(compressed, read_cuts)) == content


@pytest.mark.parametrize("codec", USABLE, ids=lambda c: c.name)
def test_large_content_round_trips(codec: CompressionCodec) -> None:
    # Larger than a snappy chunk (64 KiB) and a zstd block (128 KiB), to cross their boundaries.
    content = b"".join(b"%08d some journal line\n" % i for i in range(40_000))
    assert decompress(codec, compress(codec, content)) == content


def test_codec_values_match_gazette_wire_enum() -> None:
    assert [(c.name, int(c)) for c in CompressionCodec] == [
        ("INVALID", 0),
        ("NONE", 1),
        ("GZIP", 2),
        ("ZSTANDARD", 3),
        ("SNAPPY", 4),
        ("GZIP_OFFLOAD_DECOMPRESSION", 5),
    ]


def test_gzip_output_is_plain_gzip() -> None:
    assert gzip.decompress(compress(CompressionCodec.GZIP, b"hello")) == b"hello"
    assert gzip.decompress(compress(CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION, b"x")) == b"x"


@pytest.mark.parametrize(
    "codec", [CompressionCodec.GZIP, CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION]
)
def test_gzip_concatenated_members_decompress_as_one_stream(codec: CompressionCodec) -> None:
    members = gzip.compress(b"first ") + gzip.compress(b"") + gzip.compress(b"second")
    assert decompress(codec, members) == b"first second"
    # And fed one byte at a time, so that member boundaries fall inside a feed.
    assert _stream_decompress(codec, [members[i : i + 1] for i in range(len(members))]) == (
        b"first second"
    )


def test_zstd_concatenated_frames_decompress_as_one_stream() -> None:
    frames = zstandard.ZstdCompressor().compress(b"abc") + zstandard.ZstdCompressor().compress(
        b"def"
    )
    assert decompress(CompressionCodec.ZSTANDARD, frames) == b"abcdef"


def test_snappy_stream_identifier_is_byte_exact() -> None:
    assert SNAPPY_STREAM_IDENTIFIER == bytes.fromhex("ff060000734e61507059")
    assert compress(CompressionCodec.SNAPPY, b"hello").startswith(SNAPPY_STREAM_IDENTIFIER)
    # An empty stream is still a well-formed framed stream.
    assert compress(CompressionCodec.SNAPPY, b"") == SNAPPY_STREAM_IDENTIFIER


def test_snappy_uncompressed_chunk_matches_framing_spec() -> None:
    # Known vector: type 0x01 (uncompressed), length 9, masked CRC-32C of "hello", then data.
    stream = SNAPPY_STREAM_IDENTIFIER + bytes.fromhex("01090000bb1f1c19") + b"hello"
    assert decompress(CompressionCodec.SNAPPY, stream) == b"hello"


def test_snappy_skips_padding_and_skippable_chunks() -> None:
    stream = (
        SNAPPY_STREAM_IDENTIFIER
        + b"\xfe\x02\x00\x00\x00\x00"  # padding
        + b"\x80\x01\x00\x00z"  # reserved skippable
        + compress(CompressionCodec.SNAPPY, b"data")
    )
    assert decompress(CompressionCodec.SNAPPY, stream) == b"data"


@pytest.mark.parametrize("codec", USABLE, ids=lambda c: c.name)
def test_empty_input_is_an_empty_stream(codec: CompressionCodec) -> None:
    assert decompress(codec, b"") == b""
    assert decompress(codec, compress(codec, b"")) == b""


@pytest.mark.parametrize(
    ("codec", "corrupt", "message"),
    [
        (CompressionCodec.GZIP, b"not gzip at all", "corrupt gzip"),
        (CompressionCodec.ZSTANDARD, b"not zstd at all", "corrupt zstd"),
        (CompressionCodec.SNAPPY, b"\x01\x09\x00\x00bb1f1c19hello", "stream identifier"),
        (CompressionCodec.SNAPPY, b"\xff\x06\x00\x00sNaPpZ", "bad stream identifier"),
        (CompressionCodec.SNAPPY, SNAPPY_STREAM_IDENTIFIER + b"\x02\x00\x00\x00", "unskippable"),
        (
            CompressionCodec.SNAPPY,
            SNAPPY_STREAM_IDENTIFIER + bytes.fromhex("01090000bb1f1c18") + b"hello",
            "checksum",
        ),
    ],
)
def test_corrupt_input_raises_codec_error(
    codec: CompressionCodec, corrupt: bytes, message: str
) -> None:
    with pytest.raises(CodecError, match=message) as info:
        decompress(codec, corrupt)
    assert codec.name in str(info.value)


@pytest.mark.parametrize(
    "codec", [CompressionCodec.GZIP, CompressionCodec.ZSTANDARD, CompressionCodec.SNAPPY]
)
def test_truncated_stream_raises_at_close(codec: CompressionCodec) -> None:
    whole = compress(codec, b"some content that is long enough " * 10)
    d = new_decompressor(codec)
    d.decompress(whole[:-3])
    with pytest.raises(CodecError, match="truncated"):
        d.close()


def test_gzip_garbage_after_a_member_is_corruption() -> None:
    with pytest.raises(CodecError, match="corrupt gzip"):
        decompress(CompressionCodec.GZIP, gzip.compress(b"ok") + b"trailing junk")


def test_gzip_bit_flip_is_detected() -> None:
    data = bytearray(compress(CompressionCodec.GZIP, b"payload " * 100))
    data[len(data) // 2] ^= 0xFF
    with pytest.raises(CodecError):
        decompress(CompressionCodec.GZIP, bytes(data))


@pytest.mark.parametrize("codec", [0, 6, 99])
def test_unusable_codec_values_are_rejected(codec: int) -> None:
    with pytest.raises(CodecError):
        new_compressor(codec)
    with pytest.raises(CodecError):
        new_decompressor(codec)


@pytest.mark.parametrize("codec", USABLE, ids=lambda c: c.name)
def test_use_after_close_raises(codec: CompressionCodec) -> None:
    c = new_compressor(codec)
    c.close()
    with pytest.raises(CodecError, match="after close"):
        c.compress(b"late")
    d = new_decompressor(codec)
    d.close()
    with pytest.raises(CodecError, match="after close"):
        d.decompress(b"late")
