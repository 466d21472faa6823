"""SIGTERM of a `gazette serve` process under a continuous append load: it hands every journal
off, persists what it holds, and exits promptly with status 0, while not one append fails."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from e2e_workload import (
    FOUR_BROKERS,
    Writers,
    by_journal,
    count_duplicates,
    fragment_files,
    journals_and_victim,
    read_journal,
    requires_etcd,
    stored_prefix,
)

from broker.testing.process_cluster import ProcessCluster

pytestmark = [pytest.mark.etcd, requires_etcd]

# The exiting broker's bound on waiting for the hand-off; it takes well under a second here.
HANDOFF_TIMEOUT_S = 20
# Hand-off, RPC drain (one second of grace) and persisting, with room for loaded cores.
exit_bound_s = 30.0


@pytest.fixture
async def cluster() -> AsyncIterator[ProcessCluster]:
    args = ["--handoff-timeout", str(HANDOFF_TIMEOUT_S)]
    async with ProcessCluster(FOUR_BROKERS, extra_args=args) as c:
        yield c


async def test_sigterm_under_append_load_hands_off_without_a_failed_append(
    cluster: ProcessCluster,
) -> None:
    names = [f"exit/journal-{i}" for i in range(8)]
    # The victim is the primary of the most journals; the appenders' default broker is another.
    victim, held, client = await journals_and_victim(cluster, names)
    writers = Writers(client, names, count=6)
    writers.start()
    await writers.wait_for(150)
    before_exit = len(writers.committed)

    code, elapsed_s = await cluster.terminate(victim, timeout_s=exit_bound_s)
    assert code == 0, victim.log_tail()
    assert elapsed_s < exit_bound_s
    committed_before_exit = by_journal(writers.committed[:before_exit])
    # The load goes on against the remaining brokers.
    await writers.wait_for(len(writers.committed) + 150)
    await writers.stop()

    assert writers.failed == []
    assert cluster.member_gone(victim)() is None  # Its lease was revoked on exit.
    await cluster.wait_until(cluster.journals_ready(names, 3, zones_min=2, exclude=[victim.suffix]))

    committed = by_journal(writers.committed)
    duplicates = await count_duplicates(client, names, committed)
    # A record is there twice only if its append was retried after an ambiguous failure (one
    # cut off by the exiting broker's RPC drain); normally there are none of either.
    assert duplicates <= writers.retries

    # The victim persisted the fragments it held before exiting: the store covers, for every
    # journal it served, all content committed before the SIGTERM.
    for journal in held:
        stored = stored_prefix(fragment_files(cluster.fragments_dir, journal))
        last_end = max((c.end for c in committed_before_exit.get(journal, [])), default=0)
        assert len(stored) >= last_end, journal
        assert stored == (await read_journal(client, journal))[: len(stored)]
