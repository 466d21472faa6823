"""The HTTP gateway's journal listing (`GET /debug/journals`) against real in-process brokers:
a quorum journal shows the same quorum state `gazctl journals list` does (term, leader,
election), an all-replicas journal shows none, and its Gazette-compatible answers (PUT, GET)
carry no quorum field; the selector filters, and a bad one is 400 naming it."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from broker_testkit import Cluster, journal_spec

from broker.cli import gazctl
from broker.client.route_cache import JournalClient
from broker.http_gateway import HttpGateway
from broker.protocol import labels as gl
from broker.protocol.labels import label_set
from broker.server import Broker

wait_s = 20.0
QUORUM = "gwlist/quorum"
PLAIN = "gwlist/plain"


class Gateway:
    def __init__(self, broker: Broker) -> None:
        self.client = JournalClient(broker.endpoint)
        self.gateway = HttpGateway(self.client)
        self.session = aiohttp.ClientSession()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.gateway.port}/{path}"

    async def get(self, path: str) -> tuple[int, bytes]:
        async with self.session.get(self.url(path)) as resp:
            return resp.status, await resp.read()

    async def listed(self, query: str = "") -> dict[str, dict[str, Any]]:
        status, body = await self.get(f"debug/journals{query}")
        assert status == 200, body
        return {j["name"]: j for j in json.loads(body)["journals"]}

    async def close(self) -> None:
        await self.session.close()
        await self.gateway.stop()  # Closes the client.


@pytest.fixture
async def brokers(cluster: Cluster, tmp_path: Path) -> list[Broker]:
    started = [
        await cluster.start_broker(f"zone-{i}", f"broker-{i}", data_dir=str(tmp_path / f"b{i}"))
        for i in range(3)
    ]
    spec = journal_spec(QUORUM, replication=3)
    spec.labels.CopyFrom(label_set([(gl.REPLICATION_MODE, gl.REPLICATION_MODE_QUORUM)]))
    await cluster.create(spec, started)
    await cluster.create(journal_spec(PLAIN, replication=1), started[:1])
    return started


@pytest.fixture
async def gateway(brokers: list[Broker]) -> AsyncIterator[Gateway]:
    gw = Gateway(brokers[0])
    await gw.gateway.start("127.0.0.1", 0)
    try:
        yield gw
    finally:
        await gw.close()


def _led(listed: dict[str, dict[str, Any]]) -> bool:
    """Whether the listing shows the quorum journal led, its route naming the leader as
    primary. The route is read (List) before the quorum state (each member's Status): an
    election between the two reads (a lease missed under load) shows them apart for a moment."""
    state, route = listed[QUORUM]["quorum"], listed[QUORUM]["route"]
    primary = route["members"][route["primary"]] if route["primary"] >= 0 else None
    return state["election"] == "leader" and primary == state["leader"]


async def _until_led(gw: Gateway) -> dict[str, dict[str, Any]]:
    """The listing once the quorum journal has a leader that its route names (polled: its
    members' coordinators elect in the background and offer the test no event)."""
    async with asyncio.timeout(wait_s):
        while True:
            listed = await gw.listed()
            if _led(listed):
                return listed
            await asyncio.sleep(0.05)


async def _gazctl_json(broker: Broker, capsys: pytest.CaptureFixture[str]) -> list[Any]:
    capsys.readouterr()
    args = gazctl.parse_args(["--broker", broker.endpoint, "journals", "list", "--format", "json"])
    assert await gazctl.run(args) == 0
    docs: list[Any] = json.loads(capsys.readouterr().out)
    return docs


async def test_a_quorum_journal_shows_the_quorum_state_gazctl_shows(
    brokers: list[Broker], gateway: Gateway, capsys: pytest.CaptureFixture[str]
) -> None:
    listed = await _until_led(gateway)  # Its route names the leader as primary.
    state = listed[QUORUM]["quorum"]
    names = [f"{b.config.zone}#{b.config.suffix}" for b in brokers]
    assert state["term"] >= 1 and state["leader"] in names
    route = listed[QUORUM]["route"]
    assert sorted(route["members"]) == sorted(names)
    assert listed[QUORUM]["replication"] == 3
    # The same state as gazctl's (one broker's mirror), unless an election came between the
    # two listings: then both are read again (bounded by wait_s).
    async with asyncio.timeout(wait_s):
        while True:
            by_gazctl = {d["name"]: d for d in await _gazctl_json(brokers[0], capsys)}
            if by_gazctl[QUORUM]["quorum"]["term"] == state["term"]:
                break
            listed = await _until_led(gateway)
            state = listed[QUORUM]["quorum"]
    assert by_gazctl[QUORUM]["quorum"] == state
    # An all-replicas journal has no quorum state.
    assert "quorum" not in listed[PLAIN]
    assert "quorum" not in by_gazctl[PLAIN]
    assert listed[PLAIN]["route"] == {"members": [names[0]], "primary": 0}


async def test_an_all_replicas_journals_gateway_answers_carry_no_quorum_state(
    brokers: list[Broker], gateway: Gateway
) -> None:
    async with gateway.session.put(gateway.url(PLAIN), data=io.BytesIO(b"plain\n")) as resp:
        assert resp.status == 200
        answer = await resp.json()
    assert set(answer) == {"status", "journal", "begin", "end", "sha1"}
    status, body = await gateway.get(f"{PLAIN}?offset=0&block=false")
    assert (status, body) == (206, b"plain\n")


async def test_the_selector_filters_and_a_bad_one_is_400(gateway: Gateway) -> None:
    assert set(await gateway.listed()) == {QUORUM, PLAIN}
    assert set(await gateway.listed(f"?selector={gl.REPLICATION_MODE}")) == {QUORUM}
    assert set(await gateway.listed(f"?selector=!{gl.REPLICATION_MODE}")) == {PLAIN}
    for query, names in (("?selector=a%3D%3Db", "selector"), ("?other=1", "other")):
        status, body = await gateway.get(f"debug/journals{query}")
        assert status == 400 and names in body.decode()
