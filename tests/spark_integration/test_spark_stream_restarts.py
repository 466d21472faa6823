"""The streaming source across the restarts and option changes a Spark user makes: each
committed message delivered once, or a typed error, never a silent loss or repeat (issue #14).

Checkpoints are made from real runs' (test_spark_streaming.py does the same): a query that died
after Spark logged micro-batch N but before N committed is one whose offset log ends at N and
commit log at N - 1. Rows are collected by a foreachBatch sink as (micro-batch, journal, text);
the sink's own guarantees are test_spark_sink.py's."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from broker.client import JournalClient, apply_journals, upsert
from broker.client.list_apply import get_journal
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message.clock import clock_from_unix_nanos
from tests.spark_integration.spark_testkit import (
    ACK,
    CONTINUE,
    OUTSIDE,
    Msg,
    append_messages,
    create_journals,
    producer,
    unique,
    wait_replica_stopped,
)
from tests.spark_integration.test_spark_store_read import (  # The fixture, and its helpers.
    _contiguous_end,
    _persisted,
    stopped_store,  # noqa: F401 (a fixture: pytest finds it here)
)

pytestmark = pytest.mark.spark

Row = tuple[int, str, str | None]  # (micro-batch, journal, text), as the sink saw them.


def run(
    spark: Any,
    checkpoint: Path,
    *,
    available_now: bool = False,
    **options: str,
) -> list[Row]:
    """Run a query of the gazette source with `options` from `checkpoint` until it has
    processed what there is (or, with `available_now`, until it stops); its rows."""
    delivered: list[Row] = []

    def collect(frame: Any, batch_id: int) -> None:
        delivered.extend(
            (batch_id, r.journal, json.loads(r.content).get("text")) for r in frame.collect()
        )

    stream = spark.readStream.format("gazette")
    for name, value in options.items():
        stream = stream.option(name, value)
    writer = (
        stream.load()
        .selectExpr("journal", "content")
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
    )
    query = (writer.trigger(availableNow=True) if available_now else writer).start()
    try:
        if available_now:
            assert query.awaitTermination(120)
            if query.exception() is not None:
                raise query.exception()
        else:
            query.processAllAvailable()
    finally:
        query.stop()
    return delivered


def rewind(checkpoint: Path, batch: int) -> None:
    """Make `checkpoint` that of a query that died after logging micro-batch `batch`, before it
    committed: offset log entries after it and commit records from it on go (checksums too)."""
    for log, first in (("offsets", batch + 1), ("commits", batch)):
        for record in (checkpoint / log).iterdir():
            if int(record.name.strip(".").removesuffix(".crc")) >= first:
                record.unlink()


def texts(rows: list[Row]) -> list[str | None]:
    return sorted((text for _, _, text in rows), key=str)


class Journal:
    """A journal and its producers' clocks, for appending messages one by one."""

    def __init__(self, broker: str, name: str) -> None:
        self.broker, self.name = broker, name
        self.clock = clock_from_unix_nanos(time.time_ns())

    def add(self, p: bytes, flags: Any, text: str | None = None, *, clock: int = 0) -> None:
        if not clock:
            self.clock += 1
            clock = self.clock
        fields = {"text": text} if text is not None else None
        append_messages(self.broker, self.name, [Msg(p, clock, flags, fields)])


