"""The task side of a write: publish a partition's rows as one uncommitted transaction.

A task publishes every row of its partition as a CONTINUE_TXN message of its producer
(`TaskIdentity.producer`, sink_task.py), numbered from the write's base clock: nothing of it is
visible to read-committed readers yet. Rows arrive as Arrow record batches (Spark's Arrow
writers; `publish_rows` turns rows given directly into batches); each batch is encoded in bulk
(arrow_json.py) and split by journal (routing.py) into framed messages, buffered per journal
and appended a buffer at a time (`publish_buffer_bytes_max`), each append whole or not at all
and retried by `append` when that is safe. The task returns a `PublishedTxn` commit message: per
journal, the framed ACK_TXN that commits its rows (one clock past its last message) and the one
that rolls them back (at the base clock, below all of them). The driver appends the former on
commit, the latter on abort (write.py, sink_commit.py). A task that fails appends its own
rollbacks, best effort; a task that dies leaves a pending span that the driver rolls back
(streaming: the producer is used again) or that no ACK will ever commit (a batch write's
producer is used once).

Streaming tasks fence their appends. Before its first append to a journal, a task reads the
journal's registers, and every append it makes there requires the query's register to still
hold what it read. The driver updates that register when it resolves the micro-batch, so an
attempt that Spark gave up on but that still runs (a speculative copy, an executor it lost
touch with) cannot append once the micro-batch is resolved: its appends fail with
REGISTER_MISMATCH instead of leaving messages that a later ACK of its producer would commit.
An attempt that reads the register only after the micro-batch is resolved (a failed task's
Python worker still draining rows it was handed) finds the micro-batch's mark there and
appends nothing (`check_not_stale`, StaleAttemptError): a fence on that value would hold.
The first append also claims the task's producer in the journal, if nobody holds it, and later
appends require the claim (sink_task.py): two attempts under one producer (a resubmitted
stage's) never both append in a journal; the one refused fails with ProducerClaimedError.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

from broker.client.appender import append, attempts_max_default
from broker.client.list_apply import get_journal
from broker.client.route_cache import JournalClient
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import JournalNotFoundError, RegisterMismatchError
from gazette_consumer.message.json_framing import JSONFraming
from gazette_consumer.message.uuid import Flag, ProducerID, build_uuid
from spark_integration.arrow_json import (
    EncodedLines,
    check_sizes,
    lines_of,
    uuid_suffixes,
)
from spark_integration.csv_width import WidthFence, check_width, first_record_fields, refence
from spark_integration.journal_io import GazetteJournalError, run_with_client
from spark_integration.options import WriteOptions
from spark_integration.raw_json import UUID_FIELD, JSONRow
from spark_integration.routing import RowShape, route
from spark_integration.rows import GazetteRowError
from spark_integration.sink_task import (
    Claim,
    ProducerClaimedError,
    TaskIdentity,
    check_not_stale,
    claims_of,
    register_name,
)
from spark_integration.write_framing import JSON_LINES, WriteFraming, write_content_type

# A journal's framed messages are appended once this many bytes are buffered; all buffers
# together are flushed, largest first, once they hold `publish_buffers_bytes_max`.
publish_buffer_bytes_max: Final = 1 << 20
publish_buffers_bytes_max: Final = 8 << 20
# Appends of a buffer whose CSV width fence the broker refused, the first included: each refusal
# means the journal's width register moved since it was read (csv_width.py).
width_fence_attempts_max: Final = 4
width_fence_backoff_initial_s: Final = 0.02
width_fence_backoff_max_s: Final = 0.5
# Rows given one by one (`publish_rows`) are encoded this many at a time.
row_batch_rows_max: Final = 4096

_log = logging.getLogger(__name__)
_CONTINUE_TXN: Final = int(Flag.CONTINUE_TXN)


@dataclass(frozen=True)
class PublishedTxn(WriterCommitMessage):  # type: ignore[misc]
    """What one task attempt published: its identity, producer (hex) and base clock, the
    number of rows, and per journal the framed ACK that commits them and the one that rolls
    them back."""

    task: TaskIdentity
    producer: str
    base_clock: int
    ack_clock: int  # The clock of the ACKs: one past the last message's.
    rows: int
    acks: dict[str, bytes] = field(default_factory=dict)
    rollbacks: dict[str, bytes] = field(default_factory=dict)
    # How each journal's messages are framed (what the driver's own ACKs must match).
    framings: dict[str, WriteFraming] = field(default_factory=dict)
    # The rows published in each journal (the driver checks re-runs by them: sink_rows.py).
    journal_rows: dict[str, int] = field(default_factory=dict)


def continue_uuid_text(producer: ProducerID, clock: int) -> str:
    """`str(build_uuid(producer, clock, CONTINUE_TXN))`, formatted directly: a task does this
    for every row it publishes, and building the UUID object first costs about as much again."""
    return (
        f"{(clock >> 4) & 0xFFFF_FFFF:08x}-{(clock >> 36) & 0xFFFF:04x}"
        f"-{((clock >> 52) & 0x0FFF) | 0x1000:04x}"
        f"-{((clock & 0xF) << 10) | _CONTINUE_TXN | 0x8000:04x}-{producer.hex()}"
    )


def ack_message(framing: JSONFraming, producer: ProducerID, clock: int) -> bytes:
    """The framed ACK_TXN of `producer` at `clock`."""
    return framing.marshal(JSONRow({UUID_FIELD: str(build_uuid(producer, clock, Flag.ACK_TXN))}))


async def read_registers(
    client: JournalClient, journal: str, attempts_max: int = attempts_max_default
) -> pb.LabelSet:
    """The journal's registers, as an append of nothing returns them (tried up to
    `attempts_max` times)."""
    response = await append(
        client, pb.AppendRequest(journal=journal), b"", attempts_max=attempts_max
    )
    return response.registers


def fenced_request(journal: str, register: str, registers: pb.LabelSet) -> pb.AppendRequest:
    """An append to `journal` that requires `register` to hold what `registers` (read before)
    says it holds: the value it had, or none."""
    value = gl.value_of(registers, register)
    if value:
        check = pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name=register, value=value)]))
    else:
        check = pb.LabelSelector(exclude=pb.LabelSet(labels=[pb.Label(name=register)]))
    return pb.AppendRequest(journal=journal, check_registers=check)


class _Buffers:
    """Framed messages per journal, appended a buffer at a time: fenced on the query's register
    and the producer's claim when streaming (sink_task.py), and on the width register in CSV
    journals (csv_width.py)."""

    def __init__(
        self,
        client: JournalClient,
        task: TaskIdentity,
        producer: ProducerID,
        base_clock: int,
        append_attempts: int = attempts_max_default,
    ) -> None:
        self._client = client
        self._append_attempts = append_attempts  # Option appendAttempts: tries per append.
        self._task = task
        self._base_clock = base_clock
        self._register = register_name(task.query) if task.streaming else ""
        # The claim of the task's producer, made with its first append in each journal.
        self._claim = (
            Claim.of(task, producer, base_clock, int(time.time())) if task.streaming else None
        )
        # The request of each journal appended to so far (with its fences).
        self.requests: dict[str, pb.AppendRequest] = {}
        # Per journal, the stale claims of the task's partition its first append takes over
        # (Claim.stale_for): rolled back at their base clocks and removed with that append.
        self.takeovers: dict[str, list[Claim]] = {}
        # How each journal's messages are framed (the takeovers' rollbacks are framed alike).
        self.framings: Mapping[str, WriteFraming] = {}
        # Journals an append of the task landed in (and, streaming, where it holds the claim).
        self.appended: set[str] = set()
        # The query's register in each journal, as read before the first append (streaming).
        self.query_values: dict[str, str] = {}
        # The width fence of each CSV journal, and the columns its records carry.
        self.widths: dict[str, WidthFence] = {}
        self.columns: dict[str, list[str]] = {}
        self.pending: dict[str, bytearray] = {}
        self.size = 0

    def add(self, journal: str, frame: bytes | memoryview) -> int:
        """Buffer `frame`; return the journal's buffered bytes."""
        buffer = self.pending.get(journal)
        if buffer is None:
            buffer = self.pending[journal] = bytearray()
        buffer += frame
        self.size += len(frame)
        return len(buffer)

    async def add_lines(self, journal: str, lines: EncodedLines) -> None:
        """Buffer framed messages, appending whenever a buffer or all of them are full."""
        for piece in lines.pieces(publish_buffer_bytes_max):
            if self.add(journal, piece) >= publish_buffer_bytes_max:
                await self.flush(journal)
            elif self.size >= publish_buffers_bytes_max:
                await self.flush_largest()

    async def request(self, journal: str) -> pb.AppendRequest:
        request = self.requests.get(journal)
        if request is None:
            if self._register:
                registers = await read_registers(self._client, journal, self._append_attempts)
                value = gl.value_of(registers, self._register)
                check_not_stale(self._task, journal, value, self._base_clock)
                self.query_values[journal] = value
                self._take_over(journal, registers)
            request = self.requests[journal] = self._fenced(journal)
        return request

    def _fenced(self, journal: str, *, rollback: bool = False) -> pb.AppendRequest:
        """The request of an append to `journal`: requiring the query's register to hold what
        the task read there (streaming) and the width register what it took (CSV); the first
        requiring the producer's claim to be nobody's and making it the task's, later ones
        requiring it to be the task's. A `rollback` (a failed task's) requires the claim to be
        the task's, and releases it (a rollback after another attempt claimed the producer
        would roll back that attempt's messages)."""
        include: list[pb.Label] = []
        exclude: list[pb.Label] = []
        union: list[pb.Label] = []
        request = pb.AppendRequest(journal=journal)
        if self._register:
            value = self.query_values[journal]
            if value:
                include.append(pb.Label(name=self._register, value=value))
            else:
                exclude.append(pb.Label(name=self._register))
        if self._claim is not None:
            if rollback or journal in self.appended:
                include.append(self._claim.label())
                if rollback:
                    request.subtract_registers.CopyFrom(_label_set([self._claim.label()]))
            else:
                # The first append: takes its producer's claim if nobody holds it (or a stale
                # claim holds it), and takes the stale claims of its partition over.
                stale = [claim.label() for claim in self.takeovers.get(journal, ())]
                include += stale
                if all(label.name != self._claim.name for label in stale):
                    exclude.append(pb.Label(name=self._claim.name))
                union.append(self._claim.label())
                if stale:
                    request.subtract_registers.CopyFrom(_label_set(stale))
        width = self.widths.get(journal)
        if width is not None:
            include += width.include()
            exclude += width.exclude()
            union.append(width.union())
        if union:
            request.union_registers.CopyFrom(_label_set(union))
        if include or exclude:
            check = pb.LabelSelector()
            if include:
                check.include.CopyFrom(_label_set(include))
            if exclude:
                check.exclude.CopyFrom(_label_set(exclude))
            request.check_registers.CopyFrom(check)
        return request

    async def flush(self, journal: str) -> None:
        buffer = self.pending.pop(journal, None)
        if not buffer:
            return
        self.size -= len(buffer)
        content = bytes(buffer)
        delay = width_fence_backoff_initial_s
        for attempt in range(1, width_fence_attempts_max + 1):
            try:
                request = await self.request(journal)
                await append(
                    self._client,
                    request,
                    self._takeover_rollbacks(journal) + content,
                    attempts_max=self._append_attempts,
                )
                self._landed(journal)
                return
            except RegisterMismatchError:
                # Nothing was appended by this try. The query's register moved (raise, as
                # before), the claim is another's (raise) or ours (an earlier try of this
                # first append landed), or the width register moved (look again).
                if await self._after_mismatch(journal):
                    self._landed(journal)
                    return
                if attempt == width_fence_attempts_max:
                    raise
            if attempt > 1:  # A register that keeps moving: the journal re-created meanwhile?
                await asyncio.sleep(delay)
                delay = min(width_fence_backoff_max_s, delay * 2)

    def _take_over(self, journal: str, registers: pb.LabelSet) -> None:
        """The stale claims of the task's partition in `journal` (Claim.stale_for), which its
        first append there takes over (streaming; a claim would otherwise stay until a commit,
        and claims of crashed runs pile up to the bound on a journal's registers)."""
        if self._claim is not None and journal not in self.appended:
            task = self._task
            self.takeovers[journal] = [c for c in claims_of(registers) if c.stale_for(task)]

    def _takeover_rollbacks(self, journal: str) -> bytes:
        """Before the first append's messages: an ACK at its base clock of each claim taken
        over, which rolls back what that attempt left pending (its messages are numbered past
        it) and commits nothing."""
        takeovers = self.takeovers.get(journal)
        if not takeovers or journal in self.appended:
            return b""
        framing = self.framings.get(journal, JSON_LINES)
        return b"".join(framing.ack(claim.producer, claim.base_clock) for claim in takeovers)

    def _landed(self, journal: str) -> None:
        if journal not in self.appended:
            self.appended.add(journal)
            if self._claim is not None:  # Later appends require the claim, and add nothing.
                self.requests[journal] = self._fenced(journal)

    async def _after_mismatch(self, journal: str) -> bool:
        """After a refused append: True if the append landed after all (its claim is there);
        False if it may be tried again (the width fence taken again: csv_width.refence raises
        GazetteCSVWidthError if the width is another). Raises RegisterMismatchError if the
        query's register moved, ProducerClaimedError if another attempt holds the claim."""
        registers = await read_registers(self._client, journal, self._append_attempts)
        if self._register and gl.value_of(registers, self._register) != self.query_values.get(
            journal
        ):
            raise RegisterMismatchError(
                f"{journal}: the register {self._register} moved: micro-batch"
                f" {self._task.batch} was resolved there while this attempt ran"
            )
        if self._claim is not None:
            held = gl.value_of(registers, self._claim.name)
            ours = self._claim.encode()
            if held == ours and journal not in self.appended:
                return True
            holder = Claim.parse(self._claim.name, held) if held else None
            taken_over = (
                holder is not None and holder.stale_for(self._task) and journal not in self.appended
            )
            if held != ours and (held or journal in self.appended) and not taken_over:
                raise ProducerClaimedError(
                    f"{journal}: the producer {self._claim.producer.hex()} of partition"
                    f" {self._task.partition} is claimed there by another attempt ({held or 'none'};"
                    f" this is task attempt {self._task.task_attempt_id}, attempt"
                    f" {self._task.attempt} of micro-batch {self._task.batch}): Spark resubmitted"
                    " the stage. This attempt appends nothing more and fails; Spark's retry"
                    " publishes under a producer of its own"
                )
        if journal not in self.appended:
            self._take_over(journal, registers)  # The stale claims as they are now.
            self.requests[journal] = self._fenced(journal)
        if journal not in self.widths:
            return False
        fence = self.widths[journal]
        self.widths[journal] = await refence(
            self._client, journal, registers, fence.fields, self.columns[journal]
        )
        self.requests[journal] = self._fenced(journal)
        return False

    async def flush_largest(self) -> None:
        await self.flush(max(self.pending, key=lambda j: len(self.pending[j])))

    async def flush_all(self) -> None:
        for journal in list(self.pending):
            await self.flush(journal)


