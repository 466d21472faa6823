"""Prometheus metrics recorded by the broker's code paths, read from the process registry (as
differences: every broker of the process adds to the same series)."""

from __future__ import annotations

from pathlib import Path

import pytest
from broker_testkit import Cluster, journal_spec, wait_until

from broker.allocator import MemberId, broker_is_consistent, serve
from broker.client.reader import Reader
from broker.client.route_cache import JournalClient
from broker.fragment.stores.registry import new_registry
from broker.metrics import record_append, value_of
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import OffsetNotYetAvailableError

J = "metrics/journal"


def snapshot() -> dict[str, float]:
    return {
        "ok": value_of("gazette_appends_total", {"status": "OK"}),
        "wrong_offset": value_of("gazette_appends_total", {"status": "WRONG_APPEND_OFFSET"}),
        "append_bytes": value_of("gazette_append_bytes_total"),
        "commits": value_of("gazette_pipeline_commits_total"),
        "syncs": value_of("gazette_pipeline_syncs_total"),
        "reads": value_of("gazette_reads_total"),
        "read_bytes": value_of("gazette_read_bytes_total"),
        "persisted": value_of("gazette_fragments_persisted_total"),
        "persisted_bytes": value_of("gazette_store_persisted_bytes_total"),
        "rounds": value_of("gazette_allocator_converge_total"),
    }


def delta(before: dict[str, float]) -> dict[str, float]:
    after = snapshot()
    return {key: after[key] - before[key] for key in before}


async def test_appends_commits_syncs_and_reads_are_counted(cluster: Cluster) -> None:
    b = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    await cluster.create(journal_spec(J), [b])
    before = snapshot()
    assert (await cluster.append(b, J, [b"hello"])).status == pb.OK
    assert (await cluster.append(b, J, [b"wor", b"ld!!"])).status == pb.OK
    refused = await cluster.append(b, J, [b"x"], offset=999)
    assert refused.status == pb.WRONG_APPEND_OFFSET

    client = JournalClient(b.endpoint)
    try:
        reader = Reader(client, pb.ReadRequest(journal=J, offset=0, block=False))
        content = b""
        with pytest.raises(OffsetNotYetAvailableError):
            while chunk := await reader.read():
                content += chunk
        assert content == b"helloworld!!"
    finally:
        await client.close()

    d = delta(before)
    assert d["ok"] == 2 and d["wrong_offset"] == 1
    assert d["append_bytes"] == 12
    assert d["commits"] == 2  # The refused append never reached the pipeline.
    assert d["syncs"] >= 1  # The journal's first pipeline synchronised with its peers.
    assert d["reads"] == 1 and d["read_bytes"] == 12


async def test_persisted_fragments_are_counted(cluster: Cluster, tmp_path: Path) -> None:
    cluster.stores = new_registry(file_root=tmp_path)
    (tmp_path / "frags").mkdir()
    b = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    await cluster.create(journal_spec(J, length=1024, stores=["file:///frags/"]), [b])
    before = snapshot()
    for _ in range(4):
        assert (await cluster.append(b, J, [b"x" * 600])).status == pb.OK
    # [0, 600) and [600, 1800) are complete and go to the store in the background.
    await wait_until(lambda: delta(before)["persisted"] >= 2)
    assert delta(before)["persisted_bytes"] >= 1800


async def test_allocator_rounds_are_counted(cluster: Cluster) -> None:
    b = await cluster.start_broker("zone-a", "broker-a")
    await cluster.put_spec(journal_spec(J))
    before = snapshot()
    await serve(
        b.backend,
        b.ks,
        MemberId("zone-a", "broker-a"),
        is_consistent=broker_is_consistent,
        rounds_max=1,
    )
    assert delta(before)["rounds"] == 1


def test_record_append_labels_by_status_name() -> None:
    before = value_of("gazette_appends_total", {"status": "JOURNAL_NOT_FOUND"})
    record_append(pb.JOURNAL_NOT_FOUND)
    assert value_of("gazette_appends_total", {"status": "JOURNAL_NOT_FOUND"}) == before + 1
