"""A quorum member that lost its disk, on real broker processes over real etcd (issue #16,
docs/design/quorum.md "Built (lost disks)"): it must not vote until a leader caught it up.

R = 3. `lagging` is killed, so appends commit on the leader and `lost` alone; then `lost` is
killed and its --data-dir deleted (its disk is gone), and the leader is killed (-9). `lagging`
and `lost` come back first: a live majority of the registered ensemble, their nodes start
without the leader (Remaining 2). Counted as a voter, `lost`'s empty log and `lagging`'s short
one would elect `lagging` and drop the appends only `lost` and the leader held. Marked lost,
`lost` does not vote: the term register names no leader, elections failing term after term.
Once the leader is back, every acknowledged append is served by every member, read back in
full, and `lost` is a voter again (its mark gone).
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator

import pytest
from e2e_workload import requires_etcd
from quorum_e2e_kit import Journal, quorum_cluster

from broker.quorum_shell.member_dir import MARK_FILE_NAME
from broker.quorum_shell.term_record import QuorumTerm
from broker.testing.process_cluster import ProcessCluster
from broker.topology import quorum_term_key

pytestmark = [pytest.mark.etcd, requires_etcd]

JOURNAL = "quorum/lost-disk"
# Terms claimed while the leader is down, before the test is satisfied none elected.
failed_elections_min = 2


@pytest.fixture
async def cluster() -> AsyncIterator[ProcessCluster]:
    async with quorum_cluster(JOURNAL) as c:
        yield c


def _register(cluster: ProcessCluster) -> QuorumTerm:
    entry = cluster.ks.get(quorum_term_key(cluster.root, JOURNAL).encode())
    assert entry is not None and isinstance(entry.decoded, QuorumTerm)
    return entry.decoded


async def test_a_member_that_lost_its_disk_does_not_vote(cluster: ProcessCluster) -> None:
    journal = Journal(cluster, JOURNAL)
    await journal.append_round("all-up")
    leader = journal.leader
    assert leader is not None
    lagging, lost = journal.others(leader)
    await cluster.kill(lagging)
    await journal.append_round("two-up")  # held by the leader and `lost` only
    await cluster.kill(lost)
    shutil.rmtree(lost.data_dir)  # its disk is gone
    await cluster.kill(leader)
    term_before = _register(cluster).record.term  # the register still names the leader
    await cluster.start_broker(lagging)
    await cluster.start_broker(lost)

    def elections_failed() -> str | None:
        record = _register(cluster).record
        if record.term > term_before and record.leader:
            return None  # elected: the assertion below says whom
        if record.term < term_before + failed_elections_min:
            return f"term {record.term}: fewer than {failed_elections_min} failed elections"
        return None

    await cluster.wait_until(elections_failed)
    record = _register(cluster).record
    assert not record.leader, f"elected {record.leader} in term {record.term} without the leader"

    await cluster.start_broker(leader)
    await journal.append_round("after", attempts_max=1)
    await journal.check_every_member()
    mark = lost.data_dir / "quorum" / JOURNAL / MARK_FILE_NAME
    assert not mark.exists(), "the lost member serves everything but is still marked lost"
