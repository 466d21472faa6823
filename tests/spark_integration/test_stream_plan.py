"""Planning streaming micro-batches on the driver: what `latestOffset` answers, and that the
partitions of a micro-batch, read as Spark reads them, deliver each committed message once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from broker.client.list_apply import list_all_fragments
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message.clock import clock_from_unix_nanos
from spark_integration import offsets
from spark_integration.offsets import JournalOffset
from spark_integration.read_options import parse_read_options
from spark_integration.rows import META_SCHEMA
from spark_integration.sources import GazetteDataLossError
from spark_integration.stream_read import GazetteJournalDeletedError, GazetteStreamReader
from tests.broker.serve_testkit import gazette_serve
from tests.spark_integration.spark_testkit import (
    ACK,
    CONTINUE,
    OUTSIDE,
    Msg,
    committed_texts,
    create_journals,
    producer,
    unique,
)
from tests.spark_integration.test_range_split import (
    SPLIT_OPTIONS,
    append_in_groups,
    create_small_fragment_journal,
    long_transaction_history,
)
from tests.spark_integration.test_spark_stream_restarts import delete_journal, relabel

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
# How long the broker may take to persist the fragments it closed, and the polling backoff.
persist_timeout_s = 30.0
persist_poll_s_max = 0.5


def stream_reader(broker: str, journal: str) -> GazetteStreamReader:
    """The stream reader Spark builds for these options, its micro-batches split in several
    partitions."""
    options = {"broker": broker, "journals": journal, **SPLIT_OPTIONS}
    return GazetteStreamReader(parse_read_options(options, "stream"), META_SCHEMA)


def _texts_of(reader: GazetteStreamReader, parts: Any) -> list[str]:
    """The "text" of each message the partitions deliver, in order."""
    return [
        json.loads(content)["text"]
        for part in parts
        for batch in reader.read(part)
        for content in batch.column("content").to_pylist()
    ]


def _texts(reader: GazetteStreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[str]:
    """The "text" of each message of the micro-batch [start, end), as Spark reads it."""
    return _texts_of(reader, reader.partitions(start, end))


def test_nothing_new_answers_the_start_offset_as_it_is(broker: str) -> None:
    """With nothing new, latestOffset answers its start offset unchanged (its split checkpoints
    included): an answer that differs in any way makes Spark run a micro-batch of no rows
    (its offset log written, its partitions planned) after every micro-batch of data."""
    journal = unique("spark/stream-plan")
    create_small_fragment_journal(broker, journal, 16 << 10)
    append_in_groups(broker, journal, long_transaction_history())
    reader = stream_reader(broker, journal)
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert offsets.from_json(end)[journal].splits, "the micro-batch is not split: no test"
    assert reader.latestOffset(end, ReadAllAvailable()) == end


def test_the_planning_walk_imports_no_pandas(broker: str) -> None:
    """The driver's process of a streaming query (Spark starts one per query) plans its first
    micro-batch without importing pandas (~0.4 s, once per query): pyarrow imports it on the
    first `pa.array` of a process, so the scan builds its columns from buffers."""
    journal = unique("spark/stream-plan")
    create_small_fragment_journal(broker, journal, 16 << 10)
    append_in_groups(broker, journal, long_transaction_history())
    code = (
        "import sys\n"
        "from pyspark.sql.streaming.datasource import ReadAllAvailable\n"
        "from spark_integration import offsets\n"
        "from tests.spark_integration.test_stream_plan import stream_reader\n"
        "assert 'pandas' not in sys.modules\n"
        f"reader = stream_reader({broker!r}, {journal!r})\n"
        "reader.prepareForTriggerAvailableNow()\n"
        "start = reader.initialOffset()\n"
        "end = reader.latestOffset(start, ReadAllAvailable())\n"
        f"assert offsets.read_through(end)[{journal!r}] > 0\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "planning imported pandas"


def fragments_persisted(broker: str, journal: str) -> tuple[int, int]:
    """(persisted fragments, all fragments) of the journal, as the broker's index lists them."""

    async def listing() -> tuple[int, int]:
        client = JournalClient(broker)
        try:
            found = await list_all_fragments(client, pb.FragmentsRequest(journal=journal))
        finally:
            await client.close()
        specs = [f.spec for f in found.fragments]
        return sum(bool(f.backing_store) for f in specs), len(specs)

    return asyncio.run(listing())


