"""The streaming sink's tasks and commits against a real broker, driven as Spark drives them
(no SparkSession): each micro-batch committed once across runs, failed attempts, resets and
concurrent queries, with producers reused from one micro-batch to the next."""

from __future__ import annotations

import json
import time

import pytest

from broker.client import append
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import RegisterMismatchError
from gazette_consumer.message.clock import clock_from_unix_nanos
from gazette_consumer.message.json_framing import JSONFraming
from gazette_consumer.message.uuid import Flag, build_uuid, producer_id
from spark_integration.journal_io import write_head
from spark_integration.publish import (
    PublishedTxn,
    RowShape,
    _Buffers,
    _roll_back,
    ack_message,
    publish_rows,
    read_registers,
)
from spark_integration.range_read import CommittedRange, read_uncommitted
from spark_integration.raw_json import JSONRow
from spark_integration.sink_commit import BatchTxns, Decision, commit_batch, decide
from spark_integration.sink_rows import rows_register_name
from spark_integration.sink_task import (
    GazetteSinkError,
    SinkMark,
    StaleAttemptError,
    TaskIdentity,
    register_name,
    stale_register_s,
)
from spark_integration.sources import JournalSource
from tests.gazette_consumer.sequencer.read_iter_testkit import Env

Q1, Q2 = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"


class Query:
    """A streaming query's run, planning micro-batches as Spark does: a base clock per
    micro-batch (the driver's stream writer), tasks publishing partitions, one commit."""

    def __init__(self, env: Env, journal: str, query: str = Q1, run: str = "run-1") -> None:
        self.env, self.journal, self.query, self.run = env, journal, query, run
        self.base = clock_from_unix_nanos(time.time_ns())
        self.task_attempts = 0  # Spark's task attempt ids, unique in the application.

    def plan(self) -> int:
        self.base += 1_000_000  # Later micro-batches are planned later.
        return self.base

    async def task(
        self,
        batch: int,
        base: int,
        partition: int,
        texts: list[str],
        attempt: int = 0,
        journal: str = "",
    ) -> PublishedTxn:
        rows = iter([{"content": json.dumps({"text": t})} for t in texts])
        shape = RowShape(content_column=True, journal_column=False, journal=journal or self.journal)
        self.task_attempts += 1
        task = TaskIdentity(self.query, self.run, batch, partition, attempt, self.task_attempts)
        return await publish_rows(self.env.client, shape, rows, base, task)

    async def commit(
        self, batch: int, txns: list[PublishedTxn], routing: str = ""
    ) -> dict[str, Decision]:
        grouped = BatchTxns.of(txns, batch, routing)
        assert grouped is not None
        return await commit_batch(self.env.client, grouped)


def source(env: Env, journal: str) -> JournalSource:
    return JournalSource(journal, (), client=env.client, registry=None, fail_on_data_loss=True)


async def walk_texts(walk: CommittedRange) -> list[str]:
    return [
        json.loads(line)["text"]
        async for batch in walk.batches()
        for line in batch.content.to_pylist()
    ]


async def committed(env: Env, journal: str) -> list[str]:
    head = await write_head(env.client, journal)
    return await walk_texts(CommittedRange(source(env, journal), 0, head, ring_size=64))


async def written(env: Env, journal: str) -> int:
    """Messages in the journal that are not ACKs (committed or not)."""
    head = await write_head(env.client, journal)
    lines = [
        line
        async for batch in read_uncommitted(source(env, journal), 0, head)
        for line in batch.content.to_pylist()
    ]
    return sum(1 for line in lines if "text" in json.loads(line))