def _label_set(labels: list[pb.Label]) -> pb.LabelSet:
    """`labels` as a LabelSet, in the (name, value) order a LabelSet must have."""
    return gl.label_set((label.name, label.value) for label in labels)


async def _roll_back(
    client: JournalClient, buffers: _Buffers, rollback: bytes | Mapping[str, bytes]
) -> None:
    """A failed task's rollbacks, in the journals it tried to append to, fenced as its appends
    were and on its claim (`_Buffers._fenced`): once the micro-batch is resolved (a
    late failure of an attempt Spark gave up on), the driver has rolled it back, and a rollback
    now could reach a later micro-batch's messages of the same producer; once another attempt
    holds the producer's claim, it could reach that attempt's."""
    for journal in buffers.requests:
        try:
            content = rollback if isinstance(rollback, bytes) else rollback[journal]
            await append(
                client,
                buffers._fenced(journal, rollback=True),
                content,
                attempts_max=buffers._append_attempts,
            )
        except RegisterMismatchError:
            pass  # Resolved by the driver already, or not ours to roll back.
        except Exception as err:  # The task's own error is what matters.
            _log.warning("gazette: rollback of a failed write task in %s failed: %s", journal, err)


def encode_routes(
    shape: RowShape,
    batch: pa.RecordBatch,
    routes: Sequence[tuple[str, pa.Array | None]],
    producer: ProducerID,
    first_clock: int,
    framings: Mapping[str, WriteFraming],
) -> list[tuple[str, EncodedLines]]:
    """The framed CONTINUE_TXN messages of `batch`'s rows, numbered from `first_clock` in row
    order, per journal they go to (`routes`: routing.route's), framed as each journal's
    framing says."""
    suffixes = uuid_suffixes(producer, first_clock, batch.num_rows, Flag.CONTINUE_TXN)
    out = []
    for journal, rows in routes:
        part, part_suffixes = (
            (batch, suffixes) if rows is None else (batch.take(rows), suffixes.take(rows))
        )
        encoded = lines_of(framings[journal].lines(shape, part, part_suffixes))
        check_sizes(encoded, framings[journal].content_type)
        out.append((journal, encoded))
    return out


