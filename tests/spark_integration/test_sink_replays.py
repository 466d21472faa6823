"""Re-runs of committed micro-batches that hold other rows than the run that committed them
(a checkpoint restored from an older copy re-plans them; a query that is not deterministic):
refused with ReplayMismatchError, nothing committed (sink_rows.py). Against a real broker,
driven as Spark drives the sink (test_sink_commit.py's Query)."""

from __future__ import annotations

import time

import pytest

from broker.client import append
from broker.protocol import protocol_pb2 as pb
from spark_integration.options import GazetteOptionError, parse_write_options
from spark_integration.publish import PublishedTxn, read_registers
from spark_integration.sink_commit import BatchTxns, Decision, check_replay, commit_batch
from spark_integration.sink_rows import (
    BatchRows,
    ReplayMismatchError,
    rows_register_name,
    rows_value_len_max,
)
from spark_integration.sink_task import (
    GazetteSinkError,
    SinkMark,
    TaskIdentity,
    register_name,
    stale_register_s,
)
from tests.gazette_consumer.sequencer.read_iter_testkit import Env
from tests.spark_integration.test_sink_commit import (
    Q1,
    Q2,
    Query,
    committed,
    restored_after_micro_batch_0,
)


def _value(registers: pb.LabelSet, name: str) -> str:
    return next((label.value for label in registers.labels if label.name == name), "")


async def test_a_re_run_holding_more_rows_than_the_committed_run_is_refused(env: Env) -> None:
    """The driver died after committing micro-batch 0 (rows a, b); the next run's micro-batch 0
    holds a, b, c (the query is not deterministic, or its checkpoint lost the offset log's
    entry). Rolling it back would lose c: refused, nothing appended, register unchanged."""
    journal = await env.journal("replay/more")
    first = Query(env, journal, run="run-1")
    base = first.plan()
    await first.commit(0, [await first.task(0, base, 0, ["a", "b"])])
    before = await read_registers(env.client, journal)

    second = Query(env, journal, run="run-2")
    base = second.plan()
    replay = [await second.task(0, base, 0, ["a", "b", "c"])]
    with pytest.raises(ReplayMismatchError, match=r"committed 2 rows of it in .*holds 3"):
        await second.commit(0, replay)
    after = await read_registers(env.client, journal)
    assert _value(after, register_name(Q1)) == _value(before, register_name(Q1))
    assert await committed(env, journal) == ["a", "b"]

    # The same re-run with the check off: rolled back, as before the check (c is lost).
    txns = BatchTxns.of(replay, 0, replay_check=False)
    assert txns is not None
    assert await commit_batch(env.client, txns) == {journal: Decision.ROLL_BACK}
    assert await committed(env, journal) == ["a", "b"]


async def test_a_re_run_holding_as_many_rows_is_rolled_back(env: Env) -> None:
    """A re-run of micro-batch 0 with as many rows (other values: a timestamp column) is
    Spark's own re-run: rolled back, the first run's rows stay committed."""
    journal = await env.journal("replay/same")
    first = Query(env, journal, run="run-1")
    base = first.plan()
    await first.commit(0, [await first.task(0, base, p, [f"r1-{p}"]) for p in (0, 1)])
    second = Query(env, journal, run="run-2")
    base = second.plan()
    replay = [await second.task(0, base, p, [f"r2-{p}"]) for p in (0, 1)]
    assert await second.commit(0, replay) == {journal: Decision.ROLL_BACK}
    assert sorted(await committed(env, journal)) == ["r1-0", "r1-1"]


async def test_a_restored_checkpoint_re_planned_further_is_refused(env: Env) -> None:
    """Run 1 committed micro-batches 0-2 (b0, b1, b2); the checkpoint is restored from a copy
    taken after micro-batch 0, and more rows arrived since: the re-planned micro-batch 1 reaches
    further (b1, b2, b3). Rolled back as already committed, b3 would never be committed."""
    journal = await env.journal("replay/restored")
    second = await restored_after_micro_batch_0(env, journal)
    base = second.plan()
    txn = await second.task(1, base, 0, ["b1", "b2", "b3"])
    with pytest.raises(ReplayMismatchError, match=r"committed 1 rows of it .*holds 3.*replayCheck"):
        await second.commit(1, [txn])
    assert await committed(env, journal) == ["b0", "b1", "b2"]


async def test_a_re_run_with_rows_where_the_committed_run_had_none_is_refused(env: Env) -> None:
    """Run 1's micro-batch 1 committed no rows in the journal (it wrote elsewhere, or nothing);
    a restored run's re-planned micro-batch 1 has one there: 0 rows recorded, refused."""
    journal = await env.journal("replay/none-before")
    other = await env.journal("replay/none-before-other")
    first = Query(env, journal, run="run-1")
    base = first.plan()
    await first.commit(0, [await first.task(0, base, 0, ["b0"])])
    base = first.plan()
    await first.commit(1, [await first.task(1, base, 0, ["b1"], journal=other)])
    base = first.plan()
    await first.commit(2, [await first.task(2, base, 0, ["b2"])])

    second = Query(env, journal, run="run-2")
    second.base = first.base
    base = second.plan()
    with pytest.raises(ReplayMismatchError, match="committed 0 rows"):
        await second.commit(1, [await second.task(1, base, 0, ["late"])])
    assert await committed(env, journal) == ["b0", "b2"]