async def test_micro_batches_commit_once_across_failed_attempts(env: Env) -> None:
    """Partition 0's first attempt of micro-batch 1 publishes some rows and dies; its retry
    wins. Micro-batch 2's first attempt publishes under the same producer again: the dead
    attempt's rows are never committed, by micro-batch 1's commit nor by micro-batch 2's."""
    journal = await env.journal("sink/attempts")
    q = Query(env, journal)

    b0 = q.plan()
    t0 = [await q.task(0, b0, p, [f"b0-p{p}-{i}" for i in range(3)]) for p in (0, 1)]
    assert await q.commit(0, t0) == {journal: Decision.COMMIT}

    b1 = q.plan()
    await q.task(1, b1, 0, [f"b1-p0-dead-{i}" for i in range(2)])  # Died: no message.
    t1 = [
        await q.task(1, b1, 0, [f"b1-p0-{i}" for i in range(3)], attempt=1),
        await q.task(1, b1, 1, [f"b1-p1-{i}" for i in range(3)]),
    ]
    assert await q.commit(1, t1) == {journal: Decision.COMMIT}

    b2 = q.plan()
    t2 = [await q.task(2, b2, p, [f"b2-p{p}-{i}" for i in range(3)]) for p in (0, 1)]
    assert t2[0].producer == t0[0].producer  # The first attempt's producer, reused.
    assert await q.commit(2, t2) == {journal: Decision.COMMIT}

    got = await committed(env, journal)
    expected = [f"b{b}-p{p}-{i}" for b in range(3) for p in (0, 1) for i in range(3)]
    assert sorted(got) == sorted(expected)
    assert await written(env, journal) == len(expected) + 2  # The dead attempt's rows are there.


async def test_a_replay_by_a_new_run_is_rolled_back(env: Env) -> None:
    """The driver died after committing micro-batch 5: the next run re-runs it, and must
    neither commit it again nor, later, let its own producers' next ACKs commit it."""
    journal = await env.journal("sink/replay")
    first = Query(env, journal, run="run-1")
    b5 = first.plan()
    assert await first.commit(5, [await first.task(5, b5, 0, ["r1-a", "r1-b"])]) == {
        journal: Decision.COMMIT
    }

    second = Query(env, journal, run="run-2")
    b5 = second.plan()
    replay = [await second.task(5, b5, 0, ["r2-a", "r2-b"])]
    assert await second.commit(5, replay) == {journal: Decision.ROLL_BACK}
    assert await second.commit(5, replay) == {journal: Decision.DONE}  # A retried commit.
    b6 = second.plan()
    assert await second.commit(6, [await second.task(6, b6, 0, ["r2-c"])]) == {
        journal: Decision.COMMIT
    }

    assert await committed(env, journal) == ["r1-a", "r1-b", "r2-c"]
    mark = SinkMark.parse(_value(await read_registers(env.client, journal), register_name(Q1)))
    assert (mark.batch, mark.run) == (6, "run-2")


async def test_a_reset_query_and_a_concurrent_one_commit_every_batch(env: Env) -> None:
    """A query on a new checkpoint (another query id) starts again at micro-batch 0, and so
    may another query writing the same journal meanwhile: each commits each micro-batch."""
    journal = await env.journal("sink/queries")
    old, new = Query(env, journal, Q1), Query(env, journal, Q2)
    for batch in (0, 1):
        base = old.plan()
        await old.commit(batch, [await old.task(batch, base, 0, [f"old-{batch}"])])
    base_old, base_new = old.plan(), new.plan()
    t_old = await old.task(2, base_old, 0, ["old-2"])
    t_new = await new.task(0, base_new, 0, ["new-0"])  # Interleaved with old's micro-batch 2.
    assert await new.commit(0, [t_new]) == {journal: Decision.COMMIT}
    assert await old.commit(2, [t_old]) == {journal: Decision.COMMIT}
    base_new = new.plan()
    await new.commit(1, [await new.task(1, base_new, 0, ["new-1"])])

    assert sorted(await committed(env, journal)) == ["new-0", "new-1", "old-0", "old-1", "old-2"]


async def test_an_attempt_spark_gave_up_on_cannot_append_after_the_commit(env: Env) -> None:
    """A speculative copy (or an attempt on an executor Spark lost) of partition 0 still runs
    when its micro-batch is committed: its appends are refused from then on, and so is its
    rollback, which would otherwise roll back the next micro-batch of the same producer."""
    journal = await env.journal("sink/zombie")
    q = Query(env, journal)
    b0 = q.plan()
    winner = await q.task(0, b0, 0, ["a"], attempt=1)

    zombie_task = TaskIdentity(Q1, "run-1", 0, 0, 0)
    producer, framing = zombie_task.producer(), JSONFraming()
    zombie = _Buffers(env.client, zombie_task, producer, b0)
    for clock, text in ((b0 + 1, "zombie-1"), (b0 + 2, "zombie-2")):
        zombie.add(journal, _continue(framing, producer, clock, text))
        if clock == b0 + 1:
            await zombie.flush(journal)  # Its first append: before the commit.
            await q.commit(0, [winner])
    with pytest.raises(RegisterMismatchError):
        await zombie.flush(journal)

    b1 = q.plan()
    t1 = await q.task(1, b1, 0, ["b"])  # The same producer as the zombie's.
    await _roll_back(env.client, zombie, ack_message(framing, producer, b0))  # Refused.
    await q.commit(1, [t1])
    assert sorted(await committed(env, journal)) == ["a", "b"]