def encode_batch(
    shape: RowShape,
    batch: pa.RecordBatch,
    producer: ProducerID,
    first_clock: int,
    content_types: Mapping[str, str] | None = None,
) -> list[tuple[str, EncodedLines]]:
    """`encode_routes` of `batch` routed by `shape`, in journals of `content_types` (by
    default the shape's, and JSON lines for the others)."""
    routes = route(shape, batch)
    known = dict(shape.content_types) | dict(content_types or {})
    framings = {
        journal: WriteFraming.of(
            journal,
            known.get(journal, gl.CONTENT_TYPE_JSON_LINES),
            shape,
            batch.schema.names,
        )
        for journal, _ in routes
    }
    return encode_routes(shape, batch, routes, producer, first_clock, framings)


async def journal_content_type(
    client: JournalClient, journal: str, wanted: str, protobuf_class: str = ""
) -> str:
    """The content-type a task writes `journal` with (write_framing.write_content_type), from
    the journal's spec: for journals the driver could not know (a `journal` column's)."""
    try:
        spec = await get_journal(client, journal)
    except JournalNotFoundError:
        raise GazetteJournalError(f"journal {journal!r} does not exist") from None
    label = gl.value_of(spec.labels, gl.CONTENT_TYPE)
    return write_content_type(journal, label, wanted, protobuf_class)


