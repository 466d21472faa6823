"""Fixtures shared by the broker tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from broker_testkit import Cluster


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    """An in-process cluster on the embedded keyspace (brokers are added by each test)."""
    c = Cluster()
    try:
        yield c
    finally:
        await c.close()
