"""Fixtures of the client tests: `client`, a JournalClient of one broker started in the test's
`cluster` (a test module may override `cluster`, e.g. to give it fragment stores)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from broker_testkit import Cluster

from broker.client.route_cache import JournalClient


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[JournalClient]:
    broker = await cluster.start_broker("zone-a", "broker-a")
    out = JournalClient(broker.endpoint)
    try:
        yield out
    finally:
        await out.close()
