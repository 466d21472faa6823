"""The HTTP gateway's journal listing, ``GET /debug/journals[?selector=<label selector>]``.

Gazette's gateway lists no journals; this one does, as JSON, so that an operator without gazctl
sees what `gazctl journals list -o json` shows, quorum state included:

    {"journals": [{"name": "a/journal", "replication": 3,
                   "route": {"members": ["zone-a#b1", ...], "primary": 0},
                   "mod_revision": 12,
                   "quorum": {"term": 2, "leader": "zone-a#b1",
                              "ensemble": ["zone-a#b1", ...], "election": "leader"}}, ...]}

``quorum`` is present for quorum journals only (broker/quorum_states.py: the term register's
term, leader and ensemble as the broker mirrors it, with ``previous`` while a change is not
settled; "electing"; or "blocked" with the lost members, as the members' coordinators report
it; members whose node runs only for the register, their journal not assigned to their broker,
under ``kept``; members that did not answer under ``unanswered``). An
all-replicas journal's entry has no such field, and the gateway's Gazette-compatible answers
(GET, HEAD, PUT of a journal) are unchanged for every journal.
"""

from __future__ import annotations

from typing import Any

from broker.client.list_apply import list_journals
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.quorum_states import quorum_states
from broker.topology import format_id

LISTING_PATH = "/debug/journals"


async def journal_listing(client: JournalClient, selector: pb.LabelSelector) -> dict[str, Any]:
    """The JSON document of the journals matching `selector` (see the module docstring).
    Raises what listing raises (grpc.aio.AioRpcError, GazetteError), or StatusDecodeError if
    the broker's quorum Status answer is malformed."""
    listing = await list_journals(client, selector)
    quorum = await quorum_states(client.channels, client.default_endpoint(), listing.journals)
    journals: list[dict[str, Any]] = []
    for j in listing.journals:
        entry: dict[str, Any] = {
            "name": j.spec.name,
            "replication": j.spec.replication,
            "route": {
                "members": [format_id(m) for m in j.route.members],
                "primary": j.route.primary,
            },
            "mod_revision": j.mod_revision,
        }
        state = quorum.get(j.spec.name)
        if state is not None:
            entry["quorum"] = state
        journals.append(entry)
    return {"journals": journals}