def wait_closed_persisted(broker: str, journal: str) -> None:
    """Until every fragment but the open one is in the store (no event tells: polled)."""
    deadline, wait = time.monotonic() + persist_timeout_s, 0.05
    while (counts := fragments_persisted(broker, journal))[0] < counts[1] - 1:
        assert time.monotonic() < deadline, f"persisted {counts[0]} of {counts[1]} fragments"
        time.sleep(wait)
        wait = min(wait * 2, persist_poll_s_max)


def micro_batch_texts(reader: GazetteStreamReader, start: Any) -> tuple[list[str], Any, bool]:
    """One micro-batch planned and read as Spark does: its texts, its end offset, and whether
    its partitions read both persisted fragments and content only the broker holds."""
    end = reader.latestOffset(start, ReadAllAvailable())
    parts = reader.partitions(start, end)
    fragments = [f for part in parts for f in part.fragments]
    mixed = any(f.persisted for f in fragments) and not all(f.persisted for f in fragments)
    return _texts_of(reader, parts), end, mixed


def test_micro_batches_across_stored_and_spooled_content(tmp_path: Path) -> None:
    """Micro-batches of a journal whose fragments are partly in the store (read from their
    files) and partly only in the broker's spool (read through it), split in partitions, a
    transaction open across both that boundary and the micro-batches': each committed message
    is delivered once, by the micro-batch reading its ACK."""
    journal = unique("spark/stream-stored")
    (tmp_path / "frag").mkdir()
    messages = long_transaction_history()
    long_ack = messages.pop()  # The long transaction's ACK: in the second micro-batch.
    # A producer's messages, first in the journal, then re-sent (a retried append) at the end of
    # the first micro-batch, in its last partition, and again in the second micro-batch: they
    # are delivered once only if each partition starts from the producers' state at its start,
    # and each micro-batch from the state the one before ended with.
    early_p = producer()
    base = clock_from_unix_nanos(time.time_ns())
    early = [Msg(early_p, base + i, OUTSIDE, {"text": f"early{i}"}) for i in range(20)]
    with gazette_serve(tmp_path) as (port, _proc):
        b = f"127.0.0.1:{port}"
        create_small_fragment_journal(b, journal, 16 << 10, ("file:///frag/",))
        append_in_groups(b, journal, early + messages + early)
        wait_closed_persisted(b, journal)
        reader = stream_reader(b, journal)
        start = reader.initialOffset()
        first, end, mixed = micro_batch_texts(reader, start)
        assert mixed, "the first micro-batch read no spooled or no stored content: no test"
        assert not any(t.startswith("long") for t in first)  # Not acknowledged yet.
        append_in_groups(b, journal, [long_ack, *early])
        second, _, _ = micro_batch_texts(reader, end)
        expected = committed_texts(b, journal)
    assert sum(t.startswith("long") for t in second) == 1500
    assert sum(t.startswith("early") for t in first + second) == 20
    assert sorted(first + second) == sorted(expected)
    assert len(set(first + second)) == len(first + second)  # Each text is sent once, then again.