async def test_an_attempt_that_first_appends_after_the_commit_is_refused(env: Env) -> None:
    """Found by the Spark test of a failing task: Spark gave up on partition 0's first
    attempt, its retry won and the micro-batch was committed, and only then did the first
    attempt (its Python worker still draining rows it was handed) make its first append. It
    read the register then, already holding this micro-batch's mark, and fenced its appends on
    that: they landed, and micro-batch 1's ACK of the same producer committed them. An attempt
    whose micro-batch its run has resolved must append nothing."""
    journal = await env.journal("sink/late-zombie")
    q = Query(env, journal)
    b0 = q.plan()
    assert await q.commit(0, [await q.task(0, b0, 0, ["a"], attempt=1)]) == {
        journal: Decision.COMMIT
    }
    with pytest.raises(StaleAttemptError, match=r"micro-batch 0 .* resolved"):
        await q.task(0, b0, 0, ["zombie-1", "zombie-2"])  # Attempt 0, after the commit.

    b1 = q.plan()
    assert await q.commit(1, [await q.task(1, b1, 0, ["b"])]) == {journal: Decision.COMMIT}
    assert sorted(await committed(env, journal)) == ["a", "b"]
    assert await written(env, journal) == 2  # Not one row of the late attempt.


async def test_a_late_attempt_of_an_earlier_run_is_refused(env: Env) -> None:
    """The same, across runs: an attempt of run 1's micro-batch 3 that first appends once run 2
    has resolved micro-batch 3 (or a later one) appends nothing either."""
    journal = await env.journal("sink/late-run")
    first, second = Query(env, journal, run="run-1"), Query(env, journal, run="run-2")
    b3 = first.plan()
    second.base = b3
    await second.commit(3, [await second.task(3, second.plan(), 0, ["a"])])
    await second.commit(4, [await second.task(4, second.plan(), 0, ["b"])])
    with pytest.raises(StaleAttemptError, match="micro-batch 4"):
        await first.task(3, b3, 0, ["zombie"])
    assert sorted(await committed(env, journal)) == ["a", "b"]
    assert await written(env, journal) == 2


def _continue(framing: JSONFraming, producer: bytes, clock: int, text: str) -> bytes:
    uuid = build_uuid(producer_id(producer), clock, Flag.CONTINUE_TXN)
    return framing.marshal(JSONRow({"text": text, "UUID": str(uuid)}))


async def test_a_clock_that_went_back_fails_the_commit(env: Env) -> None:
    journal = await env.journal("sink/clock")
    q = Query(env, journal)
    b0 = q.plan()
    await q.commit(0, [await q.task(0, b0, 0, ["a", "b"])])
    # Micro-batch 1 numbered from below micro-batch 0's clocks: its rows would read as
    # duplicates of micro-batch 0's, so committing would lose them.
    with pytest.raises(GazetteSinkError, match="the driver's clock went back"):
        await q.commit(1, [await q.task(1, b0, 0, ["c"])])
    assert await committed(env, journal) == ["a", "b"]


async def test_stale_registers_of_other_queries_are_pruned(env: Env) -> None:
    journal = await env.journal("sink/prune")
    long_ago = int(time.time()) - stale_register_s - 60
    stale = pb.Label(name=register_name(Q2), value=SinkMark(3, "old", 5, long_ago).encode())
    await append(
        env.client,
        pb.AppendRequest(journal=journal, union_registers=pb.LabelSet(labels=[stale])),
        b'{"text": "x"}\n',
    )
    q = Query(env, journal)
    base = q.plan()
    await q.commit(0, [await q.task(0, base, 0, ["a"])])
    names = [label.name for label in (await read_registers(env.client, journal)).labels]
    assert names == [rows_register_name(Q1), register_name(Q1)]


