"""Review reproducer: a streaming sink task re-run by a *stage* retry reuses the run producer.

sink_task.TaskIdentity.producer() keys attempt 0 of partition k by (query, run, k) only, and
every task of micro-batch B numbers its rows from the same base clock T_B. Spark's
TaskContext.attemptNumber() counts attempts within one task set: when a stage is resubmitted
(a FetchFailed after an executor was lost), the new stage attempt runs the missing partitions
again with attemptNumber 0 (Spark's OutputCommitCoordinator keys commits by stage attempt for
this reason, SPARK-24589). So the task of stage attempt 0 (died with its executor, no
rollback; or still running as a zombie) and the one of stage attempt 1 publish under the SAME
producer at the SAME clocks T_B+1, T_B+2, ... Read-committed readers take the second copy of
each clock as a duplicate of the first (CONTINUE_TXN_CLOCK_LARGER). After a shuffle the row
order of a partition is not the same in two attempts (Spark: UNORDERED), so the committed
transaction is the dead attempt's rows for the clocks it reached plus the winner's rows for the
rest: some rows twice, others never, and no error. BatchTxns.of computes no loser for the
winner (its attempt is 0), so no rollback at T_B is appended either.

Driven as test_sink_commit.py drives the sink (real broker, no SparkSession), with the two
task identities Spark would give the two stage attempts' tasks.
"""

from __future__ import annotations

import pytest

from tests.gazette_consumer.sequencer.read_iter_testkit import Env
from tests.spark_integration.test_sink_commit import Query, committed

# An open defect, found by review on 2026-11-28 (docs/spark.md, "Open defects"): this test
# reproduces it and fails today. Strict: once fixed it passes, and the mark must go.
pytestmark = pytest.mark.xfail(
    strict=True,
    reason="open defect: a stage retry's task reuses attempt 0's producer and clocks: rows duplicated and lost",
)


async def test_a_stage_retry_of_a_streaming_write_commits_each_row_once(env: Env) -> None:
    journal = await env.journal("sink/stage-retry")
    q = Query(env, journal)
    rows = [f"row-{i}" for i in range(6)]

    b0 = q.plan()
    # Stage attempt 0, partition 0, attemptNumber 0: publishes its first rows (one 1 MiB
    # buffer's worth in real life), then its executor is lost: no rollback, no message.
    await q.task(0, b0, 0, ["row-3", "row-4", "row-5"])
    # Stage attempt 1 runs partition 0 again: attemptNumber is 0 again (a new task set); the
    # shuffle hands it the same rows in another order. It wins.
    winner = await q.task(0, b0, 0, ["row-0", "row-1", "row-2", "row-3", "row-4", "row-5"])
    await q.commit(0, [winner])

    got = await committed(env, journal)
    assert sorted(got) == rows, f"committed {sorted(got)}, expected each of {rows} once"


async def test_a_late_self_rollback_of_the_earlier_stage_attempt_loses_nothing(env: Env) -> None:
    """The earlier stage attempt's task did fail cleanly, but its rollback (publish._roll_back,
    fenced on the query's register, which nothing moves during the micro-batch) lands while the
    new stage attempt's task, under the SAME producer and base clock, is publishing: it rolls
    back the new task's first messages, and the commit delivers only the rest. (Spark retries
    while a failed task's Python worker is still draining: docs/spark.md says so.) Appended
    here raw, as the two tasks would frame them."""
    import json as _json

    from broker.client import append
    from broker.protocol import protocol_pb2 as pb
    from gazette_consumer.message.json_framing import JSONFraming
    from gazette_consumer.message.uuid import Flag, build_uuid
    from spark_integration.publish import PublishedTxn, ack_message
    from spark_integration.raw_json import JSONRow
    from spark_integration.sink_task import TaskIdentity
    from spark_integration.write_framing import JSON_LINES

    journal = await env.journal("sink/stage-retry-late-rollback")
    q = Query(env, journal)
    base = q.plan()
    task = TaskIdentity(q.query, q.run, 0, 0, 0)  # attemptNumber 0 in both stage attempts.
    producer = task.producer()
    framing = JSONFraming()

    def row(i: int) -> bytes:
        uuid = build_uuid(producer, base + 1 + i, Flag.CONTINUE_TXN)
        return framing.marshal(JSONRow({"text": f"row-{i}", "UUID": str(uuid)}))

    request = pb.AppendRequest(journal=journal)
    await append(env.client, request, b"".join(row(i) for i in range(3)))  # New task, buffer 1.
    await append(env.client, request, ack_message(framing, producer, base))  # Old task's rollback.
    await append(env.client, request, b"".join(row(i) for i in range(3, 6)))  # Buffer 2.
    winner = PublishedTxn(
        task=task,
        producer=producer.hex(),
        base_clock=base,
        ack_clock=base + 7,
        rows=6,
        acks={journal: ack_message(framing, producer, base + 7)},
        rollbacks={journal: ack_message(framing, producer, base)},
        framings={journal: JSON_LINES},
    )
    await q.commit(0, [winner])

    got = await committed(env, journal)
    assert sorted(got) == [f"row-{i}" for i in range(6)], f"committed {sorted(got)}"
    del _json
