"""parse_texts (uuid_columns.py) against the message layer's parse, one UUID at a time: every
character of a Gazette UUID's text replaced by every byte value, and random UUIDs of every
version and variant."""

from __future__ import annotations

import random
import uuid

import numpy as np

from gazette_consumer.message.uuid import get_clock, get_flags, get_producer_id
from spark_integration.uuid_columns import UUID_TEXT_BYTES, parse_texts

GAZETTE = "2f1e0c1a-1d2c-11ef-8a05-0242ac120002"
HEX = set(b"0123456789abcdef")


def expected(text: bytes) -> tuple[bool, bool, int, int, int]:
    """(parsed, nil, producer, clock, flags) as parse_texts must give them."""
    canonical = len(text) == UUID_TEXT_BYTES and all(
        (c == ord("-")) if i in (8, 13, 18, 23) else (c in HEX) for i, c in enumerate(text)
    )
    if not canonical:
        return False, False, 0, 0, 0
    u = uuid.UUID(text.decode())
    if u.int == 0:
        return False, True, 0, 0, 0
    if u.version != 1 or u.variant != uuid.RFC_4122:
        return False, False, 0, 0, 0
    producer = int.from_bytes(bytes(get_producer_id(u)), "big")
    return True, False, producer, get_clock(u), get_flags(u)


def test_parse_texts_is_the_message_layers_parse() -> None:
    rng = random.Random(7)
    texts = [GAZETTE.encode(), b"0" * 8 + b"-0000-0000-0000-" + b"0" * 12]
    base = GAZETTE.encode()
    for i in range(UUID_TEXT_BYTES):
        for value in range(256):
            texts.append(base[:i] + bytes([value]) + base[i + 1 :])
    for _ in range(2000):
        texts.append(str(uuid.UUID(int=rng.getrandbits(128))).encode())
    matrix = np.frombuffer(b"".join(texts), np.uint8).reshape(-1, UUID_TEXT_BYTES)
    parts = parse_texts(matrix)
    got = list(
        zip(
            parts.parsed.tolist(),
            parts.nil.tolist(),
            parts.producers.tolist(),
            parts.clocks.tolist(),
            parts.flags.tolist(),
            strict=True,
        )
    )
    assert got == [expected(t) for t in texts]
    assert sum(p for p, *_ in got) > 100
