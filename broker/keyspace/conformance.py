"""A conformance kit for keyspace backends: ``await check_keyspace(harness)``.

Any Backend (the embedded one, the etcd one, a fault-injecting wrapper) must pass every check
here, so that code tested against one behaves the same against another. Each check is a plain
async function named after what it checks; ``check_keyspace`` runs them all, in order, and a
failure raises ConformanceError (an AssertionError) naming the check and what differed.

The harness (``KeySpaceHarness``) gives the backend under test, a way to break its connection,
and further clients of the same store. Checks write under a fresh random prefix, so they may run
against a store holding other data, but they assume no other writer is active meanwhile (some
assert that a request did *not* advance the revision), and ``check_compaction`` compacts the
store's history. Keys are cleaned up on a best-effort basis only.

The checks live by area: keys and transactions (conformance_kv.py), leases
(conformance_leases.py), watches and compaction (conformance_watch.py), the KeySpace mirror
(conformance_mirror.py); the harness and shared assertions in conformance_kit.py.
"""

from __future__ import annotations

from broker.keyspace.conformance_kit import Check as Check
from broker.keyspace.conformance_kit import ConformanceError as ConformanceError
from broker.keyspace.conformance_kit import EmbeddedHarness as EmbeddedHarness
from broker.keyspace.conformance_kit import KeySpaceHarness as KeySpaceHarness
from broker.keyspace.conformance_kv import check_kv_basics as check_kv_basics
from broker.keyspace.conformance_kv import check_prefix_ranges as check_prefix_ranges
from broker.keyspace.conformance_kv import check_range_since as check_range_since
from broker.keyspace.conformance_kv import check_txn_branches as check_txn_branches
from broker.keyspace.conformance_kv import check_txn_compares as check_txn_compares
from broker.keyspace.conformance_kv import check_txn_race as check_txn_race
from broker.keyspace.conformance_leases import check_lease_expiry as check_lease_expiry
from broker.keyspace.conformance_leases import check_leases as check_leases
from broker.keyspace.conformance_mirror import (
    check_mirror_decode_failures as check_mirror_decode_failures,
)
from broker.keyspace.conformance_mirror import check_mirror_observers as check_mirror_observers
from broker.keyspace.conformance_mirror import (
    check_mirror_reload_after_compaction as check_mirror_reload_after_compaction,
)
from broker.keyspace.conformance_mirror import check_mirror_resume as check_mirror_resume
from broker.keyspace.conformance_watch import check_compaction as check_compaction
from broker.keyspace.conformance_watch import check_watch_replay as check_watch_replay

CHECKS: tuple[Check, ...] = (
    check_kv_basics,
    check_prefix_ranges,
    check_range_since,
    check_txn_compares,
    check_txn_branches,
    check_txn_race,
    check_leases,
    check_lease_expiry,
    check_watch_replay,
    check_mirror_resume,
    check_mirror_decode_failures,
    check_mirror_observers,
    # Compacting checks last: they discard the history of everything before them.
    check_compaction,
    check_mirror_reload_after_compaction,
)


async def check_keyspace(harness: KeySpaceHarness) -> None:
    """Run every check in CHECKS against the harness's backend; the first failure raises,
    noting which check failed."""
    for check in CHECKS:
        try:
            await check(harness)
        except Exception as exc:
            exc.add_note(f"keyspace conformance check: {check.__name__}")
            raise
