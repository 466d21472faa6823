"""Nodes need not wait for the whole route (docs/design/quorum.md, Remaining 2): a journal
that elected before has its members in its term register, and a broker named there starts its
node from that ensemble even while other members are down (`registered_route`), so that a live
majority elects. Endpoints of the members not announced are empty until they are."""

from __future__ import annotations

from broker.keyspace.embedded import EmbeddedStore
from broker.protocol import protocol_pb2 as pb
from broker.quorum.register import TermRecord
from broker.quorum_shell.journals import registered_route
from broker.quorum_shell.term_register import KeyspaceTermRegister
from broker.topology import member_key, new_keyspace

ROOT = "/gazette/cluster"
J = "quorum/partial"
ENSEMBLE = ("zone-a#broker-1", "zone-a#broker-2", "zone-b#broker-3")
REVISION = 11
ENDPOINT = "http://127.0.0.1:9"


async def test_the_registered_ensemble_is_the_route_while_members_are_down() -> None:
    store = EmbeddedStore()
    backend = store.connect()
    spec = pb.BrokerSpec(
        process_spec=pb.ProcessSpec(
            id=pb.ProcessSpec.ID(zone="zone-a", suffix="broker-1"), endpoint=ENDPOINT
        ),
        journal_limit=10,
    )
    await backend.put(member_key(ROOT, "zone-a", "broker-1").encode(), spec.SerializeToString())
    ks = new_keyspace(ROOT)
    await ks.load(backend)
    assert registered_route(ks, ROOT, J, REVISION, "zone-a#broker-2") is None  # never elected

    register = KeyspaceTermRegister(backend, ROOT, J, ENSEMBLE, REVISION)
    first = await register.compare_and_swap(
        0, TermRecord(1, "zone-a#broker-1!coordinator", ENSEMBLE)
    )
    assert first.ok
    await ks.load(backend)
    route = registered_route(ks, ROOT, J, REVISION, "zone-a#broker-2")
    assert route is not None
    assert [f"{m.zone}#{m.suffix}" for m in route.members] == list(ENSEMBLE)
    assert list(route.endpoints) == [ENDPOINT, "", ""] and route.primary == -1
    assert registered_route(ks, ROOT, J, REVISION, "zone-c#broker-9") is None  # not a member
    # The register of an earlier journal of this name says nothing of this one's members.
    assert registered_route(ks, ROOT, J, REVISION + 1, "zone-a#broker-2") is None
    await backend.close()
