"""FragmentContentReader hands out full pieces of a large fragment: a store-served Read of a
persisted fragment then costs one response per `chunk_bytes_max` of content, not one per raw
read of the file (32 KiB), for every codec."""

from __future__ import annotations

import pytest

from broker.client.reader import FragmentContentReader, content_chunk_bytes_max
from broker.fragment import codecs, naming
from broker.fragment.codecs import CompressionCodec
from broker.fragment.stores.base import BytesReader
from broker.protocol import protocol_pb2 as pb


@pytest.mark.parametrize("codec", [CompressionCodec.NONE, CompressionCodec.GZIP])
async def test_a_large_fragment_is_handed_out_in_full_pieces(codec: CompressionCodec) -> None:
    content = b"".join(b"record %07d\n" % i for i in range(200_000))  # ~3 MiB: streamed.
    fragment = pb.Fragment(
        journal="a/journal",
        begin=1000,
        end=1000 + len(content),
        sum=naming.content_sum(content),
        compression_codec=codec.value,  # type: ignore[arg-type]
    )
    stored = codecs.compress(codec, content)
    reader = FragmentContentReader(BytesReader(stored), fragment, 1000 + 7)

    pieces = []
    while piece := await reader.read():
        pieces.append(piece)

    assert b"".join(pieces) == content[7:]
    assert reader.verified
    assert [len(p) for p in pieces[:-1]] == [content_chunk_bytes_max] * (len(pieces) - 1)