def test_decisions() -> None:
    txn = PublishedTxn(TaskIdentity(Q1, "r2", 5, 0, 0), "01aaaaaaaaaa", 1000, 1004, 3)
    txns = BatchTxns.of([txn, None], 5)
    assert txns is not None
    assert decide(None, txns) is Decision.COMMIT
    assert decide(SinkMark(4, "r1", 2000, 0), txns) is Decision.COMMIT  # Another run's clocks.
    assert decide(SinkMark(4, "r2", 900, 0), txns) is Decision.COMMIT
    assert decide(SinkMark(5, "r1", 900, 0), txns) is Decision.ROLL_BACK
    assert decide(SinkMark(5, "r2", 900, 0), txns) is Decision.DONE
    assert decide(SinkMark(7, "r1", 900, 0), txns) is Decision.ROLL_BACK_ONLY
    with pytest.raises(GazetteSinkError, match="clock went back"):
        decide(SinkMark(4, "r2", 1000, 0), txns)
    with pytest.raises(GazetteSinkError, match="in order"):
        decide(SinkMark(7, "r2", 900, 0), txns)
    with pytest.raises(GazetteSinkError, match="not batch/run/clock/time"):
        SinkMark.parse("7")
    mark = SinkMark(7, "r", 9, 10, "0123abcd0123abcd")
    assert SinkMark.parse(mark.encode()) == mark
    assert SinkMark.parse("7/r/9/10") == SinkMark(7, "r", 9, 10)  # Written before routing was.


def test_producers_of_attempts() -> None:
    first = TaskIdentity(Q1, "r", 5, 3, 0, task_attempt_id=10)
    assert first.producer() == TaskIdentity(Q1, "r", 9, 3, 0, 99).producer()  # Reused.
    assert first.producer() != TaskIdentity(Q1, "r2", 5, 3, 0, 10).producer()  # Not by a new run.
    retry = TaskIdentity(Q1, "r", 5, 3, 1, task_attempt_id=11)
    assert retry.producer() not in (first.producer(), TaskIdentity(Q1, "r", 6, 3, 1, 12).producer())
    # A resubmitted stage numbers its attempts from 0 again: the retry of its task is attempt
    # 1 again, but another task attempt.
    assert retry.producer() != TaskIdentity(Q1, "r", 5, 3, 1, task_attempt_id=17).producer()
    winner = PublishedTxn(retry, "01aaaaaaaaaa", 1000, 1004, 3)
    with pytest.raises(GazetteSinkError, match="a task of query"):
        BatchTxns.of([winner], 6)


def _value(registers: pb.LabelSet, name: str) -> str:
    return next(label.value for label in registers.labels if label.name == name)


async def test_a_restart_closes_what_the_dead_run_left_open(env: Env) -> None:
    """The driver died while micro-batch 6's tasks had published (not committed): the next
    run's first commit closes those transactions, so readers do not remember them forever."""
    journal = await env.journal("sink/crash")
    first = Query(env, journal, run="run-1")
    b5 = first.plan()
    await first.commit(5, [await first.task(5, b5, p, [f"b5-{p}"]) for p in (0, 1)])
    b6 = first.plan()
    for p in (0, 1):
        await first.task(6, b6, p, [f"dead-{p}"])  # Published, then the driver died.

    second = Query(env, journal, run="run-2")
    b6 = second.plan()
    await second.commit(6, [await second.task(6, b6, p, [f"b6-{p}"]) for p in (0, 1)])

    head = await write_head(env.client, journal)
    walk = CommittedRange(source(env, journal), 0, head, ring_size=64)
    got = await walk_texts(walk)
    assert sorted(got) == ["b5-0", "b5-1", "b6-0", "b6-1"]
    assert all(state.begin == -1 for state in walk.checkpoint().producers.values())


