"""Batch reads straight from the fragment store: every persisted row with the broker killed, and
a corrupt fragment file ends the read with GazetteDataLossError (or is skipped, with
failOnDataLoss=false), never served."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.client import JournalClient, apply_journals, upsert
from broker.fragment.naming import parse_content_name
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from tests.broker.serve_testkit import gazette_serve
from tests.spark_integration.spark_testkit import OUTSIDE, Msg, append_messages, producer, unique

pytestmark = pytest.mark.spark

# How long the broker may take to persist the fragments it closed, and the polling backoff.
persist_timeout_s = 20.0
persist_poll_s_max = 0.5


def _create(broker: str, journal: str) -> None:
    async def go() -> None:
        client = JournalClient(broker)
        try:
            spec = pb.JournalSpec(
                name=journal,
                replication=1,
                labels=pb.LabelSet(
                    labels=[
                        pb.Label(name=labels.CONTENT_TYPE, value=labels.CONTENT_TYPE_JSON_LINES)
                    ]
                ),
                fragment=pb.JournalSpec.Fragment(
                    length=2048,  # Small: the journal rolls into many fragments.
                    compression_codec=pb.NONE,
                    stores=["file:///frag/"],
                    refresh_interval=Duration(seconds=1),
                ),
            )
            await apply_journals(client, [upsert(spec)])
        finally:
            await client.close()

    asyncio.run(go())


def _persisted(root: Path, journal: str) -> list[tuple[int, int, Path]]:
    """(begin, end, file) of the journal's fragment files in the store, by begin."""
    folder = root / "frag" / journal
    if not folder.is_dir():
        return []
    out = []
    for f in folder.iterdir():
        try:
            begin, end, _sha1, _codec = parse_content_name(f.name)
        except Exception:  # A temporary file being written: not a fragment yet.
            continue
        out.append((begin, end, f))
    return sorted(out)


def _contiguous_end(files: list[tuple[int, int, Path]]) -> int:
    end = 0
    for begin, e, _ in files:
        if begin > end:
            break
        end = max(end, e)
    return end


@pytest.fixture
def stopped_store(tmp_path: Path) -> Iterator[tuple[Path, str, list[str], list[tuple[int, int]]]]:
    """A journal of 200 messages appended through a broker process that is then killed -9 once
    it has persisted fragments covering at least half of them."""
    journal = unique("spark/store")
    p = producer()
    messages = [Msg(p, 1000 + i, OUTSIDE, {"text": f"m{i}", "pad": "x" * 100}) for i in range(200)]
    (tmp_path / "frag").mkdir()  # The store's directory: the broker never creates it.
    with gazette_serve(tmp_path) as (port, proc):
        broker = f"127.0.0.1:{port}"
        _create(broker, journal)
        spans = append_messages(broker, journal, messages)
        deadline, wait = time.monotonic() + persist_timeout_s, 0.05
        while _contiguous_end(_persisted(tmp_path, journal)) < spans[100][1]:
            assert time.monotonic() < deadline, "the broker persisted no fragments"
            time.sleep(wait)  # Polling the store's directory: no event exists for it.
            wait = min(wait * 2, persist_poll_s_max)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    texts = [m.fields["text"] for m in messages if m.fields]
    yield tmp_path, journal, texts, spans


def _read(spark, root: Path, journal: str, **options: str):  # type: ignore[no-untyped-def]
    r = spark.read.format("gazette").option("store", f"file://{root}/frag/")
    r = r.option("journals", journal)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_read_with_the_broker_killed_returns_every_persisted_row(spark, stopped_store) -> None:  # type: ignore[no-untyped-def]
    root, journal, texts, spans = stopped_store
    end = _contiguous_end(_persisted(root, journal))
    expected = [t for t, (_, e) in zip(texts, spans, strict=True) if e <= end]
    assert len(expected) > 100

    rows = _read(spark, root, journal).orderBy("offset").collect()

    assert [json.loads(r.content)["text"] for r in rows] == expected


def test_a_corrupt_fragment_is_a_data_loss_error_or_skipped(spark, stopped_store) -> None:  # type: ignore[no-untyped-def]
    root, journal, texts, spans = stopped_store
    files = _persisted(root, journal)
    begin, end, victim = files[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01  # Same length, another SHA1.
    victim.write_bytes(bytes(data))

    with pytest.raises(Exception, match="GazetteDataLossError"):
        _read(spark, root, journal).collect()

    lenient = _read(spark, root, journal, failOnDataLoss="false").orderBy("offset").collect()
    got = [json.loads(r.content)["text"] for r in lenient]
    persisted_end = _contiguous_end(files)
    expected = [
        t
        for t, (b, e) in zip(texts, spans, strict=True)
        if e <= persisted_end and not (b < end and e > begin)
    ]
    assert got == expected  # Nothing of the corrupt fragment, everything else.
