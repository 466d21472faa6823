"""Fragment names and store keys: Gazette's exact formats, parsing, and typed errors."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.fragment import naming
from broker.fragment.codecs import CompressionCodec
from broker.fragment.naming import FragmentNameError
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import ValidationError

DIGEST = bytes(range(1, 21))  # 0102...14
DIGEST_HEX = DIGEST.hex()


def frag(path_postfix: str = "") -> pb.Fragment:
    return pb.Fragment(
        journal="a/journal",
        begin=1234567890,
        end=(1 << 63) - 1,
        sum=naming.sum_from_digest(DIGEST),
        compression_codec=naming.pb_codec(CompressionCodec.GZIP),
        path_postfix=path_postfix,
    )


def test_sum_words_are_big_endian() -> None:
    s = naming.sum_from_digest(DIGEST)
    assert (s.part1, s.part2, s.part3) == (0x0102030405060708, 0x090A0B0C0D0E0F10, 0x11121314)
    assert naming.digest_of_sum(s) == DIGEST


@given(st.binary(min_size=20, max_size=20))
def test_sum_round_trips(digest: bytes) -> None:
    assert naming.digest_of_sum(naming.sum_from_digest(digest)) == digest


def test_content_sum_is_sha1_of_uncompressed_and_zero_when_empty() -> None:
    assert naming.digest_of_sum(naming.content_sum(b"hello")) == hashlib.sha1(b"hello").digest()
    assert naming.digest_of_sum(naming.content_sum(b"")) == bytes(20)


def test_sum_from_digest_rejects_wrong_lengths() -> None:
    with pytest.raises(ValidationError, match="20 bytes"):
        naming.sum_from_digest(b"short")


def test_content_name_and_path() -> None:
    f = frag()
    assert naming.content_name(f) == f"00000000499602d2-7fffffffffffffff-{DIGEST_HEX}.gz"
    assert naming.content_path(f) == f"a/journal/00000000499602d2-7fffffffffffffff-{DIGEST_HEX}.gz"
    f.path_postfix = "a=1/b=2"
    assert naming.content_path(f) == (
        f"a/journal/a=1/b=2/00000000499602d2-7fffffffffffffff-{DIGEST_HEX}.gz"
    )


def test_empty_fragment_name_has_zero_sum() -> None:
    codec = naming.pb_codec(CompressionCodec.NONE)
    f = pb.Fragment(journal="a/journal", begin=5, end=5, compression_codec=codec)
    assert naming.content_name(f) == "0000000000000005-0000000000000005-" + "0" * 40 + ".raw"


@pytest.mark.parametrize(
    ("codec", "ext"),
    [
        (CompressionCodec.NONE, ".raw"),
        (CompressionCodec.GZIP, ".gz"),
        (CompressionCodec.ZSTANDARD, ".zst"),
        (CompressionCodec.SNAPPY, ".sz"),
        (CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION, ""),
    ],
)
def test_extensions(codec: CompressionCodec, ext: str) -> None:
    assert naming.extension_of(codec) == ext
    assert naming.codec_from_extension(ext) is codec
    assert naming.codec_from_extension(ext.upper()) is codec


@pytest.mark.parametrize(
    ("ext", "codec"),
    [
        (".gzip", CompressionCodec.GZIP),
        (".zstandard", CompressionCodec.ZSTANDARD),
        (".snappy", CompressionCodec.SNAPPY),
        (".gzod", CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION),
    ],
)
def test_long_extensions_parse(ext: str, codec: CompressionCodec) -> None:
    assert naming.codec_from_extension(ext) is codec


def test_invalid_codec_has_no_extension() -> None:
    with pytest.raises(ValidationError, match="invalid compression codec"):
        naming.extension_of(0)


def test_object_key_and_journal_prefix() -> None:
    f = frag(path_postfix="a=1")
    name = naming.content_name(f)
    assert naming.object_key("", f) == f"a/journal/a=1/{name}"
    assert naming.object_key("bucket/prefix/", f) == f"bucket/prefix/a/journal/a=1/{name}"
    assert naming.journal_prefix("p/", "a/journal") == "p/a/journal/"
    # Gazette's rewriting replaces the first match only.
    assert naming.object_key("p/", f, find="journal", replace="old") == f"p/a/old/a=1/{name}"
    assert naming.journal_prefix("p/", "a/journal", "a/", "z/") == "p/z/journal/"


def test_parse_relative_path_with_postfix() -> None:
    f = naming.parse_fragment_from_relative_path(
        "a/journal", f"a=1/b=2/00000000499602d2-7fffffffffffffff-{DIGEST_HEX}.gz"
    )
    assert f == frag(path_postfix="a=1/b=2")


def test_parse_gzip_offload_name_without_extension() -> None:
    f = naming.parse_fragment_from_relative_path("a/journal", f"0-10-{DIGEST_HEX}")
    assert CompressionCodec(f.compression_codec) is CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION
    assert (f.begin, f.end) == (0, 16)


@given(
    begin=st.integers(0, (1 << 63) - 1),
    length=st.integers(0, 1 << 40),
    digest=st.binary(min_size=20, max_size=20),
    codec=st.sampled_from([c for c in CompressionCodec if c is not CompressionCodec.INVALID]),
    postfix=st.sampled_from(["", "a=1", "date=2024-01-01/hour=03"]),
)
def test_names_round_trip(
    begin: int, length: int, digest: bytes, codec: CompressionCodec, postfix: str
) -> None:
    f = pb.Fragment(
        journal="some/journal/name",
        begin=begin,
        end=min(begin + length, (1 << 63) - 1),
        sum=naming.sum_from_digest(digest),
        compression_codec=naming.pb_codec(codec),
        path_postfix=postfix,
    )
    rel = naming.content_path(f)[len(f.journal) + 1 :]
    parsed = naming.parse_fragment_from_relative_path(f.journal, rel)
    assert parsed == f
    assert naming.is_canonical(parsed, rel)


def test_lenient_parse_is_not_canonical() -> None:
    rel = f"0000000000000000-00000000000000FF-{DIGEST_HEX}.GZ"
    f = naming.parse_fragment_from_relative_path("a/journal", rel)
    assert (f.begin, f.end, CompressionCodec(f.compression_codec)) == (
        0,
        255,
        CompressionCodec.GZIP,
    )
    assert not naming.is_canonical(f, rel)


Z = "0" * 40


@pytest.mark.parametrize(
    ("rel", "message"),
    [
        ("0-1.raw", "expected <begin>-<end>-<sha1>"),
        (f"0-1-2-{Z}.raw", "expected <begin>-<end>-<sha1>"),
        (f"zz-1-{Z}.raw", r"begin: must be 1 to 16 hex digits \(got 'zz'\)"),
        (f"0--{Z}.raw", "end: must be 1 to 16 hex digits"),
        (f"+1-2-{Z}.raw", "begin: must be 1 to 16 hex digits"),
        (f"0-10000000000000000-{Z}.raw", "end: must be 1 to 16 hex digits"),
        (f"0-8000000000000000-{Z}.raw", "end: must fit in an int64"),
        (f"2-1-{Z}.raw", r"begin: must be <= end \(got 2 > 1\)"),
        ("0-1-abcd.raw", "sum: must be 40 hex digits"),
        (f"0-1-{'g' * 40}.raw", "sum: must be 40 hex digits"),
        (f"0-1-{Z}.bz2", "compression_codec: unrecognized compression extension '.bz2'"),
        (f"a//b/0-1-{Z}.raw", "path_postfix: must be a clean path"),
    ],
)
def test_parse_errors_name_the_field_and_the_name(rel: str, message: str) -> None:
    with pytest.raises(FragmentNameError, match=message) as info:
        naming.parse_fragment_from_relative_path("a/journal", rel)
    assert rel.rsplit("/", 1)[-1] in str(info.value) or rel in str(info.value)
    assert info.value.name in (rel, rel.rsplit("/", 1)[-1])
    assert isinstance(info.value, ValidationError)


def test_parse_rejects_invalid_journal() -> None:
    with pytest.raises(FragmentNameError, match="journal"):
        naming.parse_fragment_from_relative_path("/rooted", f"0-1-{Z}.raw")
