"""Committing a streaming micro-batch exactly once: one conditional append per journal.

Spark calls `commit(messages, batch_id)` on the driver once every task of a micro-batch
succeeded, and may call it again for the same micro-batch after a failure: the driver died after
the sink committed but before Spark recorded it, so the restarted query (a new run) re-runs the
micro-batch, whose tasks publish its rows again under the new run's producers. Spark only ever
re-runs the last micro-batch a query ran; a new query (a new checkpoint, or another query given
the same journals) starts with other ids. What must hold: each micro-batch of a query is
committed once, whichever runs ran it, and nothing a run published but did not commit is ever
committed by an ACK of the same producer later (producers of a run are used in each of its
micro-batches: sink_task.py).

Per journal, the query's register holds the last micro-batch it resolved there (`SinkMark`).
The driver reads it and decides (`decide`, sans-IO):

- COMMIT, if that micro-batch is older (or there is none): append the ACKs of the winning
  attempts, and the rollbacks of the attempts that failed (their producers publish again in
  the next micro-batch; an attempt that died left its messages pending), and set the register
  to this micro-batch;
- ROLL_BACK, if another run resolved this micro-batch already: it committed the rows, so this
  run's are rolled back, and the register records that this run resolved it too;
- DONE, if this run resolved it already: our own append landed once before (a retry).

When the register was last set by another run (the query restarted), the append also closes
what that run's producers left open (`previous_run_rollbacks`). The append carries the check
that the register still holds what was read, so two drivers (a zombie and its successor)
cannot both commit; on REGISTER_MISMATCH it reads again and decides again, at most
`commit_attempts_max` times. A register ahead of the micro-batch (Spark restored an older
checkpoint) is ROLL_BACK_ONLY: those micro-batches were committed; the register stays.
Each commit also removes the registers of other queries that resolved nothing for
`stale_register_s` (sink_task.py), so that they do not pile up.

Concurrent queries on one journal each have their own register and producers: each commits
each of its micro-batches once, independently (as Delta's idempotent writes key transactions by
query id). Kafka's transactional producers fence by transactional id instead; here the
transactional id is the query id, and the only writers it fences are earlier runs of itself.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from broker.client.appender import append
from broker.client.route_cache import JournalClient
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import RegisterMismatchError
from spark_integration.publish import PublishedTxn, read_registers
from spark_integration.sink_task import (
    REGISTER_PREFIX,
    GazetteSinkError,
    SinkMark,
    TaskIdentity,
    register_name,
    stale_register_s,
)
from spark_integration.write_framing import JSON_LINES, WriteFraming

# Reads and conditional appends of one journal's commit, the first included, before giving up
# with GazetteSinkError (each conflict means another driver of the query wrote meanwhile).
commit_attempts_max: Final = 8
commit_backoff_initial_s: Final = 0.05
commit_backoff_max_s: Final = 2.0


class Decision(enum.Enum):
    COMMIT = "commit"
    ROLL_BACK = "roll back"
    ROLL_BACK_ONLY = "roll back, register unchanged"
    DONE = "done"


@dataclass(frozen=True)
class BatchTxns:
    """The transactions of one micro-batch, from its tasks' commit messages: the winning attempt
    of each partition, and the producers of the attempts that failed before it."""

    query: str
    run: str
    batch: int
    base_clock: int
    winners: tuple[PublishedTxn, ...]
    losers: tuple[TaskIdentity, ...] = field(default=())

    @classmethod
    def of(cls, messages: Sequence[Any], batch: int) -> BatchTxns | None:
        """None when no task sent a message (nothing was published)."""
        winners = tuple(m for m in messages if isinstance(m, PublishedTxn))
        if not winners:
            return None
        first = winners[0].task
        if not first.streaming:
            raise GazetteSinkError(
                f"micro-batch {batch}: the tasks ran outside a streaming query (no query id)"
            )
        for txn in winners:
            task = txn.task
            if (task.query, task.run, task.batch, txn.base_clock) != (
                first.query,
                first.run,
                batch,
                winners[0].base_clock,
            ):
                raise GazetteSinkError(
                    f"micro-batch {batch}: a task of query {task.query} run {task.run} batch"
                    f" {task.batch} in the commit of query {first.query} run {first.run}"
                )
        losers = tuple(
            TaskIdentity(first.query, first.run, batch, txn.task.partition, attempt)
            for txn in winners
            for attempt in range(txn.task.attempt)
        )
        return cls(first.query, first.run, batch, winners[0].base_clock, winners, losers)

    @property
    def journals(self) -> list[str]:
        return sorted({journal for txn in self.winners for journal in txn.acks})

    @property
    def high_clock(self) -> int:
        """The highest clock any winner used (its ACK's): what the next micro-batch's clocks
        must exceed, its producers being used again."""
        return max(txn.ack_clock for txn in self.winners)

    def framing(self, journal: str) -> WriteFraming:
        """How the micro-batch's messages are framed in `journal` (JSON lines or CSV records
        of a width: write_framing.py): the driver's own ACKs there must be framed alike."""
        for txn in self.winners:
            framing = txn.framings.get(journal)
            if framing is not None:
                return framing
        return JSON_LINES

    def commit_content(self, journal: str) -> bytes:
        """The winners' ACKs in `journal`, and rollbacks of every failed attempt's producer."""
        acks = [txn.acks[journal] for txn in self.winners if journal in txn.acks]
        return b"".join(acks) + self._loser_rollbacks(journal)

    def rollback_content(self, journal: str) -> bytes:
        rollbacks = [txn.rollbacks[journal] for txn in self.winners if journal in txn.rollbacks]
        return b"".join(rollbacks) + self._loser_rollbacks(journal)

    def previous_run_rollbacks(self, journal: str, current: SinkMark | None) -> bytes:
        """Rollbacks of what an earlier run that last resolved the journal (`current`) left
        open there: the micro-batch it published but did not commit when it died. An ACK at
        that run's high clock is not below any ACK it committed there, and below every clock
        it used after (sink_task.py): it commits nothing and closes the open transaction of the
        run's producer of each partition, which readers would otherwise remember forever."""
        if current is None or not current.run or current.run == self.run:
            return b""
        framing = self.framing(journal)
        partitions = sorted({txn.task.partition for txn in self.winners})
        return b"".join(
            framing.ack(
                TaskIdentity(self.query, current.run, current.batch, k, 0).producer(),
                current.high_clock,
            )
            for k in partitions
        )

    def _loser_rollbacks(self, journal: str) -> bytes:
        # An ACK at the base clock rolls back what any attempt of this micro-batch published
        # under the producer (sink_task.py). Appended in every journal of the micro-batch: an
        # attempt that died may have reached any of the journals its retry writes to.
        framing = self.framing(journal)
        return b"".join(framing.ack(loser.producer(), self.base_clock) for loser in self.losers)