async def test_a_micro_batch_refused_in_one_journal_is_committed_in_none(env: Env) -> None:
    """Micro-batch 1 of run 1 committed in journal A only (its driver died before B); run 2's
    re-run holds other rows in A: refused there, and B, which it would commit, gets nothing."""
    a = await env.journal("replay/multi-a")
    b = await env.journal("replay/multi-b")
    first = Query(env, a, run="run-1")
    base = first.plan()
    t0 = [await first.task(0, base, 0, ["a0"]), await first.task(0, base, 1, ["b0"], journal=b)]
    await first.commit(0, t0)
    base = first.plan()
    t1 = [await first.task(1, base, 0, ["a1"]), await first.task(1, base, 1, ["b1"], journal=b)]
    grouped = BatchTxns.of(t1, 1)
    assert grouped is not None
    assert await commit_batch(env.client, _only(grouped, a)) == {a: Decision.COMMIT}

    second = Query(env, a, run="run-2")
    base = second.plan()
    t1_again = [
        await second.task(1, base, 0, ["a1", "a1-more"]),
        await second.task(1, base, 1, ["b1"], journal=b),
    ]
    with pytest.raises(ReplayMismatchError, match=f"in {a}"):
        await second.commit(1, t1_again)
    assert await committed(env, a) == ["a0", "a1"]
    assert await committed(env, b) == ["b0"]


def _only(txns: BatchTxns, journal: str) -> BatchTxns:
    """`txns` with the winners that published in `journal` only (a commit that stopped
    after it)."""
    winners = tuple(t for t in txns.winners if journal in t.acks)
    return BatchTxns(txns.query, txns.run, txns.batch, txns.base_clock, winners)


async def test_each_commit_records_its_rows_and_stale_records_go_with_their_registers(
    env: Env,
) -> None:
    journal = await env.journal("replay/record")
    long_ago = int(time.time()) - stale_register_s - 60
    q3 = "33333333-3333-3333-3333-333333333333"
    stale = [
        pb.Label(name=rows_register_name(Q2), value="3/3/3=1"),
        # A record whose register an earlier version of the sink removed.
        pb.Label(name=rows_register_name(q3), value="1/1/1=1"),
        pb.Label(name=register_name(Q2), value=SinkMark(3, "old", 5, long_ago).encode()),
    ]
    await append(
        env.client,
        pb.AppendRequest(journal=journal, union_registers=pb.LabelSet(labels=stale)),
        b'{"text": "x"}\n',
    )
    q = Query(env, journal)
    for batch, texts in ((0, ["a", "b"]), (1, ["c"])):
        base = q.plan()
        await q.commit(batch, [await q.task(batch, base, p, texts) for p in (0, 1)])
    registers = await read_registers(env.client, journal)
    assert [label.name for label in registers.labels] == [
        rows_register_name(Q1),
        register_name(Q1),
    ]
    record = BatchRows.parse(_value(registers, rows_register_name(Q1)))
    assert record == BatchRows(0, 1, ((0, 4), (1, 2)))


def test_a_record_keeps_what_fits_one_label_value() -> None:
    record = BatchRows.first(0, 12)
    for batch in range(1, 500):
        record = record.after(batch, 0 if batch % 5 == 0 else 100_000 + batch)
        assert len(record.encode()) <= rows_value_len_max
        assert BatchRows.parse(record.encode()) == record
    assert record.upto == 499
    assert 300 < record.since < 480  # Pruned from its oldest end.
    assert record.rows_of(record.since - 1) is None
    assert record.rows_of(499) == 100_499
    assert record.rows_of(495) == 0
    assert record.rows_of(500) is None
    with pytest.raises(ValueError, match="not after"):
        record.after(499, 1)
    for bad in ("", "3", "3/2", "1/5/6=1", "1/5/2=0", "1/5/3=1/2=1", "1/5/x=1", "-1/5"):
        with pytest.raises(GazetteSinkError, match="not since/upto"):
            BatchRows.parse(bad)


def test_a_re_run_older_than_the_record_is_refused_and_a_register_without_one_is_not_checked() -> (
    None
):
    txn = PublishedTxn(
        TaskIdentity(Q1, "r2", 5, 0, 0), "01aaaaaaaaaa", 1000, 1004, 3, journal_rows={"j": 3}
    )
    txns = BatchTxns.of([txn], 5)
    assert txns is not None
    mark = SinkMark(9, "r1", 900, 0)
    with pytest.raises(ReplayMismatchError, match=r"no longer records .* 6 to 9"):
        check_replay("j", txns, Decision.ROLL_BACK_ONLY, mark, BatchRows(6, 9, ((7, 1),)))
    check_replay("j", txns, Decision.ROLL_BACK_ONLY, mark, None)  # Kept by no earlier version.
    # A record that stops before micro-batch 5 (an older version committed 4 and 5).
    check_replay("j", txns, Decision.ROLL_BACK_ONLY, mark, BatchRows(2, 3, ((3, 1),)))
    check_replay("j", txns, Decision.ROLL_BACK_ONLY, mark, BatchRows(4, 9, ((5, 3),)))
    with pytest.raises(ReplayMismatchError):
        check_replay("j", txns, Decision.ROLL_BACK, mark, BatchRows(4, 9, ((5, 2),)))
    check_replay("j", txns, Decision.COMMIT, None, BatchRows(4, 9, ((5, 2),)))
    off = BatchTxns.of([txn], 5, replay_check=False)
    assert off is not None
    check_replay("j", off, Decision.ROLL_BACK, mark, BatchRows(4, 9, ((5, 2),)))


def test_the_replay_check_option() -> None:
    given = {"broker": "localhost:8080", "journal": "replay/journal"}
    assert parse_write_options(given, streaming=True).replay_check
    assert not parse_write_options(given | {"replayCheck": "NONE"}, streaming=True).replay_check
    with pytest.raises(GazetteOptionError, match=r"replayCheck.*must be one of rows, none"):
        parse_write_options(given | {"replayCheck": "count"}, streaming=True)
    with pytest.raises(GazetteOptionError, match="unknown option"):
        parse_write_options(given | {"replayCheck": "none"})  # Batch writes have no re-runs.
