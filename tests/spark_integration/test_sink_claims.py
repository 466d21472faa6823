"""Producer claims (sink_task.py): two attempts of one partition under the same producer in
the same micro-batch, as a resubmitted stage runs them (Spark numbers the new stage attempt's
tasks from attempt 0 again), never both append in a journal; the driver rolls back what
failed attempts left there, and removes the claims.

Found by review (2026-11-28): before claims, the second attempt 0 published at the same clocks
under the same producer, readers took its rows for duplicates of the first's, and the commit
delivered some rows twice and others never, without an error. Driven as test_sink_commit.py
drives the sink (a real broker, no SparkSession), with the task identities Spark gives.
"""

from __future__ import annotations

import time

import pytest

from broker.client import append
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message.json_framing import JSONFraming
from gazette_consumer.message.uuid import ProducerID
from spark_integration.journal_io import write_head
from spark_integration.publish import (
    PublishedTxn,
    _Buffers,
    _roll_back,
    ack_message,
    read_registers,
)
from spark_integration.range_read import CommittedRange
from spark_integration.sink_commit import Decision
from spark_integration.sink_rows import rows_register_name
from spark_integration.sink_task import (
    CLAIM_PREFIX,
    Claim,
    GazetteSinkError,
    ProducerClaimedError,
    TaskIdentity,
    claim_name,
    register_name,
    stale_register_s,
)
from spark_integration.write_framing import JSON_LINES
from tests.gazette_consumer.sequencer.read_iter_testkit import Env
from tests.spark_integration.test_sink_commit import (
    Q1,
    Q2,
    Query,
    _continue,
    committed,
    restored_after_micro_batch_0,
    source,
    walk_texts,
    written,
)


async def _names(env: Env, journal: str) -> list[str]:
    return [label.name for label in (await read_registers(env.client, journal)).labels]


async def test_a_resubmitted_stage_commits_each_row_once(env: Env) -> None:
    """Stage attempt 0's task of partition 0 published half its rows, and its executor was
    lost (no rollback). Stage attempt 1 runs partition 0 as attempt 0 again (the same
    producer): it finds the producer claimed and appends nothing; Spark's retry (attempt 1)
    wins. The commit rolls back the dead attempt's rows, and the next micro-batch's attempt 0
    publishes under the producer again."""
    journal = await env.journal("sink/stage-retry")
    q = Query(env, journal)
    rows = [f"row-{i}" for i in range(6)]

    b0 = q.plan()
    await q.task(0, b0, 0, ["row-3", "row-4", "row-5"])  # Stage attempt 0: died.
    with pytest.raises(ProducerClaimedError, match="Spark resubmitted the stage"):
        await q.task(0, b0, 0, rows)  # Stage attempt 1, attempt 0: the same producer.
    assert await written(env, journal) == 3  # It appended nothing.
    winner = await q.task(0, b0, 0, list(reversed(rows)), attempt=1)  # Its retry.
    await q.commit(0, [winner])
    assert sorted(await committed(env, journal)) == rows
    assert await _names(env, journal) == [
        rows_register_name(Q1),
        register_name(Q1),
    ]  # The claims are gone.

    b1 = q.plan()
    t1 = await q.task(1, b1, 0, ["next"])
    assert t1.producer == TaskIdentity(Q1, q.run, 0, 0, 0).producer().hex()
    await q.commit(1, [t1])
    assert sorted(await committed(env, journal)) == sorted([*rows, "next"])


