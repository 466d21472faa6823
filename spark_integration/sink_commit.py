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

Which failed attempts left messages in the journal, the producers' claims there say
(sink_task.py): each resolving append rolls back the producer of every claim of the query that
is not a winner's, at that claim's base clock (which commits nothing of it: its messages are
numbered past it), and removes the claims it read. That covers attempts that died and attempts
of an earlier run of the query that died with its driver. A winner's claim must be there
(a COMMIT without it is refused: its messages may have been rolled back). The append carries
the check that the register still holds what was read, so two drivers (a zombie and its successor)
cannot both commit; on REGISTER_MISMATCH it reads again and decides again, at most
`commit_attempts_max` times. A register ahead of the micro-batch (Spark restored an older
checkpoint) is ROLL_BACK_ONLY: those micro-batches were committed; the register stays.
Each commit also removes the registers of other queries that resolved nothing for
`stale_register_s` (sink_task.py), so that they do not pile up.

Per-journal decisions are exact only if a re-run routes each row to the journal the first run
did: true of rows naming their journal, or of one journal, not of a keyColumn write whose key
journals changed between the runs. The register records the routing's fingerprint, and a
micro-batch that another run committed under another routing is not committed anywhere by a
re-run (`check_routing`: GazetteSinkError).

ROLL_BACK and ROLL_BACK_ONLY are exact only if the re-run holds the rows the committed run did:
each COMMIT also records how many rows the micro-batch committed in the journal
(sink_rows.py), and a re-run holding another number there is refused (`check_replay`:
ReplayMismatchError). `commit_batch` checks every journal before it appends to any, so a
micro-batch refused in one journal is committed in none.

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
from dataclasses import dataclass
from typing import Any, Final