async def test_a_stream_of_micro_batches_uses_one_producer_per_partition(env: Env) -> None:
    """What a reader of the sink must remember: one producer per partition of the run, however
    many micro-batches (the sink once minted one per task and micro-batch)."""
    journal = await env.journal("sink/producers")
    q = Query(env, journal)
    for batch in range(5):
        base = q.plan()
        await q.commit(batch, [await q.task(batch, base, p, [f"{batch}-{p}"]) for p in range(3)])
    head = await write_head(env.client, journal)
    walk = CommittedRange(source(env, journal), 0, head, ring_size=64)
    assert len(await walk_texts(walk)) == 15
    assert len(walk.checkpoint().producers) == 3


def test_continue_uuid_text_is_the_uuids() -> None:
    from spark_integration.publish import continue_uuid_text

    producer = producer_id(bytes.fromhex("01a2b3c4d5e6"))
    now = clock_from_unix_nanos(time.time_ns())
    for clock in (1, 0xF, 0x10, now, now + 17, (1 << 60) - 1, (1 << 64) - 1):
        assert continue_uuid_text(producer, clock) == str(
            build_uuid(producer, clock, Flag.CONTINUE_TXN)
        )


async def test_a_re_run_routed_over_other_journals_commits_nothing_it_could_duplicate(
    env: Env,
) -> None:
    """Found by review: a keyColumn query's driver died between the sink's commit and Spark's
    commit log, and a matching journal was created meanwhile; the re-run routes its rows over
    three journals where the first run routed them over two, so rows routed to the new one
    were committed in another by the first run. The commit refuses, committing nothing; with
    the routing of the first run, each journal decides for itself (a partial commit of the
    first run completes)."""
    a, b, c = [await env.journal(f"sink/route-{x}") for x in "abc"]
    first = Query(env, a, run="run-1")
    b5 = first.plan()
    won = [await first.task(5, b5, 0, ["r1-a"]), await first.task(5, b5, 1, ["r1-b"], journal=b)]
    assert await first.commit(5, won, routing="over-a-b") == {
        a: Decision.COMMIT,
        b: Decision.COMMIT,
    }

    second = Query(env, a, run="run-2")
    second.base = b5
    b5 = second.plan()
    again = [
        await second.task(5, b5, 0, ["r1-a"]),
        await second.task(5, b5, 1, ["r1-b"], journal=c),  # Routed to the new journal now.
    ]
    with pytest.raises(GazetteSinkError, match=r"routing rows by key over other journals"):
        await second.commit(5, again, routing="over-a-b-c")
    assert await committed(env, c) == []
    assert await committed(env, a) == ["r1-a"] and await committed(env, b) == ["r1-b"]

    # The same routing as the first run's: journal by journal (here c had no part in it).
    assert await second.commit(5, again, routing="over-a-b") == {
        a: Decision.ROLL_BACK,
        c: Decision.COMMIT,
    }


async def test_a_query_restarted_from_an_older_checkpoint_rolls_back_what_it_re_runs(
    env: Env,
) -> None:
    """Found by review: a query restarted from an older checkpoint (a backup restored) re-runs
    micro-batches an earlier run committed. Its tasks were refused as stale (StaleAttemptError,
    every attempt, so the query could never run); they are a new run's, planned after the
    register's micro-batch was (their clocks are above its): they publish, and the driver
    rolls back what was committed already, then commits what was not."""
    journal = await env.journal("sink/restored")
    second = await restored_after_micro_batch_0(env, journal)
    for batch, decision in ((1, Decision.ROLL_BACK_ONLY), (2, Decision.ROLL_BACK)):
        base = second.plan()
        txn = await second.task(batch, base, 0, [f"b{batch}"])
        assert await second.commit(batch, [txn]) == {journal: decision}
    base = second.plan()
    assert await second.commit(3, [await second.task(3, base, 0, ["b3"])]) == {
        journal: Decision.COMMIT
    }
    assert await committed(env, journal) == ["b0", "b1", "b2", "b3"]


async def restored_after_micro_batch_0(env: Env, journal: str) -> Query:
    """Run 1 committed micro-batches 0, 1 and 2 (rows b0, b1, b2); the query's checkpoint is
    restored from a backup taken after micro-batch 0: the next run, returned, re-runs 1."""
    first = Query(env, journal, run="run-1")
    for batch in range(3):
        base = first.plan()
        await first.commit(batch, [await first.task(batch, base, 0, [f"b{batch}"])])
    second = Query(env, journal, run="run-2")
    second.base = first.base
    return second
