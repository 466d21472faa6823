"""A broker's graceful exit: hand its journals off to other brokers before stopping.

The exiting broker re-puts its BrokerSpec under its lease with ``journal_limit`` 0 and
``exiting`` set (a Go allocator reads the former, ours either). The allocator then moves every
journal off it without letting one drop below its consistent replicas: it adds a replacement
first, the journal's primary (maybe the exiting broker) synchronises it and advertises the new
route, and only then is the exiting broker's assignment removed (with a promotion in the same
transaction if it was the primary). Appends meanwhile wait while the route has a surplus
replica, then go (or are proxied) to the new primary. ``Broker.hand_off`` (broker/server.py)
runs this between start() and stop().
"""

from __future__ import annotations

import asyncio

from broker.allocator import journal_replication
from broker.keyspace.backend import Backend, NoSpaceError
from broker.keyspace.keyspace import KeySpace
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.topology import Decoded, Member, local_journals, lookup_item, members_prefix

log = get_logger(__name__)

# How long a broker asked to exit waits for the allocator to move its journals elsewhere before
# it stops anyway (its journals then fail over once its lease is revoked).
handoff_wait_s_default = 60.0


async def hand_off(
    backend: Backend,
    ks: KeySpace[Decoded],
    root: str,
    spec: pb.BrokerSpec,
    member_key: bytes,
    lease_id: int,
    *,
    broker: str,
    timeout_s: float = handoff_wait_s_default,
) -> bool:
    """Announce that the broker of ``spec`` is exiting, then wait until it serves no journal.

    Returns True once no assignment names it, or as soon as every journal it still serves is one
    the allocator can never take off it (``cannot_hand_off``: the whole cluster is stopping, or
    it is too small to lose a broker). Returns False if ``timeout_s`` passes first. ``broker``
    names the broker in logs.
    """
    broker_id = spec.process_spec.id
    exiting = pb.BrokerSpec()
    exiting.CopyFrom(spec)
    exiting.journal_limit = 0
    exiting.exiting = True
    try:
        # The announcement too is bounded by the hand-off's timeout: a hung etcd would
        # otherwise hold it for a request timeout before the stop could begin.
        async with asyncio.timeout(timeout_s):
            header = await backend.put(member_key, exiting.SerializeToString(), lease=lease_id)
            log.info("broker exiting: handing off its journals", broker=broker)
            revision = header.revision
            while True:
                await ks.wait_for_revision(revision, timeout_s)
                held = local_journals(ks, root, broker_id)
                if not held:
                    log.info("broker exiting: every journal handed off", broker=broker)
                    return True
                if all(cannot_hand_off(ks, root, broker_id, journal) for journal in held):
                    log.warning(
                        "broker exiting: no broker can take its remaining journals",
                        broker=broker,
                        journals=len(held),
                    )
                    return True
                revision = ks.header.revision + 1
    except NoSpaceError as err:
        # etcd out of space refuses the announcement: the allocator could not move the
        # journals anyway. The broker stops without handing them off (its lease's expiry
        # releases them), as after a hand-off that ran out of time.
        log.error("broker exiting: hand-off not announced", broker=broker, error=str(err))
        return False
    except TimeoutError:
        log.warning(
            "broker exiting: journals not handed off in time",
            broker=broker,
            journals=len(local_journals(ks, root, broker_id)),
            timeout_s=timeout_s,
        )
        return False


def cannot_hand_off(
    ks: KeySpace[Decoded], root: str, broker_id: pb.ProcessSpec.ID, journal: str
) -> bool:
    """Whether fewer brokers other than ``broker_id`` accept journals than ``journal``'s
    replication (removing ``broker_id`` would leave it short of consistent replicas)."""
    item = lookup_item(ks, root, journal)
    replication = journal_replication(item) if item is not None else 0
    accepting = 0
    for entry in ks.search(members_prefix(root)):
        m = entry.decoded
        if (
            isinstance(m, Member)
            and (m.zone, m.suffix) != (broker_id.zone, broker_id.suffix)
            and m.spec.journal_limit > 0
            and not m.spec.exiting
        ):
            accepting += 1
    return accepting < replication