async def task_framing(
    client: JournalClient, shape: RowShape, journal: str, batch: pa.RecordBatch
) -> tuple[WriteFraming, int]:
    """The framing of `journal`, met by a task in `batch` before it appends anything there: by
    the content-type the driver resolved or listed, else the journal's spec; the width of a CSV
    journal's records checked against the rows' (csv_width.py) unless the driver did. With it,
    the width found (of a CSV journal; 0 if empty, or not CSV): what appends are fenced on."""
    known = dict(shape.content_types)
    labels = dict(shape.journal_labels)
    if journal in known:
        content_type = known[journal]
    elif journal in labels:
        content_type = write_content_type(
            journal, labels[journal], shape.content_type, shape.protobuf_class
        )
    else:  # Not listed by the driver (created since), or more journals than it lists.
        content_type = await journal_content_type(
            client, journal, shape.content_type, shape.protobuf_class
        )
    framing = WriteFraming.of(journal, content_type, shape, batch.schema.names, batch.schema)
    existing = 0
    if framing.content_type == gl.CONTENT_TYPE_CSV:
        checked = dict(shape.csv_fields)
        existing = (
            checked[journal] if journal in checked else await first_record_fields(client, journal)
        )
        columns = shape.message_columns(batch.schema.names)
        check_width(journal, existing, framing.csv_fields, columns)
    return framing, existing


