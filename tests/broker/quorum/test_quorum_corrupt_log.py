"""A quorum member whose log file is damaged (three in-process brokers with data directories;
one broker's log file of the journal gets a bad header while it is stopped): the restarted
broker refuses the file (LogFileCorruptError, changing nothing of it), starts no node for the
journal, and says so where an operator looks (Status, as gazctl asks it); the journal commits
at the other two. The journal deleted and created again under the same name is another
journal: the damaged file of the earlier one must not keep its member out (the earlier files
are moved aside, whole, and the member takes part in the new journal)."""

from __future__ import annotations

from pathlib import Path

from broker_testkit import ROOT, Cluster

from broker.cli.quorum_state import state_of, state_text
from broker.quorum_shell.log_file import log_path
from broker.quorum_shell.member_dir import read_journal_revision, retired_dir
from broker.server import Broker
from broker.topology import item_key
from tests.broker.quorum.quorum_brokers_testkit import (
    append_until_ok,
    broker_name,
    create_quorum_journal,
    member_status,
    start_broker,
    start_brokers,
    until,
)

J = "quorum/damaged"
# Bound of each append's retries and each wait while the journal elects.
wait_s = 30.0


async def _append_all(cluster: Cluster, via: Broker, tag: str, n: int, acked: bytearray) -> None:
    """`n` appends through `via`, each landing exactly at the acknowledged end."""
    for i in range(n):
        data = f"{tag}{i:03d}\n".encode()
        resp = await append_until_ok(cluster, via, J, data, wait_s)
        assert (resp.commit.begin, resp.commit.end) == (len(acked), len(acked) + len(data))
        acked += data


async def _committed(b: Broker, acked: bytes) -> None:
    def holds() -> bool:
        node = b.quorum.nodes.get(J)
        return node is not None and node.commit_offset >= len(acked)

    await until(f"{broker_name(b)} knows the commit", holds, wait_s)
    assert b.quorum.nodes[J].read_committed(0) == acked


async def test_a_damaged_member_log_is_refused_reported_and_left_behind_by_a_new_journal(
    cluster: Cluster, tmp_path: Path
) -> None:
    brokers = await start_brokers(cluster, tmp_path, 3)
    await create_quorum_journal(cluster, J, brokers)
    acked = bytearray()
    await _append_all(cluster, brokers[0], "a", 5, acked)
    await _committed(brokers[2], acked)

    # Broker 2's log file is damaged while it is stopped: a bad header.
    await cluster.stop_broker(brokers[2])
    data_dir = tmp_path / "b2"
    path = log_path(str(data_dir), J)
    damaged = b"NOTALOG!" + path.read_bytes()[8:]
    path.write_bytes(damaged)
    damaged_revision = read_journal_revision(path.parent)
    b2 = await start_broker(cluster, tmp_path, 2)
    others = brokers[:2]

    await until("the damaged log was refused", lambda: J in b2.quorum.errors, wait_s)
    assert J not in b2.quorum.nodes
    cell = state_text(state_of(None, [await member_status(b2, J, wait_s)], []))
    assert f"FAILED {broker_name(b2)}: log not opened: LogFileCorruptError: " in cell, cell
    assert path.read_bytes() == damaged  # refused, not repaired or cut
    await _append_all(cluster, others[0], "b", 3, acked)
    for b in others:
        await _committed(b, acked)

    # Deleted and created again under the same name: another journal, whose member on
    # broker 2 starts fresh and takes part (with another member stopped, it commits).
    header, deleted = await cluster.admin.delete(item_key(ROOT, J).encode())
    assert deleted == 1
    await cluster.sync(header.revision)
    await create_quorum_journal(cluster, J, [b2, *others])
    fresh = bytearray()
    await _append_all(cluster, others[0], "c", 3, fresh)  # the first lands at offset 0
    await _committed(b2, fresh)
    assert J not in b2.quorum.errors
    answered = await member_status(b2, J, wait_s)
    assert (answered.member, answered.failed) == (broker_name(b2), "")
    assert damaged_revision is not None
    aside = retired_dir(str(data_dir), J, damaged_revision)
    assert (aside / "log").read_bytes() == damaged  # kept aside, whole, for an operator
    await cluster.stop_broker(others[0])
    await _append_all(cluster, b2, "d", 3, fresh)
    await _committed(b2, fresh)
    await _committed(others[1], fresh)
