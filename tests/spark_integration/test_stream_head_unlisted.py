"""A broker that has not listed its fragment store yet is not a journal that lost content.

Right after a broker starts, its non-blocking reads answer a write head that does not count
its store's fragments. The streaming source took a head below the query's offset for a
journal deleted and created again: with failOnDataLoss (the default) the query failed with a
data-loss error (the first test fails so without the confirmation), and with failOnDataLoss
false it could read the whole journal again from its first offset (every row delivered twice:
where the journal's other replicas answer the listing that plans it; here the one broker's
listing waits, so that variant shows only that nothing is re-read). Now a low head is confirmed by the fragment listing, which
waits for the store (broker.client.write_head.confirm_write_head): while the store cannot be
listed the plan fails UNAVAILABLE (retryable), and once it can, nothing is lost or re-read.

The broker runs in this process, on an event loop of its own thread: the reader, as Spark
drives it, runs its own loop in the calling thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from broker.client.route_cache import JournalClient
from broker.fragment.stores.registry import StoreRegistry
from broker.protocol import labels
from spark_integration import offsets
from spark_integration.fragment_plan import broker_fragments
from spark_integration.offsets import JournalOffset
from spark_integration.read_options import parse_read_options
from spark_integration.rows import META_SCHEMA
from spark_integration.sources import GazetteDataLossError
from spark_integration.stream_read import GazetteStreamReader
from tests.broker.broker_testkit import Cluster, GatedListing, journal_spec, put_fragment

pytestmark = pytest.mark.spark

T = TypeVar("T")
JOURNAL = "spark/unlisted"
STORE = "file:///frags/"
CONTENT = b'{"text": "stored"}\n' * 50


class LoopThread:
    """An event loop running in a thread of its own, for an in-process broker."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


class Unlisted:
    """An in-process broker serving JOURNAL, whose one fragment [0, len(CONTENT)) is in a
    store the broker has not listed until `open_store()`."""

    def __init__(self, tmp_path: Path, loop: LoopThread) -> None:
        self.loop = loop
        self.endpoint = loop.run(self._start(tmp_path))

    async def _start(self, tmp_path: Path) -> str:
        (tmp_path / "frags").mkdir()
        self.opened = asyncio.Event()
        registry = StoreRegistry({"file": lambda url: GatedListing(url, tmp_path, self.opened)})
        await put_fragment(registry, STORE, JOURNAL, 0, CONTENT)
        self.cluster = Cluster(stores=registry)
        broker = await self.cluster.start_broker("zone-a", "broker-a", fragments_listing_wait_s=0.2)
        spec = journal_spec(JOURNAL, stores=[STORE])
        spec.labels.CopyFrom(
            labels.label_set([(labels.CONTENT_TYPE, labels.CONTENT_TYPE_JSON_LINES)])
        )
        await self.cluster.create(spec, [broker])
        return broker.endpoint

    def open_store(self) -> None:
        self.loop.loop.call_soon_threadsafe(self.opened.set)

    def close(self) -> None:
        self.loop.run(self.cluster.close())


@pytest.fixture
def unlisted(tmp_path: Path) -> Iterator[Unlisted]:
    loop = LoopThread()
    broker = Unlisted(tmp_path, loop)
    try:
        yield broker
    finally:
        broker.close()
        loop.close()


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_a_low_head_of_an_unlisted_broker_is_not_data_loss(
    unlisted: Unlisted, fail_on_data_loss: str
) -> None:
    options = {
        "broker": unlisted.endpoint,
        "journals": JOURNAL,
        "idleWaitMs": "0",
        "failOnDataLoss": fail_on_data_loss,
    }
    reader = GazetteStreamReader(parse_read_options(options, "stream"), META_SCHEMA)
    # The query read all of the stored content before the broker (re)started.
    start = offsets.to_json({JOURNAL: JournalOffset.at(JOURNAL, len(CONTENT))})
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        reader.latestOffset(start, ReadAllAvailable())
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "not listed yet" in str(failed.value.details())
    unlisted.open_store()
    # Nothing new: the start offset as it is (not a data-loss error, not a re-read from 0).
    assert reader.latestOffset(start, ReadAllAvailable()) == start


def test_content_truly_gone_is_still_data_loss(unlisted: Unlisted) -> None:
    unlisted.open_store()
    options = {"broker": unlisted.endpoint, "journals": JOURNAL, "idleWaitMs": "0"}
    reader = GazetteStreamReader(parse_read_options(options, "stream"), META_SCHEMA)
    start = offsets.to_json({JOURNAL: JournalOffset.at(JOURNAL, len(CONTENT) + 10)})
    with pytest.raises(GazetteDataLossError, match=f"journal {JOURNAL}: content"):
        reader.latestOffset(start, ReadAllAvailable())


def test_a_batch_plan_never_ends_below_the_listed_content(unlisted: Unlisted) -> None:
    """A batch read takes each journal's head from a non-blocking read, which an unlisted
    broker answers too low: planned to it, the read left out committed content without an
    error. The listing it plans partitions from waits for the store, and raises the head."""
    unlisted.open_store()

    async def plan() -> int:
        client = JournalClient(unlisted.endpoint)
        try:
            return (await broker_fragments(client, JOURNAL, 0)).head  # A head read too low.
        finally:
            await client.close()

    assert asyncio.run(plan()) == len(CONTENT)


def test_available_now_captures_every_committed_offset(unlisted: Unlisted) -> None:
    """Trigger.AvailableNow reads what is committed when the query starts: a head captured
    from an unlisted broker made the query end early, the rest unread without an error."""
    options = {"broker": unlisted.endpoint, "journals": JOURNAL, "idleWaitMs": "0"}
    reader = GazetteStreamReader(parse_read_options(options, "stream"), META_SCHEMA)
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        reader.prepareForTriggerAvailableNow()  # The store cannot be listed: no guess.
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    unlisted.open_store()
    reader.prepareForTriggerAvailableNow()
    end = offsets.from_json(reader.latestOffset(reader.initialOffset(), ReadAllAvailable()))
    assert end[JOURNAL].offset(JOURNAL) == len(CONTENT)
