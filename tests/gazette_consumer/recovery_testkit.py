"""Shared pieces of the recovery-log shard tests: the word-count spec, its recovery log
journal, a text producer, and the counts a log holds (played into a fresh directory)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from broker.client.append_service import AppendService, AsyncAppend
from broker.client.route_cache import JournalClient
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels
from broker.protocol.recorded_op_pb2 import FSMHints
from examples.word_count import Text
from gazette_consumer.message.publisher import Publisher
from gazette_consumer.recoverylog.player import Player
from gazette_consumer.shard_spec import recovery_log
from gazette_consumer.stores.jsonfile import STATE_FILE
from tests.broker.broker_testkit import journal_spec
from tests.gazette_consumer.shard_testkit import BrokerEnv, shard_spec, to

LOG_PREFIX = "recovery/word-count"
HINT_PREFIX = "/test/hints"


def words_spec(shard_id: str, source: str, *, hint_backups: int = 2) -> cpb.ShardSpec:
    spec = shard_spec(shard_id, [source], max_txn_s=0.05)
    spec.recovery_log_prefix = LOG_PREFIX
    spec.hint_prefix = HINT_PREFIX
    spec.hint_backups = hint_backups
    return spec


async def create_log(env: BrokerEnv, spec: cpb.ShardSpec) -> str:
    """The spec's recovery log journal, created as an operator would."""
    name = recovery_log(spec)
    log_spec = journal_spec(name)
    log_spec.labels.CopyFrom(
        labels.label_set([(labels.CONTENT_TYPE, labels.CONTENT_TYPE_RECOVERY_LOG)])
    )
    await env.cluster.create(log_spec, [env.broker])
    return name


class Texts:
    """Publishes committed texts; `expected` counts their words."""

    def __init__(self, appends: AppendService) -> None:
        self.publisher: Publisher[AsyncAppend] = Publisher(appends)
        self.expected: Counter[str] = Counter()

    async def send(self, journal: str, texts: Sequence[str]) -> int:
        """Publish `texts`; return the journal offset through which they are committed."""
        end = 0
        for text in texts:
            appended = await self.publisher.publish_committed(to(journal), Text(text=text))
            end = max(end, (await appended).commit.end)
            self.expected.update(text.lower().split())
        return end


async def logged_counts(client: JournalClient, log: str, directory: Path) -> dict[str, int]:
    """The counts committed into `log`, as a player reads them back (read-only: no hand-off)."""
    player = Player(client, FSMHints(log=log), directory)
    player.finish_at_write_head()
    await player.play()
    document = json.loads((directory / STATE_FILE).read_bytes())
    return dict(document["state"].get("counts", {}))
