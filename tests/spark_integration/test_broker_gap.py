"""A gap between a journal's fragments, read through a broker (JournalSource, no Spark needed).

Found by audit (2026-11-30): fragments [0, 100) and [200, 300) in the store, [100, 200) never
persisted. A broker waits at such a gap until the fragment after it is 6 hours old (an upload
may still land), and a partition reading it through the broker waited as long, failOnDataLoss
or not, without an error. Now the read waits at most `gap_wait_s` (option
storeGapGraceSeconds) while the broker serves none of the gap, then reports it as lost content.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from broker.client.route_cache import JournalClient
from broker.fragment import naming
from broker.fragment.index import FragmentIndex
from broker.fragment.stores.registry import new_registry
from broker.protocol import protocol_pb2 as pb
from spark_integration.fragment_plan import broker_fragments
from spark_integration.sources import GazetteDataLossError, JournalSource
from tests.broker.broker_testkit import (
    Cluster,
    journal_spec,
    put_fragment,
    replica_of,
    wait_until,
)

STORE = "file:///fragments/"
JOURNAL = "gap/journal"
BEFORE, AFTER = b"a" * 99 + b"\n", b"c" * 99 + b"\n"
WAIT_S = 0.3


@contextlib.asynccontextmanager
async def served(
    tmp_path: Path, fragments: Sequence[tuple[int, bytes]]
) -> AsyncIterator[tuple[Path, FragmentIndex, JournalClient, list[pb.Fragment]]]:
    """JOURNAL served by one broker over a file:// store holding `fragments` (begin, content),
    listed once: the store's directory, the replica's index, a client, the stored fragments."""
    (tmp_path / "fragments").mkdir()
    registry = new_registry(file_root=tmp_path)
    stored = [await put_fragment(registry, STORE, JOURNAL, b, c) for b, c in fragments]
    cluster = Cluster(stores=registry)
    client: JournalClient | None = None
    try:
        broker = await cluster.start_broker("zone-a", "broker-a")
        await cluster.create(journal_spec(JOURNAL, stores=[STORE]), [broker])
        index = replica_of(broker, JOURNAL).index
        await index.first_refresh.wait()
        client = JournalClient(broker.endpoint)
        yield tmp_path / "fragments", index, client, stored
    finally:
        if client is not None:
            await client.close()
        await cluster.close()


async def read_all(source: JournalSource, fail: bool, match: str) -> list[tuple[int, bytes]]:
    """[0, 300) of `source`, as (offset, content) chunks: raising GazetteDataLossError matching
    `match` (checked) if `fail`. Bounded far beyond any wait of the source's."""
    got: list[tuple[int, bytes]] = []
    async with asyncio.timeout(30):
        if fail:
            with pytest.raises(GazetteDataLossError, match=match):
                async for chunk in source.chunks(0, 300):
                    got.append((chunk.offset, chunk.content))
        else:
            async for chunk in source.chunks(0, 300):
                got.append((chunk.offset, chunk.content))
    return got


@pytest.mark.parametrize("fail", [True, False], ids=["fail", "skip"])
async def test_a_gap_the_broker_serves_none_of_is_lost_content_after_the_wait(
    tmp_path: Path, fail: bool
) -> None:
    async with served(tmp_path, [(0, BEFORE), (200, AFTER)]) as (_, _index, client, _stored):
        planned = await broker_fragments(client, JOURNAL, 0)
        assert [(f.begin, f.end) for f in planned.fragments] == [(0, 100), (200, 300)]
        source = JournalSource(
            JOURNAL,
            planned.fragments,
            client=client,
            registry=None,
            fail_on_data_loss=fail,
            gap_wait_s=WAIT_S,
        )
        # Without the wait's bound, this read waits for hours.
        match = r"\[100, 200\).*served none of for 0\.3 s.*storeGapGraceSeconds"
        got = await read_all(source, fail, match)
    assert got == ([(0, BEFORE)] if fail else [(0, BEFORE), (200, AFTER)])
    assert source.lost_bytes == (0 if fail else 100)


@pytest.mark.parametrize("fail", [True, False], ids=["fail", "skip"])
async def test_a_fragment_lost_between_others_is_skipped_unless_failing(
    tmp_path: Path, fail: bool
) -> None:
    """Found by audit (2026-11-30): a fragment file removed from between others, which the
    broker then reports lost (DATA_LOSS), failed a read with failOnDataLoss false ("no
    fragment covers it to skip"): the range to skip ends where the next fragment begins."""
    middle = b"b" * 99 + b"\n"
    content = [(0, BEFORE), (100, middle), (200, AFTER)]
    async with served(tmp_path, content) as (directory, index, client, stored):
        (directory / naming.content_path(stored[1])).unlink()
        await wait_until(lambda: [(f.begin, f.end) for f in index.lost_fragments()] == [(100, 200)])
        planned = await broker_fragments(client, JOURNAL, 0)
        source = JournalSource(
            JOURNAL, planned.fragments, client=client, registry=None, fail_on_data_loss=fail
        )
        got = await read_all(source, fail, r"\[100, 200\)")
    assert got == ([(0, BEFORE)] if fail else [(0, BEFORE), (200, AFTER)])
    assert source.lost_bytes == (0 if fail else 100)


def test_the_wait_must_be_positive() -> None:
    with pytest.raises(ValueError, match="gap_wait_s: must be > 0"):
        JournalSource(JOURNAL, [], client=None, registry=None, fail_on_data_loss=True, gap_wait_s=0)
