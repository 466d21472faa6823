"""The streaming sink's tasks and commits into a CSV journal, against a real broker (no
SparkSession): every record in the journal, the driver's and the tasks' ACKs and rollbacks
included, is a CSV record as wide as the rows (readers require it), and each micro-batch is
committed once across a failed attempt, a task that rolls itself back and a restarted run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from broker.protocol import labels
from gazette_consumer.message.clock import clock_from_unix_nanos
from gazette_consumer.message.csv_framing import parse_record
from spark_integration.framings import decoder_factory
from spark_integration.journal_io import write_head
from spark_integration.publish import PublishedTxn, RowShape, publish_batches, publish_rows
from spark_integration.range_read import CommittedRange, read_uncommitted
from spark_integration.sink_commit import BatchTxns, commit_batch
from spark_integration.sink_task import TaskIdentity
from spark_integration.sources import JournalSource
from tests.gazette_consumer.sequencer.read_iter_testkit import Env

Q = "33333333-3333-3333-3333-333333333333"
CSV = labels.CONTENT_TYPE_CSV


def _source(env: Env, journal: str) -> JournalSource:
    return JournalSource(journal, (), client=env.client, registry=None, fail_on_data_loss=True)


async def _records(env: Env, journal: str, *, committed: bool) -> list[list[str]]:
    """The journal's records (committed ones, or all), decoded by the reader's CSV framing,
    which fails on a record of another width than the first."""
    head = await write_head(env.client, journal)
    decoder = decoder_factory(CSV)
    if committed:
        walk = CommittedRange(_source(env, journal), 0, head, ring_size=64, new_decoder=decoder)
        batches = [b async for b in walk.batches()]
    else:
        batches = [b async for b in read_uncommitted(_source(env, journal), 0, head, decoder)]
    return [parse_record(text) for b in batches for text in b.content.to_pylist()]


def _shape(journal: str) -> RowShape:
    # No content-types known: the task looks the journal's label up, as for a journal column.
    return RowShape(content_column=False, journal_column=False, journal=journal)


async def _task(
    env: Env,
    journal: str,
    run: str,
    batch: int,
    base: int,
    partition: int,
    texts: list[str],
    attempt: int = 0,
) -> PublishedTxn:
    rows = iter([{"text": t, "n": i} for i, t in enumerate(texts)])
    task = TaskIdentity(Q, run, batch, partition, attempt)
    return await publish_rows(env.client, _shape(journal), rows, base, task)


async def test_micro_batches_commit_once_in_a_csv_journal(env: Env) -> None:
    journal = await env.journal("sink/csv", CSV)
    base = clock_from_unix_nanos(time.time_ns())

    # Run 1, micro-batch 5: partition 0's first attempt published and died; its retry won.
    await _task(env, journal, "run-1", 5, base, 0, ["lost-0"])
    winners = [
        await _task(env, journal, "run-1", 5, base, 0, ["b5-0"], attempt=1),
        await _task(env, journal, "run-1", 5, base, 1, ["b5-1"]),
    ]
    txns = BatchTxns.of(winners, 5)
    assert txns is not None
    await commit_batch(env.client, txns)
    # Micro-batch 6 published, then run 1's driver died.
    base += 1_000_000
    for p in (0, 1):
        await _task(env, journal, "run-1", 6, base, p, [f"dead-{p}"])

    # Run 2 runs micro-batch 6 again: its commit closes what run 1 left open.
    base += 1_000_000
    again = [await _task(env, journal, "run-2", 6, base, p, [f"b6-{p}"]) for p in (0, 1)]
    txns = BatchTxns.of(again, 6)
    assert txns is not None
    await commit_batch(env.client, txns)

    committed = await _records(env, journal, committed=True)
    assert sorted(r[1] for r in committed) == ["b5-0", "b5-1", "b6-0", "b6-1"]
    every = await _records(env, journal, committed=False)
    assert {len(r) for r in every} == {3}  # The UUID, text and n: ACKs too.
    acks = [r for r in every if r[1:] == ["", ""]]
    # Per micro-batch commit: 2 winners' ACKs + 1 rollback of the dead attempt's claim (5), 2
    # ACKs + 2 closing run 1's open transactions, by their claims (6).
    assert len(acks) == 7


async def test_a_failed_task_rolls_back_with_csv_records(env: Env) -> None:
    journal = await env.journal("sink/csv-fail", CSV)
    base = clock_from_unix_nanos(time.time_ns())
    pad = "x" * 60_000  # 20 rows: past the 1 MiB buffer, so they are appended before failing.

    def batches() -> Iterator[pa.RecordBatch]:
        yield pa.RecordBatch.from_pylist([{"text": f"f-{i}", "pad": pad} for i in range(20)])
        yield pa.RecordBatch.from_pylist([{"text": f"g-{i}", "pad": pad} for i in range(20)])
        raise RuntimeError("the task fails")

    task = TaskIdentity(Q, "run-1", 0, 0, 0)
    with pytest.raises(RuntimeError, match="the task fails"):
        await publish_batches(env.client, _shape(journal), batches(), base, task)

    every: list[Any] = await _records(env, journal, committed=False)
    assert len(every) > 1 and {len(r) for r in every} == {3}
    assert every[-1][1:] == ["", ""]  # Its own rollback, as wide as its rows.
    assert await _records(env, journal, committed=True) == []
