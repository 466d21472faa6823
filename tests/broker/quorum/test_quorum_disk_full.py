"""A quorum member whose disk fills up (three in-process brokers, each data directory on a
real tmpfs of its own, filled to the last byte by another file): the member stops (it must
not acknowledge what it cannot persist: `LogWriteError`, naming the cause), and the journal
stays writable at the majority, as quorum mode promises for a minority of replicas down,
whether the full member was the leader or a follower. No acknowledged append is lost or
written twice. Once there is room again, its broker starts the member again from its log
(after a back-off, without a restart), the member catches up, and it is again one of a
majority: with another member stopped, the journal still commits. A member whose disk is
full before its log is even started reports itself failed in Status, and joins once there is
room."""

from __future__ import annotations

from pathlib import Path

import pytest
from broker_testkit import ROOT, Cluster

from broker.cli.quorum_state import state_of, state_text
from broker.metrics import value_of
from broker.protocol import protocol_pb2 as pb
from broker.quorum_shell.node import LogWriteError
from broker.quorum_shell.status import (
    decode_response,
    encode_response,
    journal_status,
)
from broker.server import Broker
from tests.broker.quorum.quorum_brokers_testkit import (
    append_until_ok,
    broker_name,
    create_quorum_journal,
    member_status,
    start_brokers,
    term_record,
    until,
)
from tests.small_disk import fill, small_disks

J = "quorum/full"
DISK_BYTES = 4 << 20
RECORD_BYTES = 8 << 10
# Bound of each append's retries while the journal elects (one or a few 1-s timeouts).
wait_s = 30.0


async def _append(cluster: Cluster, via: Broker, data: bytes) -> pb.AppendResponse:
    return await append_until_ok(cluster, via, J, data, wait_s)


async def _append_all(cluster: Cluster, via: Broker, tag: str, n: int, acked: bytearray) -> None:
    """`n` appends, each landing exactly at the acknowledged end (each larger than a page:
    a file's last page has room for small ones even on a full disk)."""
    for i in range(n):
        data = f"{tag}{i:03d} ".encode() + tag.encode() * RECORD_BYTES + b"\n"
        resp = await _append(cluster, via, data)
        assert (resp.commit.begin, resp.commit.end) == (len(acked), len(acked) + len(data))
        acked += data


async def _committed(b: Broker, acked: bytes) -> None:
    def holds() -> bool:
        node = b.quorum.nodes.get(J)  # None until a restarted broker's node starts
        return node is not None and node.commit_offset >= len(acked)

    await until(f"{broker_name(b)} knows the commit", holds)
    assert b.quorum.nodes[J].read_committed(0) == acked


@pytest.mark.parametrize("full", ["leader", "follower"])
async def test_a_member_whose_disk_fills_stops_and_the_majority_commits(
    cluster: Cluster, tmp_path: Path, full: str
) -> None:
    with small_disks([tmp_path / f"b{i}" for i in range(3)], DISK_BYTES):
        brokers = await start_brokers(cluster, tmp_path, 3)
        await create_quorum_journal(cluster, J, brokers)
        acked = bytearray()
        await _append_all(cluster, brokers[0], "a", 5, acked)
        await until(
            "the register settled with a leader",
            lambda: (r := term_record(brokers[0], J)) is not None and bool(r.leader) and r.settled,
        )
        record = term_record(brokers[0], J)
        assert record is not None
        names = [broker_name(b) for b in brokers]
        i_full = names.index(record.leader)
        if full == "follower":
            i_full = (i_full + 1) % 3
        others = [b for i, b in enumerate(brokers) if i != i_full]

        filler = fill(tmp_path / f"b{i_full}")
        await _append_all(cluster, others[0], "b", 20, acked)
        failed = brokers[i_full].quorum.nodes[J]
        assert isinstance(failed.failure, LogWriteError), failed.failure
        assert "No space left on device" in str(failed.failure)
        # What an operator sees (gazctl journals list, the gateway): the member, and why.
        status = journal_status(brokers[i_full].ks, ROOT, J, failed)
        [answered] = decode_response(encode_response([status])).values()
        cell = state_text(state_of(None, [answered], []))
        assert f"FAILED {names[i_full]}: LogWriteError: " in cell
        assert "No space left on device" in cell
        for b in others:
            await _committed(b, acked)

        # Room again: the broker starts the member again from its log, by itself; the
        # leader catches it up, and it counts again: with another member stopped, the
        # journal still commits.
        filler.unlink()
        await _committed(brokers[i_full], acked)
        assert brokers[i_full].quorum.nodes[J] is not failed
        assert brokers[i_full].quorum.restarts[J] >= 1
        assert value_of("gazette_quorum_node_restarts_total", {"journal": J}) >= 1
        await cluster.stop_broker(others[0])
        await _append_all(cluster, brokers[i_full], "c", 5, acked)
        await _committed(others[1], acked)
        await _committed(brokers[i_full], acked)


async def test_a_member_whose_log_cannot_be_opened_for_want_of_room_says_so_and_joins_later(
    cluster: Cluster, tmp_path: Path
) -> None:
    # The disk is full before the journal is created: the member's log file cannot even be
    # started (its header is written at once). The journal commits at the other two; the
    # member reports itself failed, saying why, where an operator looks (Status, as gazctl
    # asks it); once there is room, its broker opens the log by itself, the member joins, is
    # caught up, and counts in a majority again.
    with small_disks([tmp_path / f"b{i}" for i in range(3)], DISK_BYTES):
        brokers = await start_brokers(cluster, tmp_path, 3)
        full, others = brokers[2], brokers[:2]
        filler = fill(tmp_path / "b2")
        await create_quorum_journal(cluster, J, brokers)
        acked = bytearray()
        await _append_all(cluster, others[0], "a", 5, acked)
        await until("the full member's log was refused", lambda: J in full.quorum.errors)
        assert J not in full.quorum.nodes
        answered = await member_status(full, J, wait_s)
        cell = state_text(state_of(None, [answered], []))
        assert f"FAILED {broker_name(full)}: log not opened: OSError: " in cell, cell
        assert "No space left on device" in cell, cell
        for b in others:
            await _committed(b, acked)

        filler.unlink()
        await _committed(full, acked)
        assert J not in full.quorum.errors
        assert full.quorum.restarts[J] >= 1
        answered = await member_status(full, J, wait_s)
        assert (answered.member, answered.failed) == (broker_name(full), "")  # whole again
        await cluster.stop_broker(others[0])
        await _append_all(cluster, full, "b", 5, acked)
        await _committed(others[1], acked)
        await _committed(full, acked)