def batches_of_rows(rows: Iterable[Any]) -> Iterator[pa.RecordBatch]:
    """Rows (pyspark Rows, or dicts) as record batches of `row_batch_rows_max`, their column
    types inferred from the values."""
    iterator = iter(rows)
    while chunk := list(itertools.islice(iterator, row_batch_rows_max)):
        dicts = [r.asDict(recursive=True) if hasattr(r, "asDict") else dict(r) for r in chunk]
        try:
            yield pa.RecordBatch.from_pylist(dicts)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise GazetteRowError(f"rows whose columns do not have one type each: {err}") from None


async def publish_batches(
    client: JournalClient,
    shape: RowShape,
    batches: Iterable[pa.RecordBatch],
    base_clock: int,
    task: TaskIdentity,
    *,
    append_attempts: int = attempts_max_default,
) -> PublishedTxn:
    """Publish the rows of `batches` as task `task`'s transaction, numbered from
    `base_clock`, each append (a failed task's rollbacks too) tried up to `append_attempts`
    times (option appendAttempts)."""
    producer = task.producer()
    buffers = _Buffers(client, task, producer, base_clock, append_attempts)
    # The framing of each journal published to, in first-publish order.
    framings: dict[str, WriteFraming] = {}
    buffers.framings = framings
    clock = base_clock
    journal_rows: dict[str, int] = {}
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            routes = route(shape, batch)
            for journal, _ in routes:
                if journal not in framings:
                    framing, existing = await task_framing(client, shape, journal, batch)
                    framings[journal] = framing
                    if framing.content_type == gl.CONTENT_TYPE_CSV:
                        buffers.widths[journal] = WidthFence(existing, framing.csv_fields)
                        buffers.columns[journal] = shape.message_columns(batch.schema.names)
            for journal, lines in encode_routes(
                shape, batch, routes, producer, clock + 1, framings
            ):
                journal_rows[journal] = journal_rows.get(journal, 0) + len(lines)
                await buffers.add_lines(journal, lines)
            clock += batch.num_rows
        await buffers.flush_all()
    except BaseException:
        await _roll_back(
            client, buffers, {j: f.ack(producer, base_clock) for j, f in framings.items()}
        )
        raise
    return PublishedTxn(
        task=task,
        producer=producer.hex(),
        base_clock=base_clock,
        ack_clock=clock + 1,
        rows=clock - base_clock,
        acks={j: f.ack(producer, clock + 1) for j, f in framings.items()},
        rollbacks={j: f.ack(producer, base_clock) for j, f in framings.items()},
        framings=framings,
        journal_rows=journal_rows,
    )


