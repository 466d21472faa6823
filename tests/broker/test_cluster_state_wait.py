"""broker/testing/cluster_state.py's `wait_until`: a condition that reads more than the mirror
is re-checked without a new revision, rather than at the wait's timeout."""

from __future__ import annotations

import asyncio
import time

from broker.keyspace.embedded import EmbeddedStore
from broker.keyspace.keyspace import KeySpace
from broker.testing import cluster_state
from broker.testing.cluster_state import wait_until

timeout_s = 20.0


async def test_a_condition_on_test_state_holds_without_a_new_revision() -> None:
    store = EmbeddedStore()
    backend = store.connect()
    ks: KeySpace[bytes] = KeySpace("/cluster", lambda kv: kv.value)
    revision = (await backend.put(b"/cluster/a", b"1")).revision
    watching = asyncio.create_task(ks.watch(backend))
    done = asyncio.Event()
    try:
        await ks.wait_for_revision(revision, timeout_s)
        # Set while the wait is under way; the keyspace stays quiet.
        asyncio.get_running_loop().call_later(0.2, done.set)
        started = time.monotonic()
        took = await wait_until(ks, lambda: None if done.is_set() else "not yet", timeout_s)
        # Re-checked within recheck_s_max of the change, not at the timeout.
        assert took < cluster_state.recheck_s_max + 0.2 + 2.0 < timeout_s / 2
        assert time.monotonic() - started >= 0.2
        assert ks.header.revision == revision  # No revision helped it.
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await backend.close()
        await store.close()