from broker.client.appender import append
from broker.client.route_cache import JournalClient
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import RegisterMismatchError
from spark_integration.publish import PublishedTxn, read_registers
from spark_integration.sink_rows import (
    ROWS_PREFIX,
    BatchRows,
    ReplayMismatchError,
    rows_register_name,
)
from spark_integration.sink_task import (
    REGISTER_PREFIX,
    Claim,
    GazetteSinkError,
    SinkMark,
    claims_of,
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
    of each partition."""

    query: str
    run: str
    batch: int
    base_clock: int
    winners: tuple[PublishedTxn, ...]
    # How the micro-batch's rows were routed to journals (RowShape.routing).
    routing: str = ""
    # Whether a re-run must hold the rows the committed run held, in number (option
    # replayCheck: sink_rows.py).
    replay_check: bool = True

    @classmethod
    def of(
        cls,
        messages: Sequence[Any],
        batch: int,
        routing: str = "",
        *,
        replay_check: bool = True,
    ) -> BatchTxns | None:
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
        return cls(
            first.query, first.run, batch, winners[0].base_clock, winners, routing, replay_check
        )

    @property
    def journals(self) -> list[str]:
        return sorted({journal for txn in self.winners for journal in txn.acks})

    def rows_in(self, journal: str) -> int:
        """The rows the winners published in `journal`."""
        return sum(txn.journal_rows.get(journal, 0) for txn in self.winners)

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

    def commit_content(self, journal: str, claims: Sequence[Claim]) -> bytes:
        """The winners' ACKs in `journal`, and rollbacks of the claims of failed attempts."""
        acks = [txn.acks[journal] for txn in self.winners if journal in txn.acks]
        return b"".join(acks) + self.loser_rollbacks(journal, claims)

    def rollback_content(self, journal: str, claims: Sequence[Claim]) -> bytes:
        rollbacks = [txn.rollbacks[journal] for txn in self.winners if journal in txn.rollbacks]
        return b"".join(rollbacks) + self.loser_rollbacks(journal, claims)

    def claims_to_resolve(self, registers: pb.LabelSet, now_s: int) -> list[Claim]:
        """The claims in a journal's `registers` that its resolving append rolls back (but
        for winners') and removes: the query's, of this micro-batch's attempts and of those an
        earlier run left; and other queries' that are `stale_register_s` old (a query
        abandoned in the middle of a micro-batch)."""
        return [
            claim
            for claim in claims_of(registers)
            if claim.query == self.query or claim.at_s < now_s - stale_register_s
        ]

    def loser_rollbacks(self, journal: str, claims: Sequence[Claim]) -> bytes:
        """An ACK at its base clock of each claim's producer that is not a winner's in
        `journal`: below every message the attempt published there, and not below an ACK it
        committed (a claim is removed with the ACK that resolves it)."""
        framing = self.framing(journal)
        winners = {txn.producer for txn in self.winners if journal in txn.acks}
        return b"".join(
            framing.ack(claim.producer, claim.base_clock)
            for claim in claims
            if claim.producer.hex() not in winners
        )

    def check_winners_claimed(self, journal: str, claims: Sequence[Claim]) -> None:
        """Raise GazetteSinkError unless each winner that published in `journal` holds its
        claim there: else its messages may have been rolled back, and an ACK would commit
        less than the rows Spark was told were written."""
        held = {(c.producer.hex(), c.batch, c.task_attempt_id) for c in claims}
        for txn in self.winners:
            task = txn.task
            if journal in txn.acks and (txn.producer, task.batch, task.task_attempt_id) not in held:
                raise GazetteSinkError(
                    f"micro-batch {self.batch}: {journal} does not hold the claim of partition"
                    f" {task.partition}'s producer {txn.producer} by task attempt"
                    f" {task.task_attempt_id}: its rows there may have been rolled back; the"
                    " micro-batch is not committed there (restart the query to run it again)"
                )


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


def check_replay(
    journal: str,
    txns: BatchTxns,
    decision: Decision,
    current: SinkMark | None,
    record: BatchRows | None,
) -> None:
    """Raise ReplayMismatchError if `decision` takes this run's rows of the micro-batch in
    `journal` for rows an earlier run committed there (ROLL_BACK, ROLL_BACK_ONLY), and the
    journal's `record` says that run committed another number of rows (or no longer says: it
    was pruned past the micro-batch). A record that stops short of the register (`current`),
    or none, was left by a version of this sink that kept none: not checked."""
    if not txns.replay_check or decision not in (Decision.ROLL_BACK, Decision.ROLL_BACK_ONLY):
        return
    if record is None or current is None:
        return
    batch, rows = txns.batch, txns.rows_in(journal)
    recorded = record.rows_of(batch)
    if recorded == rows or (recorded is None and batch > record.upto):
        return
    advice = (
        " Committing it would lose rows or write them twice, so nothing of it is committed."
        " Start the query on a new checkpoint, reading its source from the offsets it should"
        " go on from; or, if the query's output may differ between runs by design (it is not"
        " deterministic), set the sink's option replayCheck to 'none'"
    )
    if recorded is None:
        raise ReplayMismatchError(
            f"micro-batch {batch}: run {current.run} of the query committed micro-batches up to"
            f" {current.batch} in {journal}, which no longer records how many rows micro-batch"
            f" {batch} held (it records {record.since} to {record.upto}): the query re-runs"
            " micro-batches committed long ago (its checkpoint was restored from an old copy)."
            + advice
        )
    raise ReplayMismatchError(
        f"micro-batch {batch}: an earlier run of the query committed {recorded} rows of it in"
        f" {journal}; this run's holds {rows}: the query planned the micro-batch differently"
        " (its checkpoint was restored from an older copy, or its source or query is not"
        " deterministic)." + advice
    )


def next_record(
    journal: str, txns: BatchTxns, current: SinkMark | None, record: BatchRows | None
) -> BatchRows:
    """The journal's record of the query's micro-batches once this one committed there."""
    rows = txns.rows_in(journal)
    if record is None or current is None or record.upto != current.batch:
        return BatchRows.first(txns.batch, rows)
    return record.after(txns.batch, rows)


def _mark_of(registers: pb.LabelSet, register: str) -> SinkMark | None:
    value = gl.value_of(registers, register)
    return SinkMark.parse(value) if value else None


def _record_of(registers: pb.LabelSet, query: str) -> BatchRows | None:
    value = gl.value_of(registers, rows_register_name(query))
    return BatchRows.parse(value) if value else None


def _stale(registers: pb.LabelSet, own: str, now_s: int) -> list[pb.Label]:
    """Registers of other queries that resolved nothing for `stale_register_s`, with their
    records of rows (sink_rows.py)."""
    out = []
    stale_queries = set()
    for label in registers.labels:
        if label.name == own or not label.name.startswith(REGISTER_PREFIX):
            continue
        try:
            mark = SinkMark.parse(label.value)
        except GazetteSinkError:
            continue  # Not one of ours after all: leave it.
        if mark.at_s < now_s - stale_register_s:
            out.append(pb.Label(name=label.name, value=label.value))
            stale_queries.add(label.name.removeprefix(REGISTER_PREFIX))
    # A record goes with its query's register; one whose register is gone (removed by a
    # version of this sink that kept no records) goes too.
    marked = {
        label.name.removeprefix(REGISTER_PREFIX)
        for label in registers.labels
        if label.name.startswith(REGISTER_PREFIX)
    }
    own_query = own.removeprefix(REGISTER_PREFIX)
    out.extend(
        pb.Label(name=label.name, value=label.value)
        for label in registers.labels
        if label.name.startswith(ROWS_PREFIX)
        and (query := label.name.removeprefix(ROWS_PREFIX)) != own_query
        and (query in stale_queries or query not in marked)
    )
    return out


def _update_request(
    journal: str,
    registers: pb.LabelSet,
    register: str,
    mark: SinkMark,
    claims: Sequence[Claim] = (),
    record: tuple[str, BatchRows] | None = None,
) -> pb.AppendRequest:
    """The resolving append: checks that the query's register holds what was read, sets it to
    `mark` (and the register named by `record` to its value, if given), and removes the query's
    `claims` read and other queries' stale registers."""
    current = gl.value_of(registers, register)
    if current:
        check = pb.LabelSelector(
            include=pb.LabelSet(labels=[pb.Label(name=register, value=current)])
        )
    else:
        check = pb.LabelSelector(exclude=pb.LabelSet(labels=[pb.Label(name=register)]))
    union = [pb.Label(name=register, value=mark.encode())]
    stale = [c.label() for c in claims] + _stale(registers, register, mark.at_s)
    if record is not None:
        name, value = record[0], record[1].encode()
        union.append(pb.Label(name=name, value=value))
        stale.extend(
            pb.Label(name=name, value=label.value)
            for label in registers.labels
            if label.name == name and label.value != value
        )
    union.sort(key=lambda x: (x.name, x.value))
    request = pb.AppendRequest(
        journal=journal,
        check_registers=check,
        union_registers=pb.LabelSet(labels=union),
    )
    stale.sort(key=lambda x: (x.name, x.value))
    if stale:
        request.subtract_registers.CopyFrom(pb.LabelSet(labels=stale))
    return request


async def commit_journal(
    client: JournalClient, journal: str, txns: BatchTxns, registers: pb.LabelSet | None = None
) -> Decision:
    """Resolve the micro-batch in `journal` (see the module docstring), starting from its
    `registers` if they were read already; return what was done."""
    register = register_name(txns.query)
    delay = commit_backoff_initial_s
    for attempt in range(1, commit_attempts_max + 1):
        if registers is None or attempt > 1:
            registers = await read_registers(client, journal)
        current, record = _mark_of(registers, register), _record_of(registers, txns.query)
        decision = decide(current, txns)
        if decision is Decision.DONE:
            return decision
        check_replay(journal, txns, decision, current, record)
        claims = txns.claims_to_resolve(registers, int(time.time()))
        if decision is Decision.ROLL_BACK_ONLY:
            request = pb.AppendRequest(journal=journal)
            if claims:
                request.subtract_registers.CopyFrom(
                    gl.label_set((c.name, c.encode()) for c in claims)
                )
            await append(client, request, txns.rollback_content(journal, claims))
            return decision
        mark = SinkMark(txns.batch, txns.run, txns.high_clock, int(time.time()), txns.routing)
        rows: tuple[str, BatchRows] | None = None
        if decision is Decision.COMMIT:
            txns.check_winners_claimed(journal, claims)
            content = txns.commit_content(journal, claims)
            rows = (rows_register_name(txns.query), next_record(journal, txns, current, record))
        else:
            content = txns.rollback_content(journal, claims)
        request = _update_request(journal, registers, register, mark, claims, rows)
        try:
            await append(client, request, content)
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


def check_routing(txns: BatchTxns, marks: dict[str, SinkMark | None]) -> None:
    """Raise GazetteSinkError if another run committed this micro-batch routing its rows
    otherwise (keyColumn over other journals: one was created or deleted between the runs)
    and the micro-batch would be committed in some journal now: its rows there may be rows that
    run committed in another journal. With the same routing each journal's decision is exact
    (a row goes where it went before); with another, only a re-run committed nowhere would be."""
    moved = sorted(
        journal
        for journal, mark in marks.items()
        if mark is not None
        and mark.batch == txns.batch
        and mark.run != txns.run
        and mark.routing != txns.routing
    )
    if not moved:
        return
    committing = sorted(j for j, m in marks.items() if m is None or m.batch < txns.batch)
    if committing:
        raise GazetteSinkError(
            f"micro-batch {txns.batch}: an earlier run of the query committed it in {moved},"
            f" routing rows by key over other journals than this run does (a journal was"
            f" created or deleted since): its rows in {committing} may be rows that run"
            " committed elsewhere, so nothing is committed. Restart the query with its"
            " selector matching the journals it had, so that the micro-batch completes, then"
            " add the journal"
        )


async def commit_batch(client: JournalClient, txns: BatchTxns) -> dict[str, Decision]:
    """Resolve the micro-batch in each of its journals; first, check every journal (routing,
    re-runs), so that a micro-batch refused in one is committed in none."""
    journals = txns.journals
    register = register_name(txns.query)
    found = await asyncio.gather(*(read_registers(client, j) for j in journals))
    marks = {j: _mark_of(r, register) for j, r in zip(journals, found, strict=True)}
    if txns.routing:
        check_routing(txns, marks)
    for journal, registers in zip(journals, found, strict=True):
        current = marks[journal]
        decision = decide(current, txns)
        if decision is not Decision.DONE:
            check_replay(journal, txns, decision, current, _record_of(registers, txns.query))
    decisions = await asyncio.gather(
        *(commit_journal(client, j, txns, r) for j, r in zip(journals, found, strict=True))
    )
    return dict(zip(journals, decisions, strict=True))


async def abort_batch(client: JournalClient, txns: BatchTxns) -> None:
    """Roll back the winners of the micro-batch (Spark aborts it: the query stops). The claims
    of its attempts stay: the next run's first commit rolls them back."""
    await asyncio.gather(
        *(
            append(client, pb.AppendRequest(journal=j), txns.rollback_content(j, ()))
            for j in txns.journals
        )
    )
