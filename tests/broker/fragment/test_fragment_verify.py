"""The sans-IO verifying decoder of fragment files: every codec, byte by byte or whole; other
content of the same length, truncated, empty, overlong and undecodable files are each a typed
FragmentIntegrityError naming the journal, fragment and store."""

from __future__ import annotations

import pytest

from broker.fragment import codecs, naming
from broker.fragment.codecs import CompressionCodec
from broker.fragment.verify import (
    DataLossError,
    FragmentContentError,
    FragmentIntegrityError,
    FragmentVerifier,
    IntegrityFailure,
    VerifyingDecoder,
)
from broker.protocol import protocol_pb2 as pb

JOURNAL = "a/journal"
STORE = "file:///fragments/"
CONTENT = b"".join(b"record %04d\n" % i for i in range(200))
CODECS = [c for c in CompressionCodec if c is not CompressionCodec.INVALID]


def fragment_of(content: bytes, codec: CompressionCodec, begin: int = 100) -> pb.Fragment:
    return pb.Fragment(
        journal=JOURNAL,
        begin=begin,
        end=begin + len(content),
        sum=naming.content_sum(content),
        compression_codec=naming.pb_codec(codec),
        backing_store=STORE,
    )


def decode(fragment: pb.Fragment, stored: bytes, piece_bytes: int) -> bytes:
    decoder = VerifyingDecoder(fragment)
    out = b""
    for at in range(0, len(stored), piece_bytes):
        out += decoder.feed(stored[at : at + piece_bytes])
    return out + decoder.finish()


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
@pytest.mark.parametrize("piece_bytes", [1, 7, 1 << 20])
def test_verified_content_decodes_in_any_pieces(codec: CompressionCodec, piece_bytes: int) -> None:
    fragment = fragment_of(CONTENT, codec)
    assert decode(fragment, codecs.compress(codec, CONTENT), piece_bytes) == CONTENT


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_other_content_of_the_same_length_is_a_sha1_mismatch(codec: CompressionCodec) -> None:
    fragment = fragment_of(CONTENT, codec)
    other = CONTENT.replace(b"record 0100", b"RECORD 0100")
    assert len(other) == len(CONTENT) and other != CONTENT
    with pytest.raises(FragmentIntegrityError) as caught:
        decode(fragment, codecs.compress(codec, other), 64)
    err = caught.value
    assert err.failure is IntegrityFailure.SHA1_MISMATCH
    assert isinstance(err, DataLossError) and isinstance(err, FragmentContentError)
    assert err.journal == JOURNAL and err.store == STORE
    text = str(err)
    assert text.startswith(f"journal {JOURNAL}: fragment {naming.content_name(fragment)}")
    assert f"[100, {100 + len(CONTENT)}) in store {STORE}" in text
    assert naming.digest_of_sum(fragment.sum).hex() in text


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_a_truncated_file_is_short_or_undecodable(codec: CompressionCodec) -> None:
    fragment = fragment_of(CONTENT, codec)
    stored = codecs.compress(codec, CONTENT)
    with pytest.raises(FragmentIntegrityError) as caught:
        decode(fragment, stored[: len(stored) // 2], 64)
    assert caught.value.failure in (IntegrityFailure.SHORT, IntegrityFailure.UNDECODABLE)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_an_empty_file_is_empty(codec: CompressionCodec) -> None:
    with pytest.raises(FragmentIntegrityError, match=r"its file is empty \(0 bytes\)") as caught:
        decode(fragment_of(CONTENT, codec), b"", 64)
    assert caught.value.failure is IntegrityFailure.EMPTY


def test_an_overlong_file_fails_as_soon_as_it_passes_the_span() -> None:
    fragment = fragment_of(CONTENT, CompressionCodec.NONE)
    decoder = VerifyingDecoder(fragment)
    decoder.feed(CONTENT)
    with pytest.raises(FragmentIntegrityError, match="more than the fragment's") as caught:
        decoder.feed(b"x")
    assert caught.value.failure is IntegrityFailure.LONG


def test_undecodable_bytes_fail_at_once() -> None:
    fragment = fragment_of(CONTENT, CompressionCodec.GZIP)
    with pytest.raises(FragmentIntegrityError, match="gzip") as caught:
        VerifyingDecoder(fragment).feed(b"certainly not a gzip member")
    assert caught.value.failure is IntegrityFailure.UNDECODABLE


def test_without_a_sum_only_the_length_is_checked() -> None:
    fragment = fragment_of(CONTENT, CompressionCodec.NONE)
    fragment.ClearField("sum")
    other = bytes(len(CONTENT))
    assert decode(fragment, other, 1 << 20) == other
    with pytest.raises(FragmentIntegrityError, match="decodes to 1 of"):
        decode(fragment, b"x", 1 << 20)


def test_an_empty_fragment_has_an_empty_file() -> None:
    empty = fragment_of(b"", CompressionCodec.GZIP)
    assert decode(empty, codecs.compress(CompressionCodec.GZIP, b""), 1) == b""
    assert decode(empty, b"", 1) == b""


def test_the_verifier_counts_the_delivered_bytes_in_its_message() -> None:
    fragment = fragment_of(CONTENT, CompressionCodec.NONE)
    verifier = FragmentVerifier(fragment, store="s3://bucket/")
    verifier.feed(CONTENT[:-1] + b"!")
    with pytest.raises(FragmentIntegrityError) as caught:
        verifier.finish()
    delivered = caught.value.with_delivered(len(CONTENT))
    assert delivered.store == "s3://bucket/" and delivered.delivered == len(CONTENT)
    assert f"({len(CONTENT)} bytes of it were already delivered to the reader)" in str(delivered)
    with pytest.raises(ValueError, match="after finish"):
        verifier.feed(b"")
