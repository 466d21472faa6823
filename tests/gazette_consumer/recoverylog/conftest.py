"""A real in-process broker (R=1, loopback gRPC) and a client, for recovery-log tests."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from broker.client.route_cache import JournalClient
from broker.server import Broker
from tests.broker.broker_testkit import Cluster, journal_spec

_names = itertools.count()


@dataclass
class LogEnv:
    cluster: Cluster
    broker: Broker
    client: JournalClient

    async def new_log(self) -> str:
        name = f"recovery/logs/log-{next(_names)}"
        await self.cluster.create(journal_spec(name), [self.broker])
        return name


@pytest.fixture
async def env() -> AsyncIterator[LogEnv]:
    cluster = Cluster()
    broker = await cluster.start_broker("zone-a", "broker-a")
    client = JournalClient(broker.endpoint)
    try:
        yield LogEnv(cluster, broker, client)
    finally:
        await client.close()
        await cluster.close()
