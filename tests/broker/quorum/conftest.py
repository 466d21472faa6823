"""Fixtures shared by the quorum tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.keyspace.embedded import EmbeddedStore
from tests.broker.quorum.quorum_nodes_testkit import Cluster


@pytest.fixture
async def quorum_nodes(tmp_path: Path) -> AsyncIterator[Cluster]:
    """Quorum nodes of one journal on loopback gRPC (quorum_nodes_testkit), none started yet;
    every live one is killed after the test."""
    c = Cluster(tmp_path, EmbeddedStore())
    try:
        yield c
    finally:
        await c.close()
