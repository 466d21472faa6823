"""The pulse of a quorum journal's primary (the allocator's slot 0): advertise the route.

An all-replicas pulse is a zero-byte append through the pipeline, which also advertises the
synchronised route in the journal's assignments (the allocator, and readiness checks, wait for
that). A quorum journal has no all-replicas pipeline (its members' spools are written by the
quorum applier alone), so its pulse only advertises the route, in the same compare-and-swap
transaction (`append_rules.update_assignments`).
"""

from __future__ import annotations

from broker.append_rules import update_assignments
from broker.keyspace.backend import Backend, KeySpaceError
from broker.keyspace.keyspace import WatchStoppedError
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.replica import PulseResult
from broker.resolver import ResolveError, Resolver
from broker.topology import route_matches_assignments

log = get_logger(__name__)


async def quorum_pulse(resolver: Resolver, backend: Backend, journal: str) -> PulseResult:
    try:
        res = await resolver.resolve(journal, require_primary=True, may_proxy=False)
    except (ResolveError, TimeoutError, WatchStoppedError) as err:
        log.warning("quorum pulse: not resolved (will retry)", journal=journal, error=str(err))
        return PulseResult(False, None)
    if res.status != pb.OK or not res.is_local:
        return PulseResult(True, res.invalidated)  # Not the primary: nothing to advertise.
    if route_matches_assignments(res.route, res.assignments):
        return PulseResult(True, res.invalidated)
    try:
        await update_assignments(backend, res)
    except KeySpaceError as err:
        log.warning(
            "quorum pulse: route not advertised (will retry)", journal=journal, error=str(err)
        )
        return PulseResult(False, res.invalidated)
    # Advertised (or lost a race with a change): the write invalidates the resolution, and
    # the next pulse checks the result at once.
    return PulseResult(True, res.invalidated)
