"""What the recorded stores' tests share: a broker for their recovery logs, and the base of
their `check_store` factories (a recovery log per shard; each store instance plays into a
directory of its own)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

from broker.client.route_cache import JournalClient
from tests.broker.broker_testkit import Cluster, journal_spec

F = TypeVar("F", bound="RecordedFactory")


class RecordedFactory:
    """The shared part of a recorded store's `check_store` factory."""

    stages_while_committing = True

    def __init__(self, cluster: Cluster, client: JournalClient, root: Path) -> None:
        self.cluster, self.client, self.root = cluster, client, root
        self.logs: dict[str, str] = {}
        self._dirs = itertools.count()

    async def log_of(self, fqn: str) -> str:
        """The shard's recovery log, created on first use."""
        if fqn not in self.logs:
            name = f"recovery/{len(self.logs)}"
            await self.cluster.create(journal_spec(name), self.cluster.brokers)
            self.logs[fqn] = name
        return self.logs[fqn]

    def directory(self) -> Path:
        """A new directory for a store instance to play into."""
        return self.root / f"instance-{next(self._dirs)}"


@contextlib.asynccontextmanager
async def factory_on_a_broker(
    make: Callable[[Cluster, JournalClient, Path], F], root: Path
) -> AsyncIterator[F]:
    """A factory over one in-process broker, closed afterwards."""
    cluster = Cluster()
    broker = await cluster.start_broker("zone-a", "broker-a")
    client = JournalClient(broker.endpoint)
    try:
        yield make(cluster, client, root)
    finally:
        await client.close()
        await cluster.close()
