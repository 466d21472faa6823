"""Recovery: a restored checkpoint's ACK intents are re-written before the shard consumes, which
commits the transaction they acknowledge and rolls back what its producer began after it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from broker.client.append_service import AsyncAppend
from broker.protocol import consumer_pb2 as cpb
from broker.server import Broker
from gazette_consumer.application import Shard
from gazette_consumer.checkpoint import from_sequencer_checkpoint
from gazette_consumer.message.message import Envelope
from gazette_consumer.message.publisher import Publisher
from gazette_consumer.message.uuid import Flag, get_flags, get_producer_id
from gazette_consumer.sequencer.types import SequencerCheckpoint
from gazette_consumer.shard_runner import ShardRunner
from gazette_consumer.stores.base import Store
from gazette_consumer.stores.conformance import SimpleShard
from gazette_consumer.stores.sql import SQLStore
from tests.gazette_consumer.shard_testkit import (
    CountingApp,
    Event,
    Notifier,
    Producer,
    journal_frames,
    read_committed,
    shard_env,
    shard_spec,
    to,
)

ROOT = "/test/recovery"


@dataclass
class AckCheckingApp(CountingApp):
    """Records, for each message it consumes, the producers whose ACKs `output` then held."""

    broker: Broker | None = None
    acks_seen: list[set[bytes]] = field(default_factory=list)

    async def consume_message(
        self, shard: Shard, store: Store, envelope: Envelope[Any], publisher: Publisher[AsyncAppend]
    ) -> None:
        assert self.broker is not None and self.output is not None
        frames = journal_frames(self.broker, self.output)
        self.acks_seen.append(
            {get_producer_id(f.uuid) for f in frames if get_flags(f.uuid) == Flag.ACK_TXN}
        )
        await super().consume_message(shard, store, envelope, publisher)


async def test_recovered_ack_intents_are_rewritten_before_consuming(tmp_path: Path) -> None:
    async with shard_env(tmp_path) as (env, engine, appends):
        source = await env.journal("in/recovery")
        output = await env.journal("out/recovery")
        fqn = f"{ROOT}/items/shard-r"

        # A previous primary published two messages in transaction N and committed N's
        # checkpoint, with its ACK intent, but died before appending the ACK...
        previous: Publisher[AsyncAppend] = Publisher(appends)
        for text in ("n-1", "n-2"):
            await previous.publish_uncommitted(to(output), Event(key="n", text=text))
        intents = previous.build_ack_intents()
        # ...after transaction N+1 had published one more message.
        await previous.publish_uncommitted(to(output), Event(key="n+1", text="n+1"))
        await appends.flush()

        store = SQLStore(engine)
        await store.restore_checkpoint(SimpleShard(fqn))
        checkpoint = from_sequencer_checkpoint(SequencerCheckpoint({source: 0}), intents)
        await (await store.start_commit(SimpleShard(fqn), checkpoint, []))
        await store.destroy()
        assert not any(
            get_flags(f.uuid) == Flag.ACK_TXN for f in journal_frames(env.broker, output)
        )

        app = AckCheckingApp(engine, output=output, broker=env.broker)
        changed = Notifier()
        producer = Producer(appends, "p")
        async with ShardRunner(app, env.client, root=ROOT) as runner:
            handle = runner.start(shard_spec("shard-r", [source]), on_change=changed.notify)
            assert handle.fqn == fqn
            await changed.until(lambda: handle.status().code == cpb.ReplicaStatus.PRIMARY)
            # Recovery alone (no message consumed yet) wrote the ACK, exactly as committed.
            acks = [
                f for f in journal_frames(env.broker, output) if get_flags(f.uuid) == Flag.ACK_TXN
            ]
            assert [f.uuid for f in acks] == [_decode(intents[output]).uuid]
            assert handle.progress().publish_at[output] > 0

            end = (await (await producer.committed(source, "k"))).commit.end
            await changed.until(lambda: handle.progress().read_through.get(source, 0) >= end)
        # When it consumed its first message, the recovered ACK was already in the journal.
        assert previous.producer_id in app.acks_seen[0]

        # Downstream: N's messages are committed; N+1's was rolled back by the re-written ACK.
        await producer.committed_together(output, [Event(key="end", text="marker")])
        derived = await read_committed(env.client, output, until_text="marker")
        texts = [e.message.text for e in derived]
        assert texts[:2] == ["n-1", "n-2"]
        assert "n+1" not in texts
        assert texts[-1] == "marker"


def _decode(frame: bytes) -> Event:
    return msgspec.json.decode(frame.rstrip(b"\n"), type=Event)
