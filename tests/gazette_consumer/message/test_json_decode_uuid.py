"""JSONDecoder.decode_uuids: payloads' UUIDs alone, for the messages a reader only sequences
(`ChunkDecoder.feed_continuing`), offered only where it reads what a whole decode would."""

from __future__ import annotations

from uuid import UUID

import msgspec
import pytest

from gazette_consumer.message import JSONFraming, JSONMessage, build_uuid
from gazette_consumer.message.json_framing import JSONDecoder
from gazette_consumer.message.uuid import producer_id

U = build_uuid(producer_id(bytes.fromhex("010000000001")), 1 << 40, 1)


class Plain(JSONMessage, kw_only=True):
    text: str = ""


class Renamed(JSONMessage, kw_only=True, rename="upper"):
    text: str = ""


class Listed(JSONMessage, kw_only=True, array_like=True):
    text: str = ""


class OwnUUID(JSONMessage, kw_only=True):
    def get_uuid(self) -> UUID | None:
        return None


@pytest.mark.parametrize("message_type", [Plain, Renamed])
def test_decode_uuid_reads_the_uuid_a_whole_decode_reads(message_type: type[Plain]) -> None:
    payload = JSONFraming().marshal(message_type(uuid=U, text="x"))[:-1]
    decoder = JSONDecoder(message_type)
    decode_uuids = decoder.decode_uuids
    assert decode_uuids is not None
    assert list(decode_uuids([payload])) == [U] == [decoder._decoder.decode(payload).uuid]
    # Only the UUID is decoded: a field of the wrong type goes unnoticed here.
    mistyped = payload.replace(b'"x"', b"5")
    assert list(decode_uuids([mistyped, payload])) == [U, U]
    with pytest.raises(msgspec.ValidationError):
        decoder._decoder.decode(mistyped)
    # But not the UUID's; and payloads are decoded as they are asked for.
    uuids = decode_uuids([payload, payload.replace(str(U).encode(), b"not-a-uuid")])
    assert next(uuids) == U
    with pytest.raises(msgspec.ValidationError):
        next(uuids)


@pytest.mark.parametrize("message_type", [Listed, OwnUUID, dict])
def test_decode_uuid_is_none_where_it_could_read_otherwise(message_type: type) -> None:
    assert JSONDecoder(message_type).decode_uuids is None