async def test_interleaved_attempts_of_one_producer_cannot_both_append(env: Env) -> None:
    """The old stage attempt's task still runs (a zombie) while the new one publishes: the
    one that appended first holds the claim, the other's appends are refused from its first,
    and a failure of the first cannot roll back the second's messages (a late or repeated
    rollback is refused too)."""
    journal = await env.journal("sink/stage-interleaved")
    q = Query(env, journal)
    base = q.plan()
    producer, framing = TaskIdentity(Q1, q.run, 0, 0, 0).producer(), JSONFraming()
    old = _Buffers(env.client, TaskIdentity(Q1, q.run, 0, 0, 0, task_attempt_id=1), producer, base)
    new = _Buffers(env.client, TaskIdentity(Q1, q.run, 0, 0, 0, task_attempt_id=2), producer, base)

    old.add(journal, _continue(framing, producer, base + 1, "old-0"))
    await old.flush(journal)
    new.add(journal, _continue(framing, producer, base + 1, "new-0"))
    with pytest.raises(ProducerClaimedError):
        await new.flush(journal)
    # The old attempt fails: its rollback releases the claim, and the new attempt takes it.
    await _roll_back(env.client, old, ack_message(framing, producer, base))
    new.add(journal, b"".join(_continue(framing, producer, base + i, f"new-{i}") for i in (1, 2)))
    await new.flush(journal)
    await _roll_back(env.client, old, ack_message(framing, producer, base))  # Again: refused.
    new.add(journal, _continue(framing, producer, base + 3, "new-3"))
    await new.flush(journal)

    winner = _published(new, producer, base, rows=3)
    await q.commit(0, [winner])
    assert sorted(await committed(env, journal)) == ["new-1", "new-2", "new-3"]
    assert await _names(env, journal) == [rows_register_name(Q1), register_name(Q1)]


def _published(buffers: _Buffers, producer: ProducerID, base: int, rows: int) -> PublishedTxn:
    journal = next(iter(buffers.appended))
    return PublishedTxn(
        task=buffers._task,
        producer=producer.hex(),
        base_clock=base,
        ack_clock=base + rows + 1,
        rows=rows,
        acks={journal: JSON_LINES.ack(producer, base + rows + 1)},
        rollbacks={journal: JSON_LINES.ack(producer, base)},
        framings={journal: JSON_LINES},
    )


async def test_a_first_append_that_landed_unseen_is_not_appended_twice(env: Env) -> None:
    """The first append to a journal landed, but its response was lost and it was tried again:
    the retry finds the claim (the task's own) in place of the absence it requires, and takes
    the append as landed rather than failing or appending the rows twice."""
    journal = await env.journal("sink/claim-landed")
    q = Query(env, journal)
    base = q.plan()
    task = TaskIdentity(Q1, q.run, 0, 0, 0, task_attempt_id=5)
    producer, framing = task.producer(), JSONFraming()
    buffers = _Buffers(env.client, task, producer, base)
    content = b"".join(_continue(framing, producer, base + i, f"r-{i}") for i in (1, 2))
    await append(env.client, await buffers.request(journal), content)  # Landed, unseen.
    buffers.add(journal, content)
    await buffers.flush(journal)  # The retry.
    buffers.add(journal, _continue(framing, producer, base + 3, "r-3"))
    await buffers.flush(journal)  # Now fenced on its own claim.

    await q.commit(0, [_published(buffers, producer, base, rows=3)])
    assert await committed(env, journal) == ["r-1", "r-2", "r-3"]
    assert await written(env, journal) == 3


async def test_a_commit_without_the_winners_claim_commits_nothing(env: Env) -> None:
    """A winner must hold its claim where it published: if not (removed by hand, or by a
    broken tool), its messages may have been rolled back, and the commit is refused there."""
    journal = await env.journal("sink/claim-gone")
    q = Query(env, journal)
    base = q.plan()
    winner = await q.task(0, base, 0, ["a", "b"])
    registers = await read_registers(env.client, journal)
    claim = next(label for label in registers.labels if label.name.startswith(CLAIM_PREFIX))
    await append(
        env.client,
        pb.AppendRequest(journal=journal, subtract_registers=pb.LabelSet(labels=[claim])),
        b'{"text": "unrelated"}\n',
    )
    with pytest.raises(GazetteSinkError, match="does not hold the claim"):
        await q.commit(0, [winner])
    assert await committed(env, journal) == ["unrelated"]
    assert register_name(Q1) not in await _names(env, journal)