def test_initial_offset_is_the_same_each_time_spark_asks(broker: str) -> None:
    """Spark asks a new query's `initialOffset` twice: for the start of micro-batch 0's
    planning (latestOffset), then for its partitions. Starting at `latest`, rows appended
    between the two calls are after the start the query planned from: the second answer
    must be the first (as Kafka's source keeps its initial offsets), else they are lost (the
    partitions would start at the new head, at or past micro-batch 0's end)."""
    journal = unique("spark/stream-plan")
    create_small_fragment_journal(broker, journal, 16 << 10)
    p = producer()
    append_in_groups(broker, journal, [Msg(p, 1, OUTSIDE, {"text": "before"})])
    options = {"broker": broker, "journals": journal, "startingOffsets": "latest"}
    reader = GazetteStreamReader(parse_read_options(options, "stream"), META_SCHEMA)
    start = reader.initialOffset()
    appended = [Msg(p, 2 + i, OUTSIDE, {"text": f"after-{i}"}) for i in range(3)]
    append_in_groups(broker, journal, appended)
    end = reader.latestOffset(start, ReadAllAvailable())
    assert reader.initialOffset() == start
    assert _texts(reader, reader.initialOffset(), end) == ["after-0", "after-1", "after-2"]


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_a_restart_before_micro_batch_0_commits_reads_what_it_planned(
    broker: str, isolation: str
) -> None:
    """A query killed after Spark logged micro-batch 0's end but before the batch committed
    restarts by running micro-batch 0 again: its end from the offset log, its start from
    `initialOffset` asked afresh, in a new source process. Starting at `latest`, that answer is
    the new head: the rows micro-batch 0 planned (appended after the first start) were read by
    no partition, silently. The partitions must start where the logged end says the query
    started (its origin), with the producers open there as the first run saw them."""
    journal = unique("spark/stream-restart")
    create_small_fragment_journal(broker, journal, 16 << 10)
    p, q = producer(), producer()
    # q's transaction begins before the start: read-committed, it is never delivered.
    append_in_groups(
        broker,
        journal,
        [Msg(p, 1, OUTSIDE, {"text": "before"}), Msg(q, 1, CONTINUE, {"text": "q-open"})],
    )
    options = {
        "broker": broker,
        "journals": journal,
        "startingOffsets": "latest",
        "isolation": isolation,
    }
    first = GazetteStreamReader(parse_read_options(options, "stream"), META_SCHEMA)
    start = first.initialOffset()
    append_in_groups(
        broker,
        journal,
        [
            Msg(p, 2, OUTSIDE, {"text": "p-0"}),
            Msg(q, 2, CONTINUE, {"text": "q-more"}),
            Msg(q, 3, ACK, {"text": "q-ack"}),
            Msg(p, 3, OUTSIDE, {"text": "p-1"}),
        ],
    )
    end = first.latestOffset(start, ReadAllAvailable())  # Spark logs it, then dies.
    planned = _texts(first, first.initialOffset(), end)
    if isolation == "read_committed":
        assert planned == ["p-0", "p-1"]
    else:
        assert planned == ["p-0", "q-more", "q-ack", "p-1"]
    # Appended before the restart: after micro-batch 0's end, for micro-batch 1.
    append_in_groups(broker, journal, [Msg(p, 4, OUTSIDE, {"text": "later"})])
    restarted = GazetteStreamReader(parse_read_options(options, "stream"), META_SCHEMA)
    fresh = restarted.initialOffset()
    assert fresh != start  # The new head: the premise of the test.
    assert _texts(restarted, fresh, end) == planned
    # And micro-batch 1 goes on from micro-batch 0's end as usual.
    later = restarted.latestOffset(end, ReadAllAvailable())
    assert _texts(restarted, end, later) == ["later"]


def test_a_start_of_another_query_than_its_end_is_refused(broker: str) -> None:
    """Offsets of two queries mixed (a start whose origin is not its end's, and not this
    reader's initialOffset answer): delivering from either could lose or repeat rows, so the
    partitions are refused with a typed error naming the journal and both origins."""
    journal = unique("spark/stream-mixed")
    create_small_fragment_journal(broker, journal, 16 << 10)
    p = producer()
    append_in_groups(broker, journal, [Msg(p, 1, OUTSIDE, {"text": "one"})])
    options = {"broker": broker, "journals": journal, "startingOffsets": "latest"}
    first = GazetteStreamReader(parse_read_options(options, "stream"), META_SCHEMA)
    start = first.initialOffset()
    append_in_groups(broker, journal, [Msg(p, 2, OUTSIDE, {"text": "two"})])
    end = first.latestOffset(start, ReadAllAvailable())
    other = GazetteStreamReader(parse_read_options(options, "stream"), META_SCHEMA)
    other_start = other.initialOffset()  # At the new head: another origin.
    stranger = GazetteStreamReader(parse_read_options(options, "stream"), META_SCHEMA)
    with pytest.raises(offsets.GazetteOffsetError, match=f"{journal}.*not of one query"):
        stranger.partitions(other_start, end)


