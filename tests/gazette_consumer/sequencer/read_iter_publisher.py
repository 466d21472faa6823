"""A publisher process for the killed-publisher test: it appends CONTINUE_TXN messages of one
producer to a journal, one append each, reports the offsets they landed at, then waits to be
killed (SIGKILL) before it could append the ACK_TXN that would commit them.

    python read_iter_publisher.py ENDPOINT JOURNAL PRODUCER_HEX FIRST_CLOCK COUNT
"""

from __future__ import annotations

import asyncio
import sys

from broker.client.appender import append
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message import Flag, JSONFraming, JSONMessage, build_uuid
from gazette_consumer.message.uuid import producer_id


class Msg(JSONMessage, kw_only=True):
    text: str = ""


async def publish(endpoint: str, journal: str, producer: bytes, first: int, count: int) -> None:
    client = JournalClient(endpoint)
    framing = JSONFraming()
    offsets = []
    for i in range(count):
        uuid = build_uuid(producer_id(producer), first + i, Flag.CONTINUE_TXN)
        content = framing.marshal(Msg(uuid=uuid, text=f"pending-{i}"))
        response = await append(client, pb.AppendRequest(journal=journal), content)
        offsets.append(f"{response.commit.begin}-{response.commit.end}")
    print("appended", *offsets, flush=True)


def main() -> None:
    endpoint, journal, producer_hex, first, count = sys.argv[1:6]
    asyncio.run(publish(endpoint, journal, bytes.fromhex(producer_hex), int(first), int(count)))
    # Crash here, between the pending messages and their ACK: the test kills us while we wait.
    sys.stdin.read()


if __name__ == "__main__":
    main()