async def test_a_dead_runs_claims_are_rolled_back_by_the_next_run(env: Env) -> None:
    """Run 1's driver died while micro-batch 6's tasks had published: the claims they left name
    their producers and base clock, and run 2's first commit closes those transactions (at
    that base: nothing of them is committed) and removes the claims."""
    journal = await env.journal("sink/claims-dead-run")
    first = Query(env, journal, run="run-1")
    b6 = first.plan()
    for p in (0, 1):
        await first.task(6, b6, p, [f"dead-{p}"])
    second = Query(env, journal, run="run-2")
    second.base = b6 + 5_000_000  # Planned later: an ACK at its base would commit them.
    b6 = second.plan()
    await second.commit(6, [await second.task(6, b6, p, [f"b6-{p}"]) for p in (0, 1)])

    head = await write_head(env.client, journal)
    walk = CommittedRange(source(env, journal), 0, head, ring_size=64)
    assert sorted(await walk_texts(walk)) == ["b6-0", "b6-1"]
    assert all(state.begin == -1 for state in walk.checkpoint().producers.values())
    assert await _names(env, journal) == [rows_register_name(Q1), register_name(Q1)]


async def test_another_querys_stale_claim_is_rolled_back_and_removed(env: Env) -> None:
    """A query abandoned in the middle of a micro-batch a month ago left a claim: another
    query's commit to the journal closes its transaction and removes it; a recent claim of
    another query stays."""
    journal = await env.journal("sink/claims-stale")
    framing = JSONFraming()
    long_ago = int(time.time()) - stale_register_s - 60
    for query, at_s, partition in ((Q2, long_ago, 0), (Q2, int(time.time()), 1)):
        task = TaskIdentity(query, "gone", 3, partition, 0, task_attempt_id=partition)
        producer = task.producer()
        claim = Claim.of(task, producer, 1000, at_s)
        await append(
            env.client,
            pb.AppendRequest(journal=journal, union_registers=pb.LabelSet(labels=[claim.label()])),
            _continue(framing, producer, 1001, f"abandoned-{partition}"),
        )
    q = Query(env, journal)
    base = q.plan()
    await q.commit(0, [await q.task(0, base, 0, ["a"])])

    assert await _names(env, journal) == [
        claim_name(TaskIdentity(Q2, "gone", 3, 1, 0).producer()),
        rows_register_name(Q1),
        register_name(Q1),
    ]
    walk = CommittedRange(
        source(env, journal), 0, await write_head(env.client, journal), ring_size=64
    )
    assert await walk_texts(walk) == ["a"]
    open_spans = [
        p.producer for p, state in walk.checkpoint().producers.items() if state.begin != -1
    ]
    assert open_spans == [TaskIdentity(Q2, "gone", 3, 1, 0).producer()]  # The recent one.


def test_claims_parse_what_they_encode() -> None:
    task = TaskIdentity(Q1, "r", 7, 2, 0, task_attempt_id=123)
    claim = Claim.of(task, task.producer(), 99, 1_700_000_000)
    assert Claim.parse(claim.name, claim.encode()) == claim
    assert len(claim.name) <= 64  # A label name's bound.
    assert Claim.parse(claim.name, "not/a/claim") is None
    assert Claim.parse(CLAIM_PREFIX + "zz" * 6, claim.encode()) is None
    assert Claim.parse(register_name(Q1), claim.encode()) is None


async def _claim_count(env: Env, journal: str) -> int:
    return sum(name.startswith(CLAIM_PREFIX) for name in await _names(env, journal))