async def publish_rows(
    client: JournalClient, shape: RowShape, rows: Iterable[Any], base_clock: int, task: TaskIdentity
) -> PublishedTxn:
    """`publish_batches` of rows given one by one (pyspark Rows or dicts)."""
    return await publish_batches(client, shape, batches_of_rows(rows), base_clock, task)


def _as_batches(items: Iterator[Any]) -> Iterator[pa.RecordBatch]:
    """What Spark passes a writer: Arrow record batches (an Arrow writer's), or rows."""
    first = next(items, None)
    if first is None:
        return iter(())
    rest = itertools.chain([first], items)
    return rest if isinstance(first, pa.RecordBatch) else batches_of_rows(rest)


def publish_partition(
    opts: WriteOptions, shape: RowShape, items: Iterator[Any], base_clock: int, *, streaming: bool
) -> PublishedTxn:
    """Publish a task's rows, Arrow record batches or rows (see the module docstring);
    `streaming` for a stream writer's task (a batch writer's tasks publish under producers of
    their own, even in a streaming query's foreachBatch)."""
    task = TaskIdentity.current(streaming)
    batches = _as_batches(items)
    return run_with_client(
        opts.broker,
        lambda client: publish_batches(
            client, shape, batches, base_clock, task, append_attempts=opts.append_attempts
        ),
    )
