"""Who writes: the identity of a write task, the ProducerID it publishes under, and the register
and register value that record a streaming sink's progress in a journal (sans-IO).

A streaming write is identified by Spark's query id: Spark keeps it in the checkpoint, so a
restart from the checkpoint is the same query, and a query started on a new (or deleted)
checkpoint is another one. Within it, Spark's run id names one start of the query, and each
micro-batch is run by tasks (one per partition, retried under new attempt numbers). Spark puts
all of these in every task's local properties, where `TaskIdentity.current()` reads them.

Producers. Gazette readers keep state per ProducerID (its last acknowledged clock), so a sink
that minted a new producer per task and micro-batch would grow every reader's state without
bound. Instead the first attempt of partition k publishes, in every micro-batch of a run,
under one producer derived from (query, run, k); its transactions follow each other, each
committed or rolled back by the driver before the next micro-batch starts. A retry (attempt
> 0) publishes under a producer of its own, derived from Spark's task attempt id (unique in
the application), used once: so retries and speculative copies never share a producer. A new
run starts with new producers, so nothing a crashed run left pending can ever be committed by
the next one. A stream reading the sink's output thus remembers about one producer per
partition per run, plus one per retried task.

Claims. Attempt numbers count within a stage attempt: when Spark resubmits a stage (an
executor was lost), the new stage attempt runs the partition as attempt 0 again, possibly while
the old attempt 0 still runs, and both would publish under the same producer at the same clocks
(readers would take the second copy of each clock for a duplicate of the first: rows committed
twice or never). So a task claims its producer in each journal with its first append there: a
register `gazette.spark.claim/<producer>` (`Claim`), added by that append only if absent, and
required to hold the task's own claim by each later append. An attempt that finds its producer
claimed by another fails (`ProducerClaimedError`) and appends nothing; Spark retries it under a
producer of its own. The driver's commit rolls back the producer of every claim that is not a
winner's (at that claim's base clock) and removes the micro-batch's claims with the same
append, so the claims also tell it exactly which failed attempts left messages where. A claim
that outlives its micro-batch (its run crashed before the commit; an attempt that landed as the
commit did, or after a ROLL_BACK_ONLY) is stale (`Claim.stale_for`): the first append of the
next task of its partition takes it over, rolling it back and removing it, so claims of
crashed runs do not pile up to the bound on a journal's registers.

Clocks. Every task of micro-batch B numbers its messages from the same base clock T_B (taken
by the driver when it plans B's write, from the wall clock): message i of a task has clock
T_B + 1 + i, and its ACK the clock after its last message. "ACK at T_B" is then a clean
rollback of whatever any attempt of B published under a producer: below every message of B
(they are not committed) and not below the producer's last ACK (bounded by the previous
micro-batch's clocks, which the driver checks: `SinkMark.high_clock`).

Register. In each journal it writes to, a streaming query keeps one register,
`gazette.spark/<query id>`, whose value (`SinkMark`) says which micro-batch the query last
resolved there, by which run, the highest clock that run used there, and when (for pruning).
sink_commit.py reads and updates it atomically with the ACKs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final

from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message.uuid import ProducerID, new_producer_id, producer_id

# Spark's local properties of a streaming micro-batch's tasks.
QUERY_ID_PROPERTY: Final = "sql.streaming.queryId"
BATCH_ID_PROPERTY: Final = "streaming.sql.batchId"
RUN_ID_PROPERTY: Final = "spark.jobGroup.id"  # Streaming sets the job group to the run id.

REGISTER_PREFIX: Final = "gazette.spark/"
CLAIM_PREFIX: Final = "gazette.spark.claim/"
# A register of a query that resolved nothing for this long is pruned by other queries'
# commits to the same journal (registers would otherwise pile up, one per query ever run). A
# query stopped for longer that replays its last micro-batch on restart would commit it again.
stale_register_s: Final = 30 * 86_400


class GazetteSinkError(RuntimeError):
    """A streaming write cannot be committed safely; nothing of the micro-batch was committed."""


class StaleAttemptError(GazetteSinkError):
    """A task attempt of a micro-batch that its query already resolved in a journal (Spark
    gave up on the attempt, and its retry's rows were committed or rolled back): it must not
    append there, since a later ACK of its producer would commit what it appended."""


class ProducerClaimedError(GazetteSinkError):
    """Another attempt of the task's partition claimed its producer in a journal for this
    micro-batch (Spark resubmitted the stage): this attempt appended nothing there and fails,
    and Spark's retry publishes under a producer of its own."""


@dataclass(frozen=True)
class TaskIdentity:
    """A write task: its query, run and micro-batch (streaming; "" and -1 for a batch write),
    its partition and attempt (within its stage attempt), and Spark's task attempt id (unique
    among every task attempt of the application)."""

    query: str
    run: str
    batch: int
    partition: int
    attempt: int
    task_attempt_id: int = 0

    @classmethod
    def current(cls, streaming: bool) -> TaskIdentity:
        """The identity of the Spark task this runs in: of a streaming write's task if
        `streaming` (and Spark says which query and micro-batch), else a batch write's."""
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:  # Not in a Spark task (a direct call).
            return cls("", "", -1, 0, 0)
        if not streaming:
            return cls("", "", -1, context.partitionId(), context.attemptNumber())
        attempt_id = context.taskAttemptId()
        query = context.getLocalProperty(QUERY_ID_PROPERTY) or ""
        batch_text = context.getLocalProperty(BATCH_ID_PROPERTY) or ""
        batch = int(batch_text) if query and batch_text.isdigit() else -1
        run = (context.getLocalProperty(RUN_ID_PROPERTY) or "") if query else ""
        return cls(query, run, batch, context.partitionId(), context.attemptNumber(), attempt_id)

    @property
    def streaming(self) -> bool:
        return bool(self.query) and self.batch >= 0

    def producer(self) -> ProducerID:
        """The ProducerID this task publishes under (see the module docstring)."""
        if not self.streaming:
            return new_producer_id()  # A batch write: one transaction per producer.
        if self.attempt == 0 and self.run:
            key = f"{self.query}\0{self.run}\0{self.partition}"
        else:
            # A retry, or no run id to keep producers from outliving a run: used once. Keyed
            # by the task attempt id, as attempt numbers repeat in a resubmitted stage.
            key = (
                f"{self.query}\0{self.run}\0{self.partition}\0{self.batch}\0{self.task_attempt_id}"
            )
        digest = hashlib.sha256(key.encode()).digest()
        return new_producer_id(lambda n: digest[:n])


def register_name(query: str) -> str:
    return REGISTER_PREFIX + query


def claim_name(producer: ProducerID) -> str:
    return CLAIM_PREFIX + producer.hex()


@dataclass(frozen=True)
class Claim:
    """A producer's claim in a journal (see the module docstring): by task attempt
    `task_attempt_id` of partition `partition` of micro-batch `batch` of run `run` of query
    `query`, whose messages there are numbered from past `base_clock`; `at_s` (unix seconds)
    when it was made."""

    producer: ProducerID
    query: str
    run: str
    batch: int
    partition: int
    base_clock: int
    task_attempt_id: int
    at_s: int

    @classmethod
    def of(cls, task: TaskIdentity, producer: ProducerID, base_clock: int, at_s: int) -> Claim:
        return cls(
            producer,
            task.query,
            task.run,
            task.batch,
            task.partition,
            base_clock,
            task.task_attempt_id,
            at_s,
        )

    @property
    def name(self) -> str:
        return claim_name(self.producer)

    def encode(self) -> str:
        return (
            f"{self.query}/{self.run}/{self.batch}/{self.partition}/{self.base_clock}"
            f"/{self.task_attempt_id}/{self.at_s}"
        )

    def label(self) -> pb.Label:
        return pb.Label(name=self.name, value=self.encode())

    def stale_for(self, task: TaskIdentity) -> bool:
        """Whether a task of the same query and partition takes this claim over with its first
        append (`publish._Buffers`): a claim of another run (which died, or is a zombie: the
        query runs one run at a time) or of an earlier micro-batch (Spark runs the next only
        once the driver committed this one: a claim left is an attempt's that died, or that
        landed as the commit did), never one of the task's own micro-batch (another attempt of
        it, which may be running)."""
        return (
            self.query == task.query
            and self.partition == task.partition
            and (self.run != task.run or self.batch < task.batch)
        )

    @classmethod
    def parse(cls, name: str, value: str) -> Claim | None:
        """The claim a register holds, or None if it is not one this sink writes."""
        parts = value.rsplit("/", 6)
        hex_ = name.removeprefix(CLAIM_PREFIX)
        if (
            len(parts) != 7
            or not name.startswith(CLAIM_PREFIX)
            or len(hex_) != 12
            or not all(p.isdigit() for p in parts[2:])
        ):
            return None
        try:
            producer = producer_id(bytes.fromhex(hex_))
        except ValueError:
            return None
        batch, partition, base, attempt_id, at_s = (int(p) for p in parts[2:])
        return cls(producer, parts[0], parts[1], batch, partition, base, attempt_id, at_s)


def claims_of(registers: pb.LabelSet) -> list[Claim]:
    """Every claim among a journal's registers."""
    out = []
    for label in registers.labels:
        if label.name.startswith(CLAIM_PREFIX):
            claim = Claim.parse(label.name, label.value)
            if claim is not None:
                out.append(claim)
    return out


def check_not_stale(task: TaskIdentity, journal: str, value: str, base_clock: int) -> None:
    """Raise StaleAttemptError if the query's register in `journal` (its value `value`, read by
    the task before its first append there) says that the task's micro-batch is resolved: by
    this run (an attempt Spark gave up on, still running after the commit), or a later
    micro-batch by another run that planned it after this task's micro-batch was planned (its
    clocks are above the task's base clock `base_clock`: the task is a zombie of a run that
    died). A task fences its appends on the value it read, so a stale attempt that read the
    register before the driver resolved the micro-batch is refused by the broker; this refuses
    one that read it after, which the fence alone would let through.

    A micro-batch resolved by *another* run is no reason: a new run re-runs the last
    micro-batch of the one before, and its driver rolls those rows back (sink_commit.py). Nor
    is a later micro-batch resolved by another run *before* this task's was planned: the query
    was restarted from an older checkpoint (a backup restored), and re-runs micro-batches an
    earlier run committed, which its driver rolls back (ROLL_BACK_ONLY)."""
    if not value:
        return
    mark = SinkMark.parse(value)
    if mark.run == task.run:
        stale = mark.batch >= task.batch
    else:
        stale = mark.batch > task.batch and base_clock <= mark.high_clock
    if stale:
        raise StaleAttemptError(
            f"{journal}: micro-batch {task.batch} of query {task.query} (run {task.run}) is"
            f" resolved there already (the query's register records micro-batch {mark.batch}"
            f" of run {mark.run}): attempt {task.attempt} of partition {task.partition} is one"
            " Spark gave up on, and appends nothing"
        )


@dataclass(frozen=True)
class SinkMark:
    """A query's register value in one journal: micro-batch `batch` was resolved there by run
    `run` (its rows committed, or, if an earlier run had committed that micro-batch, its
    messages rolled back), `high_clock` is the highest clock that run used there, `at_s`
    (unix seconds) when, and `routing` how that run routed rows to journals (`RowShape.routing`;
    "" when a change of the journals cannot move rows, and in marks written before it was
    kept)."""

    batch: int
    run: str
    high_clock: int
    at_s: int
    routing: str = ""

    def encode(self) -> str:
        out = f"{self.batch}/{self.run}/{self.high_clock}/{self.at_s}"
        return f"{out}/{self.routing}" if self.routing else out

    @classmethod
    def parse(cls, text: str) -> SinkMark:
        parts = text.split("/")
        if len(parts) not in (4, 5) or not all(p.isdigit() for p in (parts[0], parts[2], parts[3])):
            raise GazetteSinkError(
                f"register value {text!r}: not batch/run/clock/time[/routing], as this sink"
                " writes it"
            )
        routing = parts[4] if len(parts) == 5 else ""
        return cls(int(parts[0]), parts[1], int(parts[2]), int(parts[3]), routing)