async def test_claims_of_crashed_runs_are_taken_over_not_piled_up(env: Env) -> None:
    """Found by review: a query whose driver crashed mid-micro-batch five times with 200
    partitions (Spark's default for a stateful query) left 1,000 claims, which only a commit
    removed; the sixth run's tasks could not add theirs (a journal holds at most 1,024
    registers) and no run could ever commit again. Now each task's first append takes over
    the claims of its partition left by other runs (rolled back at their base clocks, removed):
    the journal's registers shrink as the run goes."""
    journal = await env.journal("sink/claims-pile-up")
    framing, dead_base = JSONFraming(), Query(env, journal).plan()
    claims, pending = [], []
    for run in range(5):  # Five crashed runs of micro-batch 7, as their tasks left them.
        for p in range(200):
            task = TaskIdentity(Q1, f"run-{run}", 7, p, 0, task_attempt_id=run * 1000 + p)
            claims.append(Claim.of(task, task.producer(), dead_base, int(time.time())).label())
            pending.append(_continue(framing, task.producer(), dead_base + 1, f"dead-{run}-{p}"))
    await append(
        env.client,
        pb.AppendRequest(
            journal=journal,
            union_registers=pb.LabelSet(labels=sorted(claims, key=lambda x: (x.name, x.value))),
        ),
        b"".join(pending),
    )
    assert await _claim_count(env, journal) == 1000

    sixth = Query(env, journal, run="run-5")
    sixth.base = dead_base
    base = sixth.plan()
    winners = [await sixth.task(7, base, p, [f"r5-p{p}"]) for p in range(200)]
    assert await sixth.commit(7, winners) == {journal: Decision.COMMIT}
    assert sorted(await committed(env, journal)) == sorted(f"r5-p{p}" for p in range(200))
    assert await _claim_count(env, journal) == 0


async def test_an_attempt_after_a_roll_back_only_does_not_block_the_next_micro_batch(
    env: Env,
) -> None:
    """Found by review: a restored query's micro-batch 1 is resolved ROLL_BACK_ONLY (the
    register stays at the earlier run's micro-batch 2), and an attempt of it that Spark gave up
    on appends afterwards under the run's attempt-0 producer of partition 0. Micro-batch 2's
    attempt 0 of partition 0 takes that claim over (its micro-batch is earlier) instead of
    failing with ProducerClaimedError, and the late attempt's rows are never committed."""
    journal = await env.journal("sink/roll-back-only-zombie")
    second = await restored_after_micro_batch_0(env, journal)
    b1 = second.plan()
    won = await second.task(1, b1, 0, ["b1"])
    assert await second.commit(1, [won]) == {journal: Decision.ROLL_BACK_ONLY}
    await second.task(1, b1, 0, ["zombie"])  # Given up on, it appends now.

    b2 = second.plan()
    txn = await second.task(2, b2, 0, ["b2"])
    assert await second.commit(2, [txn]) == {journal: Decision.ROLL_BACK}
    b3 = second.plan()
    assert await second.commit(3, [await second.task(3, b3, 0, ["b3"])]) == {
        journal: Decision.COMMIT
    }
    assert await committed(env, journal) == ["b0", "b1", "b2", "b3"]
    assert await _claim_count(env, journal) == 0


async def test_a_claim_that_outlived_its_micro_batchs_commit_is_taken_over(env: Env) -> None:
    """Found by review: the resubmitted stage's attempt 0 of partition 0 made its first append
    between the driver's read of the registers and its commit append (whose check covers the
    query's register only), so its claim and its rows outlived the commit. Micro-batch 1's
    attempt 0 (the same producer) takes the claim over, rolling those rows back, instead of
    failing with ProducerClaimedError. (The state the race leaves is made here directly.)"""
    journal = await env.journal("sink/late-claim")
    q = Query(env, journal)
    b0 = q.plan()
    winner = await q.task(0, b0, 0, ["a"], attempt=1)
    assert await q.commit(0, [winner]) == {journal: Decision.COMMIT}

    late_task = TaskIdentity(Q1, q.run, 0, 0, 0, task_attempt_id=99)
    producer = late_task.producer()
    late = Claim.of(late_task, producer, b0, int(time.time()))
    await append(
        env.client,
        pb.AppendRequest(journal=journal, union_registers=pb.LabelSet(labels=[late.label()])),
        _continue(JSONFraming(), producer, b0 + 1, "zombie"),
    )

    b1 = q.plan()
    txn = await q.task(1, b1, 0, ["b"])
    assert txn.producer == producer.hex()
    assert await q.commit(1, [txn]) == {journal: Decision.COMMIT}
    assert await committed(env, journal) == ["a", "b"]
    assert await _claim_count(env, journal) == 0