def test_re_run_of_a_rate_limited_micro_batch_with_an_open_transaction(
    spark: Any, broker: str, tmp_path: Path
) -> None:
    """maxMessagesPerTrigger, a transaction whose messages span micro-batches, and a query
    that died after logging a micro-batch the transaction is open across (pending at its start
    and end): restarted with Trigger.AvailableNow, that micro-batch delivers what it did
    before, and later ones the rest (the transaction whole, at its ACK), once."""
    journal = unique("spark/restart-limit")
    create_journals(broker, [journal])
    j, a, b = Journal(broker, journal), producer(), producer()
    j.add(a, OUTSIDE, "a1")
    j.add(b, CONTINUE, "b1")
    j.add(a, OUTSIDE, "a2")
    j.add(b, CONTINUE, "b2")
    j.add(a, OUTSIDE, "a3")
    j.add(b, ACK)
    j.add(a, OUTSIDE, "a4")
    options = {"broker": broker, "journals": journal, "maxMessagesPerTrigger": "2"}
    checkpoint = tmp_path / "cp"
    first = run(spark, checkpoint, **options)
    assert texts(first) == ["a1", "a2", "a3", "a4", "b1", "b2"]
    (acked,) = {batch for batch, _, text in first if text == "b1"}
    assert acked > min(batch for batch, _, text in first if text == "a1")  # It spanned.
    crashed = acked - 1  # b1 before it, b2 in it, the ACK after it.
    rewind(checkpoint, crashed)
    j.add(a, OUTSIDE, "a5")

    again = run(spark, checkpoint, available_now=True, **options)

    assert sorted(r for r in again if r[0] == crashed) == sorted(
        r for r in first if r[0] == crashed
    )
    assert texts(again) == sorted([*(t for b, _, t in first if b >= crashed), "a5"], key=str)


