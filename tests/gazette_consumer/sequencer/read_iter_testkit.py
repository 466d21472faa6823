"""Shared fixtures of the read iterator tests: an in-process broker with framed journals, and
messages with hand-built UUIDs appended raw (no Publisher), so tests control every clock and flag.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, Self
from uuid import UUID

from broker.client.appender import append
from broker.client.route_cache import JournalClient
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from broker.server import Broker
from gazette_consumer.message import (
    CONTENT_TYPE_JSON_LINES,
    CONTENT_TYPE_PROTO_FIXED,
    NIL_UUID,
    FixedFraming,
    Flag,
    JSONFraming,
    JSONMessage,
    ProducerID,
    build_uuid,
)
from gazette_consumer.message.uuid import producer_id
from tests.broker.broker_testkit import Cluster, journal_spec

OUTSIDE, CONTINUE, ACK = Flag.OUTSIDE_TXN, Flag.CONTINUE_TXN, Flag.ACK_TXN

P1 = producer_id(bytes.fromhex("010000000001"))
P2 = producer_id(bytes.fromhex("010000000002"))
P3 = producer_id(bytes.fromhex("010000000003"))
MARKER = producer_id(bytes.fromhex("01000000ffff"))


class Msg(JSONMessage, kw_only=True):
    """A JSON test message; `text` identifies it in assertions."""

    text: str = ""


def msg(producer: ProducerID, clock: int, flags: int, text: str = "") -> Msg:
    return Msg(uuid=build_uuid(producer, clock, flags), text=text)


JSON = JSONFraming()


def frames(*messages: Msg) -> bytes:
    return b"".join(JSON.marshal(m) for m in messages)


class FixedMsg:
    """A fixed-framed test message: the 16 UUID bytes, then the text (UTF-8)."""

    def __init__(self, uuid: UUID | None = None, text: str = "") -> None:
        self.uuid = uuid if uuid is not None else NIL_UUID
        self.text = text

    @classmethod
    def FromString(cls, data: bytes) -> Self:
        if len(data) < 16:
            raise ValueError(f"FixedMsg needs 16 UUID bytes (got {len(data)} bytes)")
        return cls(UUID(bytes=data[:16]), data[16:].decode())

    def SerializeToString(self) -> bytes:
        return self.uuid.bytes + self.text.encode()

    def get_uuid(self) -> UUID | None:
        return None if self.uuid == NIL_UUID else self.uuid

    def set_uuid(self, uuid: UUID) -> None:
        self.uuid = uuid

    def new_acknowledgement(self, journal: str) -> FixedMsg:
        return FixedMsg()


FIXED = FixedFraming()


def fixed(producer: ProducerID, clock: int, flags: int, text: str = "") -> bytes:
    return FIXED.marshal(FixedMsg(build_uuid(producer, clock, flags), text))


@dataclass
class Env:
    cluster: Cluster
    broker: Broker
    client: JournalClient

    async def journal(self, name: str, content_type: str | None = CONTENT_TYPE_JSON_LINES) -> str:
        spec = journal_spec(name)
        if content_type is not None:
            spec.labels.CopyFrom(labels.label_set([(labels.CONTENT_TYPE, content_type)]))
        await self.cluster.create(spec, [self.broker])
        return name

    async def fixed_journal(self, name: str) -> str:
        return await self.journal(name, CONTENT_TYPE_PROTO_FIXED)

    async def append(self, journal: str, content: bytes) -> pb.AppendResponse:
        """One append transaction; returns the response (commit.begin/end are its offsets)."""
        return await append(self.client, pb.AppendRequest(journal=journal), content)

    async def append_messages(self, journal: str, messages: Iterable[Msg]) -> tuple[int, int]:
        response = await self.append(journal, frames(*messages))
        return response.commit.begin, response.commit.end


@contextlib.asynccontextmanager
async def broker_env() -> AsyncIterator[Env]:
    """One in-process broker (R=1) on loopback, and a client of it."""
    cluster = Cluster()
    broker = await cluster.start_broker("zone-a", "broker-a")
    client = JournalClient(broker.endpoint)
    try:
        yield Env(cluster, broker, client)
    finally:
        await client.close()
        await cluster.close()


def texts(envelopes: Iterable[Any]) -> list[str]:
    return [e.message.text for e in envelopes]
