"""Helpers of the Spark tests: journals, hand-made message sequences, direct reads.

Messages are appended with UUIDs built by hand (producer, clock, flags), so that a test can lay
out exactly the duplicates, transactions and rollbacks it wants the data source to sort out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf.duration_pb2 import Duration

from broker.client import JournalClient, append, apply_journals, upsert
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message.uuid import Flag, build_uuid, get_flags, new_producer_id
from gazette_consumer.message.uuid import producer_id as as_producer_id
from tests.broker.serve_testkit import gazette_serve

OUTSIDE = Flag.OUTSIDE_TXN
CONTINUE = Flag.CONTINUE_TXN
ACK = Flag.ACK_TXN


REPO = Path(__file__).resolve().parents[2]


def start_job(module: str, args: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """Run `python -m tests.spark_integration.<module> ARGS` (a driver job of its own) in a new
    process group, its output appended to `log`: its JVMs and Python workers are in the group,
    so that a `killpg` leaves nothing of it behind."""
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", f"tests.spark_integration.{module}", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            start_new_session=True,
        )


def run_job(module: str, args: Sequence[str], log: Path, timeout_s: float) -> str:
    """`start_job`, waited for at most `timeout_s`, its whole process group killed afterwards
    whatever happened (nothing of its cluster outlives the test); asserts it exited 0 and
    returns its output."""
    proc = start_job(module, args, log)
    try:
        proc.wait(timeout=timeout_s)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    output = log.read_text()
    assert proc.returncode == 0, output[-6000:]
    return output


# The log of each broker `broker_process` runs, by its address (see `wait_replica_stopped`).
_broker_logs: dict[str, Path] = {}
# How long a broker may take to stop the replica of a journal deleted, and the polling backoff.
replica_stop_timeout_s = 30.0
replica_stop_poll_s_max = 0.2


@contextlib.contextmanager
def broker_process(root: Path, *extra_args: str) -> Iterator[int]:
    """A `gazette serve` process on loopback with its embedded keyspace, data under `root`:
    yields its port once it serves, and stops it afterwards (tests/broker/serve_testkit.py)."""
    with gazette_serve(root, *extra_args) as (port, _proc):
        address = f"127.0.0.1:{port}"
        _broker_logs[address] = root / "broker.log"
        try:
            yield port
        finally:
            del _broker_logs[address]


def wait_replica_stopped(broker: str, journal: str) -> None:
    """Until `broker` (one `broker_process` runs) has stopped its replica of `journal`, deleted.

    A replica lives as long as its assignment, which the allocator removes some time after the
    journal's spec: a journal deleted and created again before that keeps its replica and the
    content it had (as a Gazette broker's does). A test that means the journal to be created
    anew waits for this first. The broker's log is the only place that tells."""
    line = f"stopping local journal replica journal={journal}\n"
    deadline, pause = time.monotonic() + replica_stop_timeout_s, 0.01
    with _broker_logs[broker].open() as log:
        seen = ""  # What was read of the log, from the last complete line on.
        while True:
            seen += log.read()  # Only what the broker wrote since the last look.
            if line in seen:
                return
            seen = seen[seen.rfind("\n") + 1 :]
            assert time.monotonic() < deadline, f"{broker} did not stop its replica of {journal}"
            time.sleep(pause)
            pause = min(pause * 2, replica_stop_poll_s_max)


def unique(prefix: str) -> str:
    """A journal name of its own for one test."""
    return f"{prefix}/{uuid.uuid4().hex[:10]}"


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def create_journals(
    broker: str,
    names: Sequence[str],
    *,
    content_type: str = labels.CONTENT_TYPE_JSON_LINES,
    stores: Sequence[str] = (),
) -> None:
    """Create (or update) `names`; their fragments persist to `stores` (none: not persisted)."""

    async def apply() -> None:
        client = JournalClient(broker)
        try:
            specs = [
                pb.JournalSpec(
                    name=name,
                    replication=1,
                    labels=pb.LabelSet(
                        labels=[
                            pb.Label(name="app", value="spark-test"),
                            pb.Label(name=labels.CONTENT_TYPE, value=content_type),
                            pb.Label(name="test", value=name.split("/")[-1]),
                        ]
                    ),
                    fragment=pb.JournalSpec.Fragment(
                        length=1 << 20,
                        compression_codec=pb.NONE,
                        stores=list(stores),
                        refresh_interval=Duration(seconds=1),
                    ),
                )
                for name in names
            ]
            await apply_journals(client, [upsert(s) for s in specs])
        finally:
            await client.close()

    _run(apply())


@dataclass(frozen=True)
class Msg:
    """A message to append: `producer` (6 bytes), `clock`, `flags`, fields (none for an ACK)."""

    producer: bytes
    clock: int
    flags: Flag
    fields: dict[str, Any] | None = None

    def line(self) -> bytes:
        body = dict(self.fields or {})
        body["UUID"] = str(build_uuid(as_producer_id(self.producer), self.clock, self.flags))
        return json.dumps(body).encode() + b"\n"


def producer() -> bytes:
    return bytes(new_producer_id())


def append_messages(
    broker: str, journal: str, messages: Sequence[Msg], *, together: bool = False
) -> list[tuple[int, int]]:
    """Append each message by itself, or all in one append (`together`: a reader sees all of
    them or none); return the [begin, end) each landed at."""

    async def go() -> list[tuple[int, int]]:
        client = JournalClient(broker)
        spans = []
        try:
            for group in [messages] if together else [[m] for m in messages]:
                lines = [m.line() for m in group]
                request = pb.AppendRequest(journal=journal)
                begin = (await append(client, request, b"".join(lines))).commit.begin
                for line in lines:
                    spans.append((begin, begin + len(line)))
                    begin += len(line)
        finally:
            await client.close()
        return spans

    return list(_run(go()))


def append_texts(
    broker: str, journal: str, texts: Sequence[str], pad: str = "", *, per_append: int = 2000
) -> None:
    """Committed JSON messages {"text": t, "pad": pad} of one producer, `per_append` of them
    (a reader sees all or none) per append."""
    p = producer()
    for lo in range(0, len(texts), per_append):
        batch = range(lo, min(lo + per_append, len(texts)))
        fields = [{"text": texts[i], "pad": pad} if pad else {"text": texts[i]} for i in batch]
        append_messages(
            broker,
            journal,
            [Msg(p, 1000 + i, OUTSIDE, f) for i, f in zip(batch, fields, strict=True)],
            together=True,
        )


def append_raw(broker: str, journal: str, content: bytes) -> None:
    async def go() -> None:
        client = JournalClient(broker)
        try:
            await append(client, pb.AppendRequest(journal=journal), content)
        finally:
            await client.close()

    _run(go())


def read_all(broker: str, journal: str) -> bytes:
    """The journal's whole content, read directly (not through Spark)."""
    from broker.client import RetryReader
    from spark_integration.journal_io import write_head

    async def go() -> bytes:
        client = JournalClient(broker)
        try:
            head = await write_head(client, journal)
            if head == 0:
                return b""
            reader = RetryReader(
                client, pb.ReadRequest(journal=journal, offset=0, end_offset=head, block=True)
            )
            out = b""
            async for chunk in reader:
                out += chunk.content
            return out
        finally:
            await client.close()

    return bytes(_run(go()))


def uuid_flags(content: bytes) -> list[int]:
    """The UUID flags of each JSON line (0 outside a transaction, 1 continue, 2 ACK)."""
    return [get_flags(uuid.UUID(json.loads(line)["UUID"])) for line in content.splitlines()]


def reader(spark: Any, broker: str, **options: str) -> Any:
    r = spark.read.format("gazette").option("broker", broker)
    for k, v in options.items():
        r = r.option(k, v)
    return r


def committed(journal: str, messages: Sequence[tuple[uuid.UUID, Any]]) -> list[Any]:
    """The payloads of the committed messages among `messages` ((UUID, payload) of each of a
    journal's messages, ACKs included, in journal order), in order of delivery: put through a
    Sequencer by its general protocol, apart from the data source's own read path."""
    from gazette_consumer.message.uuid import get_clock, get_producer_id
    from gazette_consumer.sequencer import RING_SIZE_MAX, SeqEnvelope, Sequencer

    envelopes = [
        SeqEnvelope(
            journal,
            index,
            index + 1,
            bytes(get_producer_id(u)),
            get_clock(u),
            get_flags(u),
            payload,
        )
        for index, (u, payload) in enumerate(messages)
    ]
    seq: Sequencer[SeqEnvelope] = Sequencer(min(RING_SIZE_MAX, len(envelopes) + 1))
    out: list[Any] = []
    for env in envelopes:
        seq.queue_uncommitted(env)
        required = seq.replay_required
        if required is not None:
            seq.replay(e for e in envelopes if required.begin <= e.begin < required.end)
        while seq.step():
            dequeued = seq.dequeued
            assert dequeued is not None
            if not dequeued.is_ack:
                out.append(dequeued.message)
    return out


def committed_texts(broker: str, journal: str) -> list[str]:
    """The "text" fields of the journal's committed JSON messages, in order of delivery: the
    whole journal read raw (`committed`)."""
    bodies = [json.loads(line) for line in read_all(broker, journal).splitlines()]
    return [
        str(b.get("text")) for b in committed(journal, [(uuid.UUID(b["UUID"]), b) for b in bodies])
    ]


def write_batch(df: Any, broker: str, journal: str, **options: str) -> None:
    """`df` written to `journal` by the data source in one batch write (mode append)."""
    writer = df.write.format("gazette").mode("append").option("broker", broker)
    writer.option("journal", journal).options(**options).save()


def framed(framing: Any, broker: str, journal: str) -> list[Any]:
    """Every frame of the journal (ACKs included) by `framing` (a consumer framework Framing),
    which must frame all of it: a frame it cannot parse fails the test."""
    from gazette_consumer.message.framing import Frame

    events = framing.unpack(journal, 0, read_all(broker, journal))
    assert all(isinstance(e, Frame) for e in events), events
    return list(events)


class TextSource:
    """A source journal of JSON messages {"text", "n": len(text)} by one producer, each
    outside a transaction, with increasing clocks: what a streaming copy reads."""

    def __init__(self, broker: str, journal: str) -> None:
        from gazette_consumer.message.clock import clock_from_unix_nanos

        self.broker, self.journal = broker, journal
        self._producer = producer()
        self._clock = clock_from_unix_nanos(time.time_ns())

    def add(self, texts: Sequence[str]) -> list[str]:
        """Append `texts` in one append; return them."""
        messages = []
        for text in texts:
            self._clock += 1
            messages.append(
                Msg(self._producer, self._clock, OUTSIDE, {"text": text, "n": len(text)})
            )
        append_messages(self.broker, self.journal, messages, together=True)
        return list(texts)


def start_copy(
    spark: Any,
    broker: str,
    source: str,
    sink: str,
    checkpoint: Path,
    *,
    sink_broker: str = "",
    **options: str,
) -> Any:
    """A streaming query copying the (text, n) rows of `source` to `sink` (on `sink_broker`,
    default `broker`) through the data source (with `options` for the sink), checkpointed at
    `checkpoint`: started."""
    return (
        spark.readStream.format("gazette")
        .option("broker", broker)
        .option("journals", source)
        .schema("text STRING, n LONG")
        .load()
        .writeStream.format("gazette")
        .option("broker", sink_broker or broker)
        .option("journal", sink)
        .options(**options)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


def copy_with_micro_batch_0_twice(
    start: Callable[[], Any], checkpoint: Path, more: Callable[[], None]
) -> None:
    """Run the query `start()` starts until idle; delete Spark's record of micro-batch 0 (as a
    driver that died after the sink's commit leaves it) and start it again, so that micro-batch
    0 runs twice; then `more()` adds input, which the restarted query processes too."""
    query = start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    for record in ("0", ".0.crc"):  # Spark's record of micro-batch 0, and its checksum.
        (checkpoint / "commits" / record).unlink()
    query = start()
    try:
        query.processAllAvailable()  # Micro-batch 0 again: rolled back.
        more()
        query.processAllAvailable()
    finally:
        query.stop()


def micro_batch_texts(reader: Any, start: dict[str, Any]) -> tuple[list[str], Any]:
    """One micro-batch of a `GazetteStreamReader` driven as Spark drives it (latestOffset,
    partitions, read) from `start`: the `text` field of each message read, and the end offset."""
    end = reader.latestOffset(start, None)
    texts: list[str] = []
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            texts += [json.loads(c)["text"] for c in batch.column("content").to_pylist()]
    return texts, end