@pytest.mark.parametrize("starting", ["json-latest", "timestamp"])
def test_re_run_of_micro_batch_0_started_at_a_json_offset_or_a_timestamp(
    spark: Any, broker: str, tmp_path: Path, starting: str
) -> None:
    """As test_spark_streaming.py's re-run of micro-batch 0 started at `latest`, with
    startingOffsets {journal: -1} and with startingTimestamp (a message with an earlier clock
    appended after the query started is read, as Kafka's source reads it; asked again at the
    restart the timestamp's offset is a later message's)."""
    journal = unique("spark/restart-start")
    create_journals(broker, [journal])
    j, p = Journal(broker, journal), producer()
    now_ns = time.time_ns()
    j.add(p, OUTSIDE, "before-start", clock=clock_from_unix_nanos(now_ns - 20 * 10**9))
    options = {"broker": broker, "journals": journal}
    if starting == "timestamp":
        options["startingTimestamp"] = str(now_ns // 10**6)
    else:
        options["startingOffsets"] = json.dumps({journal: -1})
    checkpoint = tmp_path / "cp"
    assert run(spark, checkpoint, **options) == []
    j.add(p, OUTSIDE, "a1", clock=clock_from_unix_nanos(now_ns - 10 * 10**9))
    j.add(p, OUTSIDE, "a2", clock=clock_from_unix_nanos(now_ns + 10**9))
    first = run(spark, checkpoint, **options)
    assert texts(first) == ["a1", "a2"]
    (batch,) = {batch for batch, _, _ in first}
    offsets, commits = checkpoint / "offsets", checkpoint / "commits"
    (offsets / "0").write_text((offsets / str(batch)).read_text())
    for log in (offsets, commits):
        for record in log.iterdir():
            if record.name != "0" or log == commits:
                record.unlink()
    j.add(p, OUTSIDE, "b1", clock=clock_from_unix_nanos(now_ns + 2 * 10**9))

    again = run(spark, checkpoint, **options)

    assert [(b, t) for b, _, t in again] == [(0, "a1"), (0, "a2"), (1, "b1")]


def relabel(broker: str, journal: str, test: str) -> None:
    """Set `journal`'s label "test" (what the tests' selectors select on) to `test`."""

    async def go() -> None:
        client = JournalClient(broker)
        try:
            spec = await get_journal(client, journal)
            for label in spec.labels.labels:
                if label.name == "test":
                    label.value = test
            await apply_journals(client, [upsert(spec, expect_mod_revision=-1)])
        finally:
            await client.close()

    asyncio.run(go())


def delete_journal(broker: str, journal: str) -> None:
    """Delete `journal`, and wait until `broker` has stopped its replica (so that the journal,
    created again, starts empty: see `wait_replica_stopped`)."""

    async def go() -> None:
        client = JournalClient(broker)
        try:
            await apply_journals(
                client, [pb.ApplyRequest.Change(delete=journal, expect_mod_revision=-1)]
            )
        finally:
            await client.close()

    asyncio.run(go())
    wait_replica_stopped(broker, journal)


def test_a_journal_out_of_the_selection_and_back_is_read_on_from_where_it_was(
    spark: Any, broker: str, tmp_path: Path
) -> None:
    """A selector query: a journal relabelled out of the selection while the query is down (it
    runs on without it), then back in: it is read on from where the query left it, not again
    from its beginning."""
    one, two = unique("spark/restart-sel"), unique("spark/restart-sel")
    create_journals(broker, [one, two])
    tag_one, tag_two = one.split("/")[-1], two.split("/")[-1]
    j1, j2, p = Journal(broker, one), Journal(broker, two), producer()
    options = {"broker": broker, "selector": f"test in ({tag_one}, {tag_two})"}
    checkpoint = tmp_path / "cp"
    j1.add(p, OUTSIDE, "one-1")
    j2.add(p, OUTSIDE, "two-1")
    delivered = run(spark, checkpoint, **options)
    relabel(broker, one, tag_one + "-out")
    j1.add(p, OUTSIDE, "one-2")  # Appended while out of the selection.
    j2.add(p, OUTSIDE, "two-2")
    delivered += run(spark, checkpoint, **options)
    relabel(broker, one, tag_one)
    j1.add(p, OUTSIDE, "one-3")
    delivered += run(spark, checkpoint, **options)

    assert texts(delivered) == ["one-1", "one-2", "one-3", "two-1", "two-2"]


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
@pytest.mark.parametrize("chosen_by", ["selector", "journals"])
def test_a_deleted_journal_is_data_loss(
    spark: Any, broker: str, tmp_path: Path, fail_on_data_loss: str, chosen_by: str
) -> None:
    """A query whose journal is deleted while the query is down, with content the query had
    not read: as Kafka's source with a partition gone, the query fails naming the journal
    (failOnDataLoss true), or runs on without it (false), restart after restart, and reads it
    from its first offset once it is created again. The same whether the journal was chosen
    by a selector or named by option journals (named, a missing journal was a configuration
    error whatever failOnDataLoss said)."""
    one, two = unique("spark/restart-del"), unique("spark/restart-del")
    create_journals(broker, [one, two])
    tag_one, tag_two = one.split("/")[-1], two.split("/")[-1]
    j1, j2, p = Journal(broker, one), Journal(broker, two), producer()
    chosen = (
        {"selector": f"test in ({tag_one}, {tag_two})"}
        if chosen_by == "selector"
        else {"journals": f"{one},{two}"}
    )
    options = {"broker": broker, **chosen, "failOnDataLoss": fail_on_data_loss}
    checkpoint = tmp_path / "cp"
    j1.add(p, OUTSIDE, "one-1")
    j2.add(p, OUTSIDE, "two-1")
    assert texts(run(spark, checkpoint, **options)) == ["one-1", "two-1"]
    j1.add(p, OUTSIDE, "one-2")  # Never read: its journal is deleted.
    delete_journal(broker, one)
    j2.add(p, OUTSIDE, "two-2")

    if fail_on_data_loss == "true":
        with pytest.raises(Exception, match=rf"GazetteJournalDeletedError: journal {one}: deleted"):
            run(spark, checkpoint, **options)
        return
    assert texts(run(spark, checkpoint, **options)) == ["two-2"]
    j2.add(p, OUTSIDE, "two-3")
    assert texts(run(spark, checkpoint, **options)) == ["two-3"]
    # Created again, past the old offset before the query looks: read from its beginning.
    create_journals(broker, [one])
    for text in ("new-1", "new-2", "new-3"):
        j1.add(p, OUTSIDE, text)
    assert texts(run(spark, checkpoint, **options)) == ["new-1", "new-2", "new-3"]


def test_isolation_changed_across_a_restart_is_refused(
    spark: Any, broker: str, tmp_path: Path
) -> None:
    """A read-committed query restarted read-uncommitted, with a transaction open at its
    offset: the transaction's messages before the offset would be delivered by neither run
    (read-committed delivers them at the ACK, read-uncommitted from the offset on). The
    restart is refused with a typed error instead."""
    journal = unique("spark/restart-iso")
    create_journals(broker, [journal])
    j, a, b = Journal(broker, journal), producer(), producer()
    options = {"broker": broker, "journals": journal}
    checkpoint = tmp_path / "cp"
    j.add(a, OUTSIDE, "a1")
    j.add(b, CONTINUE, "b1")
    assert texts(run(spark, checkpoint, **options)) == ["a1"]
    j.add(b, CONTINUE, "b2")
    j.add(b, ACK)

    with pytest.raises(Exception, match=r"GazetteOffsetError.*isolation"):
        run(spark, checkpoint, isolation="read_uncommitted", **options)


def truncate(checkpoint: Path, last: int) -> None:
    """Make `checkpoint` that of a query stopped after micro-batch `last` committed."""
    for log in ("offsets", "commits"):
        for record in (checkpoint / log).iterdir():
            if int(record.name.strip(".").removesuffix(".crc")) > last:
                record.unlink()


def logged_offset(checkpoint: Path, batch: int, journal: str) -> int:
    """The read-through offset of `journal` that micro-batch `batch` ends at."""
    return int(
        json.loads((checkpoint / "offsets" / str(batch)).read_text().splitlines()[-1])[journal][
            "offset"
        ]
    )


@pytest.mark.parametrize("removed", ["read", "unread-fail", "unread-skip"])
def test_fragments_removed_while_the_query_is_down(
    spark: Any,
    stopped_store: Any,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    removed: str,
) -> None:
    """Retention removes a journal's first fragments while a query reading it from the store
    is down: all below its committed offset (read): it goes on, nothing lost; or past it,
    content the query had not read: with failOnDataLoss true it fails naming the journal and
    the range, with false it goes on from the first content left."""
    root, journal, all_texts, spans = stopped_store
    files = _persisted(root, journal)
    stored_end = _contiguous_end(files)
    options = {
        "store": f"file://{root}/frag/",
        "journals": journal,
        "maxMessagesPerTrigger": "50",
        "failOnDataLoss": "false" if removed == "unread-skip" else "true",
    }
    checkpoint = tmp_path / "cp"
    first = run(spark, checkpoint, **options)
    stored = [t for t, (_, e) in zip(all_texts, spans, strict=True) if e <= stored_end]
    assert sorted(t for _, _, t in first) == sorted(stored)
    truncate(checkpoint, 1)
    committed = logged_offset(checkpoint, 1, journal)
    if removed == "read":
        cut = max(e for _, e, _ in files if e <= committed)
    else:
        cut = min(e for _, e, _ in files if e > committed)
    for _, end, path in files:
        if end <= cut:
            path.unlink()

    if removed == "unread-fail":
        with pytest.raises(
            Exception,
            match=rf"GazetteDataLossError: journal {journal}: content \[{committed}, {cut}\)",
        ):
            run(spark, checkpoint, **options)
        return
    again = run(spark, checkpoint, **options)
    first_left = committed if removed == "read" else cut
    expected = [
        t for t, (b, e) in zip(all_texts, spans, strict=True) if b >= first_left and e <= stored_end
    ]
    assert [t for _, _, t in again] == expected


def test_a_journal_created_again_while_down_is_read_from_its_beginning(
    spark: Any, broker: str, tmp_path: Path
) -> None:
    """A journal deleted and created again while the query is down: its write head is below
    the query's offset. With failOnDataLoss false the query reads it again from its first
    offset (before, it waited, silently, for the head to pass the old offset, and would then
    have read on from there, skipping all before it)."""
    journal = unique("spark/restart-again")
    create_journals(broker, [journal])
    j, p = Journal(broker, journal), producer()
    options = {"broker": broker, "journals": journal, "failOnDataLoss": "false"}
    checkpoint = tmp_path / "cp"
    j.add(p, OUTSIDE, "old-1")
    j.add(p, OUTSIDE, "old-2")
    assert texts(run(spark, checkpoint, **options)) == ["old-1", "old-2"]
    delete_journal(broker, journal)
    create_journals(broker, [journal])
    j.add(p, OUTSIDE, "new-1")

    assert texts(run(spark, checkpoint, **options)) == ["new-1"]
