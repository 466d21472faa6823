"""`gazctl journals list` shows a quorum journal's state, through the CLI against real
in-process brokers (each with its data directory): the term and leader (the route's primary is
the leader), in the table and in YAML/JSON; after two of three members lose their disk (the
leader's among them) the election is blocked, and gazctl says so, naming the lost members. A
journal that is not a quorum journal shows no quorum state, and a malformed Status request is
refused naming what was wrong."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from broker_testkit import Cluster, journal_spec

from broker.cli import gazctl
from broker.protocol import protocol_pb2 as pb
from broker.quorum_shell.status import STATUS_METHOD
from broker.server import Broker
from tests.broker.quorum.quorum_brokers_testkit import (
    broker_name,
    create_quorum_journal,
    start_broker,
    start_brokers,
)

wait_s = 20.0
J = "state/quorum"
PLAIN = "state/plain"


async def _gazctl(broker: Broker, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    args = gazctl.parse_args(["--broker", broker.endpoint, "journals", "list", *argv])
    assert await gazctl.run(args) == 0
    return capsys.readouterr().out


async def _listed(broker: Broker, capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, Any]]:
    docs = yaml.safe_load_all(await _gazctl(broker, capsys, "--format", "yaml"))
    return {d["name"]: d for d in docs}


def _routed_to_leader(doc: dict[str, Any]) -> bool:
    """The listed route names the quorum state's leader as its primary. The two come from
    different sources: the state from the members' coordinators (Status), the route from the
    listing broker's mirror of the term register (List), which learns an appointment one etcd
    watch later; until then it reports the assigned route."""
    return f"{doc['quorum']['leader']}*" in doc["route"]


async def _until_listed(
    broker: Broker, capsys: pytest.CaptureFixture[str], election: str
) -> dict[str, dict[str, Any]]:
    """The listing of J once gazctl shows `election` and, with a leader, routes to it (polled:
    the state comes from brokers' coordinators, which offer the test no event; each poll is a
    whole gazctl run)."""
    async with asyncio.timeout(wait_s):
        while True:
            listed = await _listed(broker, capsys)
            doc = listed[J]
            if doc["quorum"]["election"] == election and (
                election != "leader" or _routed_to_leader(doc)
            ):
                return listed
            await asyncio.sleep(0.2)


async def test_gazctl_shows_term_leader_and_a_blocked_election(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    brokers = await start_brokers(cluster, tmp_path, 3)
    await create_quorum_journal(cluster, J, brokers)
    await cluster.create(journal_spec(PLAIN, replication=1), brokers[:1])

    listed = await _until_listed(brokers[0], capsys, "leader")
    state = listed[J]["quorum"]
    leader = next(b for b in brokers if broker_name(b) == state["leader"])
    assert state["term"] >= 1
    assert listed[J]["route"].count("*") == 1
    assert "quorum" not in listed[PLAIN]
    assert (await cluster.append(leader, J, [b"kept"])).status == pb.OK
    table = await _gazctl(brokers[0], capsys)
    header, *rows = table.splitlines()
    assert header.split()[-1] == "QUORUM"
    row = next(r for r in rows if r.startswith(J))
    assert row.endswith(f"term {state['term']} leader {state['leader']}")
    as_json = json.loads(await _gazctl(brokers[0], capsys, "--format", "json"))
    assert next(d for d in as_json if d["name"] == J)["quorum"] == state

    # The leader and another member lose their disks: the survivor cannot elect alone, and
    # the two back from lost disks may not vote (they may lack acknowledged appends).
    survivor = next(b for b in brokers if b is not leader)
    lost = [b for b in brokers if b is not survivor]
    for b in lost:
        await cluster.stop_broker(b)
        shutil.rmtree(tmp_path / f"b{brokers.index(b)}")
    restarted = {
        brokers.index(b): await start_broker(cluster, tmp_path, brokers.index(b)) for b in lost
    }
    route = [restarted.get(i, survivor) for i in range(3)]
    await cluster.assign(J, route)

    listed = await _until_listed(survivor, capsys, "blocked")
    state = listed[J]["quorum"]
    names = sorted(broker_name(b) for b in lost)
    assert state["leader"] == ""
    assert state["blocked"]["lost"] == names and state["blocked"]["voters_needed"] == 2
    assert state["lost"] == names
    assert "unanswered" not in state
    row = next(r for r in (await _gazctl(survivor, capsys)).splitlines() if r.startswith(J))
    assert f"ELECTION BLOCKED lost {','.join(names)}"[:40] in row


async def test_gazctl_shows_a_kept_member_outside_the_route(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A member the term register names whose broker no longer has the journal assigned runs
    a node kept for the register (quorum_shell/journals.py): outside the route, it is asked
    too (its endpoint from the listing broker's mirror of its BrokerSpec) and listed as kept,
    with the register's ensemble."""

    brokers = await start_brokers(cluster, tmp_path, 3)
    await create_quorum_journal(cluster, J, brokers)
    state = (await _until_listed(brokers[0], capsys, "leader"))[J]["quorum"]
    x = next(b for b in brokers if broker_name(b) != state["leader"])
    # X's replica taken away, no successor yet: the register still names X, whose node stays.
    await cluster.assign(J, [b for b in brokers if b is not x])
    async with asyncio.timeout(wait_s):
        while J not in x.quorum.kept:  # noqa: ASYNC110 -- the observer offers no event.
            await asyncio.sleep(0.02)
    via = next(b for b in brokers if b is not x)
    listed = await _listed(via, capsys)
    state = listed[J]["quorum"]
    assert broker_name(x) not in listed[J]["route"]
    assert state["ensemble"] == sorted(broker_name(b) for b in brokers)
    assert state["kept"] == [broker_name(x)]
    assert "unanswered" not in state
    row = next(r for r in (await _gazctl(via, capsys)).splitlines() if r.startswith(J))
    assert row.endswith(f"kept {broker_name(x)}"), row
    as_json = json.loads(await _gazctl(via, capsys, "--format", "json"))
    assert next(d for d in as_json if d["name"] == J)["quorum"] == state


async def test_a_malformed_status_request_is_refused(cluster: Cluster) -> None:
    broker = await cluster.start_broker("zone-0", "broker-0")
    call = broker.channels.get(broker.endpoint).unary_unary(
        STATUS_METHOD, request_serializer=None, response_deserializer=None
    )
    for raw, detail in (
        (b"not json", "not JSON"),
        (b'{"format": 1, "journals": ["a//b"]}', "journals[0]"),
        (b'{"format": 1, "journals": [' + b",".join([b'"j"'] * 513) + b"]}", "at most 512"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(raw)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert detail in (err.value.details() or "")
