"""A quorum journal (R=3, three `gazette serve` processes) while etcd is out of space (a real
etcd with a 4 MiB quota, filled until its NOSPACE alarm; see test_e2e_etcd_out_of_space.py).

Its leader needs no etcd write to commit: appends go on. A new leader does (the term register
is a compare-and-swap in etcd: that is what fences the old one), so with the leader killed the
journal takes no append until etcd has room: the client's append fails (bounded attempts), and
`gazctl journals list` says why the election does not finish (each electing member's term
register error: etcd out of space). Once the operator makes room, a survivor is elected and
the journal takes appends again at the end of everything acknowledged: nothing lost, no offset
written twice, and the error is gone from the listing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from e2e_workload import gazctl, requires_etcd
from etcd_space_kit import QUOTA_ARGS, fill, make_room, requires_etcdctl
from quorum_e2e_kit import Journal, quorum_cluster

from broker.client.appender import append
from broker.keyspace.etcd import EtcdBackend
from broker.protocol import protocol_pb2 as pb
from broker.testing.process_cluster import BrokerProcess

pytestmark = [pytest.mark.etcd, requires_etcd, requires_etcdctl]

JOURNAL = "quorum/nospace"
# The refused append's attempts: a few, each waiting for the dead leader's connection.
refused_attempts_max = 3
# Bound on the wait for a survivor to report its refused election.
wait_s = 30.0


def _quorum_state(via: BrokerProcess) -> dict[str, Any]:
    listed = gazctl(
        "--broker", via.endpoint.removeprefix("http://"), "journals", "list", "--format", "json"
    )
    assert listed.returncode == 0, listed.stderr
    [journal] = [j for j in json.loads(listed.stdout) if j["name"] == JOURNAL]
    state: dict[str, Any] = journal["quorum"]
    return state


async def _until_state(
    via: BrokerProcess, holds: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The journal's quorum state as `via` lists it, once `holds` is true of it (bounded by
    wait_s): another process's election offers no event to await, so it is polled."""
    async with asyncio.timeout(wait_s):
        while not holds(state := _quorum_state(via)):  # noqa: ASYNC110
            await asyncio.sleep(0.2)
    return state


async def test_a_quorum_journal_waits_for_room_in_etcd_to_elect_and_says_so() -> None:
    async with quorum_cluster(JOURNAL, etcd_args=QUOTA_ARGS) as cluster:
        journal = Journal(cluster, JOURNAL)
        await journal.append_round("before")
        leader = journal.leader
        assert leader is not None
        survivors = journal.others(leader)
        admin = EtcdBackend([cluster.etcd.endpoint])
        try:
            await fill(admin)
            await journal.append_round("full")  # The leader commits without writing etcd.

            await cluster.kill(leader)  # kill -9: its successor must claim a term in etcd.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await append(
                    cluster.client(survivors[0]),
                    pb.AppendRequest(journal=JOURNAL),
                    b"never acknowledged\n",
                    attempts_max=refused_attempts_max,
                    backoff_cap_s=0.1,
                )
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
            state = await _until_state(survivors[0], lambda s: "register_errors" in s)
            errors = state["register_errors"]
            assert set(errors) <= {f"{b.zone}#{b.suffix}" for b in survivors}, state
            assert all("etcd is out of space" in why for why in errors.values()), errors
            listed = gazctl(
                "--broker", survivors[0].endpoint.removeprefix("http://"), "journals", "list"
            )
            assert "TERM REGISTER" in listed.stdout, listed  # (the table cuts the why short)

            await make_room(cluster, admin)
        finally:
            await admin.close()

        journal.leader = None
        await journal.append_round("after")  # At the end of everything acknowledged.
        new_leader = journal.leader
        assert new_leader is not None and new_leader in survivors
        await journal.check_every_member(survivors)
        # The error goes as each member's next register request succeeds (a survivor that
        # lost the election retries its claim within the coordinator's backoff).
        state = await _until_state(new_leader, lambda s: "register_errors" not in s)
        assert state["election"] == "leader", state