def test_offsets_of_the_other_isolation_are_refused(broker: str) -> None:
    """A query's isolation cannot change across restarts: read-committed offsets (a
    transaction pending at them) are refused by a read-uncommitted reader, which would never
    deliver the transaction's messages before the offset, and read-uncommitted offsets by a
    read-committed reader, which would take the transaction's tail for a whole one."""
    journal = unique("spark/stream-isolation")
    create_small_fragment_journal(broker, journal, 16 << 10)
    a, b = producer(), producer()
    append_in_groups(
        broker, journal, [Msg(a, 1, OUTSIDE, {"text": "a1"}), Msg(b, 2, CONTINUE, {"text": "b1"})]
    )

    def reader(isolation: str) -> GazetteStreamReader:
        options = {"broker": broker, "journals": journal, "isolation": isolation}
        return GazetteStreamReader(parse_read_options(options, "stream"), META_SCHEMA)

    committed, uncommitted = reader("read_committed"), reader("read_uncommitted")
    start = committed.initialOffset()
    end = committed.latestOffset(start, ReadAllAvailable())
    with pytest.raises(offsets.GazetteOffsetError, match=f"{journal}.*isolation read_committed"):
        uncommitted.latestOffset(end, ReadAllAvailable())
    with pytest.raises(offsets.GazetteOffsetError, match="cannot change across restarts"):
        uncommitted.partitions(start, end)
    u_start = uncommitted.initialOffset()
    u_end = uncommitted.latestOffset(u_start, ReadAllAvailable())
    with pytest.raises(offsets.GazetteOffsetError, match=f"{journal}.*isolation read_uncommitted"):
        committed.latestOffset(u_end, ReadAllAvailable())
    # Each reader goes on from its own offsets.
    assert committed.latestOffset(end, ReadAllAvailable()) == end
    assert uncommitted.latestOffset(u_end, ReadAllAvailable()) == u_end


def test_a_journal_leaving_the_selection_keeps_its_offset_and_a_deleted_one_fails(
    broker: str,
) -> None:
    """A journal relabelled out of a selector's selection keeps its offset (marked
    deselected), unchanged while it stays out; back in, it goes on from there, its mark gone;
    out again and deleted, the plan fails with GazetteJournalDeletedError (failOnDataLoss)."""
    one, two = unique("spark/stream-leave"), unique("spark/stream-leave")
    create_journals(broker, [one, two])
    tag_one, tag_two = one.split("/")[-1], two.split("/")[-1]
    p = producer()
    for journal in (one, two):
        append_in_groups(broker, journal, [Msg(p, 1, OUTSIDE, {"text": journal})])
    options = {"broker": broker, "selector": f"test in ({tag_one}, {tag_two})", "idleWaitMs": "0"}
    reader = GazetteStreamReader(parse_read_options(options, "stream"), META_SCHEMA)
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    relabel(broker, one, tag_one + "-out")
    out = reader.latestOffset(end, ReadAllAvailable())
    assert out[one] == {**end[one], "deselected": True}
    assert reader.latestOffset(out, ReadAllAvailable()) == out
    relabel(broker, one, tag_one)
    back = reader.latestOffset(out, ReadAllAvailable())
    assert back == end
    relabel(broker, one, tag_one + "-out")
    delete_journal(broker, one)
    with pytest.raises(GazetteJournalDeletedError, match=f"journal {one}: deleted"):
        reader.latestOffset(back, ReadAllAvailable())