def decide(current: SinkMark | None, txns: BatchTxns) -> Decision:
    """What to do in a journal whose register holds `current` (see the module docstring)."""
    if current is None or current.batch < txns.batch:
        if (
            current is not None
            and current.run == txns.run
            and txns.base_clock <= current.high_clock
        ):
            # The producers of this run were used up to high_clock there: messages numbered
            # from base_clock would read as duplicates of them. (The wall clock went back.)
            raise GazetteSinkError(
                f"micro-batch {txns.batch}: its clocks start at {txns.base_clock}, not after"
                f" {current.high_clock}, the highest clock of micro-batch {current.batch} of this"
                " run: the driver's clock went back; restart the query"
            )
        return Decision.COMMIT
    if current.batch == txns.batch:
        return Decision.DONE if current.run == txns.run else Decision.ROLL_BACK
    if current.run == txns.run:
        raise GazetteSinkError(
            f"micro-batch {txns.batch}: this run resolved micro-batch {current.batch} already;"
            " Spark runs a query's micro-batches in order"
        )
    return Decision.ROLL_BACK_ONLY


def _mark_of(registers: pb.LabelSet, register: str) -> SinkMark | None:
    value = gl.value_of(registers, register)
    return SinkMark.parse(value) if value else None


def _stale(registers: pb.LabelSet, own: str, now_s: int) -> list[pb.Label]:
    """Registers of other queries that resolved nothing for `stale_register_s`."""
    out = []
    for label in registers.labels:
        if label.name == own or not label.name.startswith(REGISTER_PREFIX):
            continue
        try:
            mark = SinkMark.parse(label.value)
        except GazetteSinkError:
            continue  # Not one of ours after all: leave it.
        if mark.at_s < now_s - stale_register_s:
            out.append(pb.Label(name=label.name, value=label.value))
    return out


def _update_request(
    journal: str, registers: pb.LabelSet, register: str, mark: SinkMark
) -> pb.AppendRequest:
    current = gl.value_of(registers, register)
    if current:
        check = pb.LabelSelector(
            include=pb.LabelSet(labels=[pb.Label(name=register, value=current)])
        )
    else:
        check = pb.LabelSelector(exclude=pb.LabelSet(labels=[pb.Label(name=register)]))
    request = pb.AppendRequest(
        journal=journal,
        check_registers=check,
        union_registers=pb.LabelSet(labels=[pb.Label(name=register, value=mark.encode())]),
    )
    stale = sorted(_stale(registers, register, mark.at_s), key=lambda x: (x.name, x.value))
    if stale:
        request.subtract_registers.CopyFrom(pb.LabelSet(labels=stale))
    return request


async def commit_journal(client: JournalClient, journal: str, txns: BatchTxns) -> Decision:
    """Resolve the micro-batch in `journal` (see the module docstring); return what was done."""
    register = register_name(txns.query)
    delay = commit_backoff_initial_s
    for attempt in range(1, commit_attempts_max + 1):
        registers = await read_registers(client, journal)
        decision = decide(_mark_of(registers, register), txns)
        if decision is Decision.DONE:
            return decision
        if decision is Decision.ROLL_BACK_ONLY:
            await append(client, pb.AppendRequest(journal=journal), txns.rollback_content(journal))
            return decision
        current = _mark_of(registers, register)
        mark = SinkMark(txns.batch, txns.run, txns.high_clock, int(time.time()))
        content = (
            txns.commit_content(journal)
            if decision is Decision.COMMIT
            else txns.rollback_content(journal)
        ) + txns.previous_run_rollbacks(journal, current)
        try:
            await append(client, _update_request(journal, registers, register, mark), content)
        except RegisterMismatchError:
            if attempt == commit_attempts_max:
                break
            await asyncio.sleep(delay)
            delay = min(commit_backoff_max_s, delay * 2)
            continue
        return decision
    raise GazetteSinkError(
        f"micro-batch {txns.batch}: the register {register} of {journal} kept changing"
        f" ({commit_attempts_max} attempts): is another driver running this query?"
    )


async def commit_batch(client: JournalClient, txns: BatchTxns) -> dict[str, Decision]:
    journals = txns.journals
    decisions = await asyncio.gather(*(commit_journal(client, j, txns) for j in journals))
    return dict(zip(journals, decisions, strict=True))


async def abort_batch(client: JournalClient, txns: BatchTxns) -> None:
    """Roll back every attempt of the micro-batch (Spark aborts it: the query stops)."""
    await asyncio.gather(
        *(
            append(client, pb.AppendRequest(journal=j), txns.rollback_content(j))
            for j in txns.journals
        )
    )