def test_a_re_run_micro_batch_0_of_a_journal_no_longer_read_starts_at_its_origin(
    broker: str,
) -> None:
    """Micro-batch 0 run again after a restart whose options no longer read one of its
    journals (its start, from `initialOffset` asked afresh, lacks it): its partitions must
    start there as the first run did, at the origin with the producers open there, not at the
    origin with none, which would deliver the tail of a transaction begun before the query
    started."""
    journal, other = unique("spark/stream-gone"), unique("spark/stream-gone")
    for name in (journal, other):
        create_small_fragment_journal(broker, name, 16 << 10)
    p, q = producer(), producer()
    append_in_groups(broker, journal, [Msg(q, 1, CONTINUE, {"text": "q-open"})])
    options = {"broker": broker, "journals": journal, "startingOffsets": "latest"}
    first = GazetteStreamReader(parse_read_options(options, "stream"), META_SCHEMA)
    start = first.initialOffset()
    append_in_groups(
        broker,
        journal,
        [
            Msg(p, 1, OUTSIDE, {"text": "p-0"}),
            Msg(q, 2, CONTINUE, {"text": "q-more"}),
            Msg(q, 3, ACK),
        ],
    )
    end = first.latestOffset(start, ReadAllAvailable())  # Spark logs it, then dies.
    assert _texts(first, start, end) == ["p-0"]
    options = {**options, "journals": other}  # The journal left the journals read.
    restarted = GazetteStreamReader(parse_read_options(options, "stream"), META_SCHEMA)
    assert _texts(restarted, restarted.initialOffset(), end) == ["p-0"]


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_a_write_head_below_the_offset_is_data_loss(broker: str, fail_on_data_loss: str) -> None:
    """A journal deleted and created again (or another cluster's of the same name) has its
    write head below the query's offset: as Kafka's source with an offset out of range, the
    plan fails naming the journal and offsets, or (failOnDataLoss false) reads the journal
    again from its first offset, rather than waiting, silently, for the head to pass the old
    offset and then reading from there, skipping all before it."""
    journal = unique("spark/stream-behind")
    create_journals(broker, [journal])
    p = producer()
    append_in_groups(
        broker,
        journal,
        [Msg(p, 1, OUTSIDE, {"text": "old-1"}), Msg(p, 2, OUTSIDE, {"text": "old-2"})],
    )
    options = {
        "broker": broker,
        "journals": journal,
        "idleWaitMs": "0",
        "failOnDataLoss": fail_on_data_loss,
    }
    reader = GazetteStreamReader(parse_read_options(options, "stream"), META_SCHEMA)
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    delete_journal(broker, journal)
    create_journals(broker, [journal])
    append_in_groups(broker, journal, [Msg(p, 3, OUTSIDE, {"text": "new-1"})])
    restarted = GazetteStreamReader(parse_read_options(options, "stream"), META_SCHEMA)
    if fail_on_data_loss == "true":
        with pytest.raises(GazetteDataLossError, match=f"journal {journal}: content"):
            restarted.latestOffset(end, ReadAllAvailable())
        return
    later = restarted.latestOffset(end, ReadAllAvailable())
    assert _texts(restarted, end, later) == ["new-1"]


def test_with_no_broker_an_offset_beyond_the_persisted_content_waits(tmp_path: Path) -> None:
    """In store mode a journal's head is where its persisted content ends: an offset beyond it
    (read from a broker before the query was restarted on the store alone) is content not yet
    persisted, not a journal created again: nothing new, no error."""
    journal = unique("spark/stream-store-ahead")
    (tmp_path / "frag").mkdir()
    p = producer()
    with gazette_serve(tmp_path) as (port, _proc):
        b = f"127.0.0.1:{port}"
        create_small_fragment_journal(b, journal, 16 << 10, ("file:///frag/",))
        append_in_groups(b, journal, [Msg(p, 1, OUTSIDE, {"text": "stored"})])
    options = {"store": f"file://{tmp_path}/frag/", "journals": journal, "idleWaitMs": "0"}
    reader = GazetteStreamReader(parse_read_options(options, "stream"), META_SCHEMA)
    stored = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    ahead = offsets.to_json({journal: JournalOffset.at(journal, stored[journal]["offset"] + 100)})
    assert reader.latestOffset(ahead, ReadAllAvailable()) == ahead
