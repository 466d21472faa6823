"""The append machine, one handler transition at a time, against real brokers.

Pulses are off, so that the only thing driving each journal is the machine under test; every
test drives its handlers by hand and asserts the next state and the exact status or error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import replace

import pytest
from broker_testkit import ROOT, Cluster, journal_spec, local_content, replica_of

from broker.append_fsm import (
    AppendFSM,
    ClientAbortedError,
    ExpectedEOFError,
    FSMStateError,
    IndexNotReadyError,
    RegisterUpdateWithEmptyAppendError,
    State,
    UnexpectedEOFError,
)
from broker.fragment.stores.base import FragmentReader, FragmentStore, ListedObject, StoreURL
from broker.fragment.stores.registry import new_registry
from broker.keyspace.embedded import BackendClosedError
from broker.pipeline import PeerError
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.server import Broker
from broker.topology import assignment_of, journal_assignments, routes_equivalent

J = "fsm/journal"
OWNER_X = label_set([("owner", "x")])


async def two_brokers(cluster: Cluster, replication: int = 2) -> tuple[Broker, Broker]:
    a = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    b = await cluster.start_broker("zone-b", "broker-b", pulse_enabled=False)
    await cluster.create(journal_spec(J, replication=replication), [a, b])
    return a, b


def fsm_of(broker: Broker, **fields: object) -> AppendFSM:
    return AppendFSM(broker.append_env, pb.AppendRequest(journal=J, **fields))  # type: ignore[arg-type]


async def run_to(fsm: AppendFSM, state: State) -> None:
    assert await fsm.run_to(state), (fsm.state, fsm.status, fsm.err)


async def finish(fsm: AppendFSM, chunks: Sequence[bytes] = ()) -> None:
    for chunk in chunks:
        await fsm.on_stream_content(pb.AppendRequest(content=chunk), None)
    await fsm.on_stream_content(pb.AppendRequest(), None)
    await fsm.on_stream_content(None, None)
    await fsm.on_read_acknowledgements()
    fsm.return_pipeline()


# --- RESOLVE ----------------------------------------------------------------------------------


async def test_resolve_to_acquire_pipeline(cluster: Cluster) -> None:
    a, _ = await two_brokers(cluster)
    fsm = fsm_of(a)
    await fsm.on_resolve()
    assert fsm.state is State.ACQUIRE_PIPELINE
    assert fsm.resolved is not None and fsm.resolved.is_local


async def test_resolve_of_unknown_journal_is_an_error_status(cluster: Cluster) -> None:
    a, _ = await two_brokers(cluster)
    fsm = AppendFSM(a.append_env, pb.AppendRequest(journal="no/such/journal"))
    await fsm.on_resolve()
    assert (fsm.state, fsm.status) == (State.ERROR, pb.JOURNAL_NOT_FOUND)


async def test_resolve_on_a_replica_awaits_desired_replicas(cluster: Cluster) -> None:
    _, b = await two_brokers(cluster)
    fsm = fsm_of(b)
    await fsm.on_resolve()
    assert fsm.state is State.AWAIT_DESIRED_REPLICAS


async def test_resolve_on_a_replica_without_proxying_is_refused(cluster: Cluster) -> None:
    _, b = await two_brokers(cluster)
    fsm = fsm_of(b, do_not_proxy=True)
    await fsm.on_resolve()
    assert (fsm.state, fsm.status) == (State.ERROR, pb.NOT_JOURNAL_PRIMARY_BROKER)


async def test_resolve_while_owning_the_pipeline_restarts_it(cluster: Cluster) -> None:
    a, _ = await two_brokers(cluster)
    fsm = fsm_of(a)
    await run_to(fsm, State.START_PIPELINE)
    fsm.state = State.RESOLVE  # As after UPDATE_ASSIGNMENTS.
    await fsm.on_resolve()
    assert fsm.state is State.START_PIPELINE
    fsm.return_pipeline()


async def test_resolve_waits_for_a_newer_revision(cluster: Cluster) -> None:
    a, _ = await two_brokers(cluster)
    fsm = fsm_of(a)
    fsm.read_through_rev = a.ks.header.revision + 1
    resolving = asyncio.ensure_future(fsm.on_resolve())
    revision = await cluster.put_spec(journal_spec(J, replication=2, length=2048))
    await resolving
    assert fsm.resolved is not None and fsm.resolved.revision >= revision
    assert fsm.state is State.ACQUIRE_PIPELINE


# --- ACQUIRE_PIPELINE ---------------------------------------------------------------------------


async def test_acquire_pipeline_takes_the_slot(cluster: Cluster) -> None:
    a, _ = await two_brokers(cluster)
    fsm = fsm_of(a)
    await run_to(fsm, State.ACQUIRE_PIPELINE)
    await fsm.on_acquire_pipeline()
    assert fsm.state is State.START_PIPELINE and fsm.owns_pipeline
    assert not replica_of(a, J).pipeline_slot.available()
    fsm.return_pipeline()
    assert replica_of(a, J).pipeline_slot.available()


async def test_acquire_pipeline_re_resolves_when_invalidated(cluster: Cluster) -> None:
    a, b = await two_brokers(cluster)
    holder = fsm_of(a)
    await run_to(holder, State.START_PIPELINE)  # Holds the pipeline.
    fsm = fsm_of(a)
    await run_to(fsm, State.ACQUIRE_PIPELINE)
    waiting = asyncio.ensure_future(fsm.on_acquire_pipeline())
    await cluster.assign(J, [a, b, await cluster.start_broker("zone-c", "broker-c")])
    await waiting
    assert fsm.state is State.RESOLVE and not fsm.owns_pipeline
    holder.return_pipeline()


# --- START_PIPELINE -----------------------------------------------------------------------------


async def test_start_pipeline_builds_a_new_pipeline(cluster: Cluster) -> None:
    a, _ = await two_brokers(cluster)
    fsm = fsm_of(a)
    await run_to(fsm, State.START_PIPELINE)
    await fsm.on_start_pipeline()
    assert fsm.state is State.SEND_PIPELINE_SYNC
    assert fsm.pln is not None and not replica_of(a, J).spool_slot.available()
    fsm.state = State.ERROR
    fsm.return_pipeline()


async def test_start_pipeline_reuses_a_synchronised_pipeline(cluster: Cluster) -> None:
    a, _ = await two_brokers(cluster)
    first = fsm_of(a)
    await run_to(first, State.STREAM_CONTENT)
    pln = first.pln
    await finish(first, [b"x"])
    fsm = fsm_of(a)
    await run_to(fsm, State.START_PIPELINE)
    await fsm.on_start_pipeline()
    assert fsm.state is State.UPDATE_ASSIGNMENTS and fsm.pln is pln
    fsm.return_pipeline()


async def test_start_pipeline_re_resolves_when_invalidated_awaiting_the_spool(
    cluster: Cluster,
) -> None:
    a, b = await two_brokers(cluster)
    fsm = fsm_of(a)
    await run_to(fsm, State.START_PIPELINE)
    replica = replica_of(a, J)
    spool = replica.spool_slot.take_nowait()  # Someone else holds the spool.
    assert spool is not None
    waiting = asyncio.ensure_future(fsm.on_start_pipeline())
    await cluster.assign(J, [a, b, await cluster.start_broker("zone-c", "broker-c")])
    await waiting
    assert fsm.state is State.RESOLVE
    replica.spool_slot.put(spool)
    fsm.return_pipeline()


# --- SEND_PIPELINE_SYNC / RECV_PIPELINE_SYNC ----------------------------------------------------


async def test_pipeline_sync_agrees(cluster: Cluster) -> None:
    a, _ = await two_brokers(cluster)
    fsm = fsm_of(a)
    await run_to(fsm, State.SEND_PIPELINE_SYNC)
    await fsm.on_send_pipeline_sync()
    assert fsm.state is State.RECV_PIPELINE_SYNC
    await fsm.on_recv_pipeline_sync()
    assert fsm.state is State.UPDATE_ASSIGNMENTS
    assert (fsm.roll_to_offset, fsm.read_through_rev) == (0, 0)
    fsm.return_pipeline()


async def test_pipeline_sync_rolls_forward_to_a_peer_ahead_and_adopts_its_registers(
    cluster: Cluster,
) -> None:
    a, b = await two_brokers(cluster)
    # The replica took part in commits this primary never saw (it restarted, say): its spool
    # ends at 100, with registers to match.
    peer = replica_of(b, J)
    spool = peer.spool_slot.take_nowait()
    assert spool is not None
    spool.apply(
        pb.ReplicateRequest(
            proposal=pb.Fragment(journal=J, begin=100, end=100, compression_codec=pb.NONE),
            registers=OWNER_X,
        ),
        primary=False,
    )
    peer.spool_slot.put(spool)

    fsm = fsm_of(a)
    await run_to(fsm, State.SEND_PIPELINE_SYNC)
    await fsm.on_send_pipeline_sync()
    await fsm.on_recv_pipeline_sync()
    assert fsm.state is State.SEND_PIPELINE_SYNC
    assert fsm.roll_to_offset == 100 and fsm.registers == OWNER_X
    await fsm.on_send_pipeline_sync()
    await fsm.on_recv_pipeline_sync()
    assert fsm.state is State.UPDATE_ASSIGNMENTS
    await run_to(fsm, State.STREAM_CONTENT)
    await finish(fsm, [b"after"])
    assert fsm.state is State.FINISHED
    assert fsm.client_fragment is not None
    assert (fsm.client_fragment.begin, fsm.client_fragment.end) == (100, 105)
    assert fsm.registers == OWNER_X
    assert local_content(b, J) == (100, b"after")


async def test_pipeline_sync_rolls_a_peer_that_cannot_extend_the_fragment(
    cluster: Cluster,
) -> None:
    a, b = await two_brokers(cluster)
    first = fsm_of(a)
    await run_to(first, State.STREAM_CONTENT)
    await finish(first, [b"abc"])
    # The replica restarts (same ID, fresh spool), and is assigned again.
    await cluster.stop_broker(b)
    b = await cluster.start_broker("zone-b", "broker-b", pulse_enabled=False)
    await cluster.assign(J, [a, b])

    fsm = fsm_of(a)
    await run_to(fsm, State.SEND_PIPELINE_SYNC)
    await fsm.on_send_pipeline_sync()
    await fsm.on_recv_pipeline_sync()
    # The fresh spool caught up to offset 3 but holds none of [0, 3): roll to a new fragment.
    assert (fsm.state, fsm.roll_to_offset) == (State.SEND_PIPELINE_SYNC, 3)
    await run_to(fsm, State.STREAM_CONTENT)
    await finish(fsm, [b"def"])
    assert fsm.state is State.FINISHED
    assert local_content(a, J) == (0, b"abcdef")
    assert local_content(b, J) == (3, b"def")


async def test_pipeline_sync_re_resolves_on_a_later_route(cluster: Cluster) -> None:
    a, b = await two_brokers(cluster)
    fsm = fsm_of(a)
    await run_to(fsm, State.SEND_PIPELINE_SYNC)
    # The route changes after the pipeline was built; the peer knows it.
    c = await cluster.start_broker("zone-c", "broker-c", pulse_enabled=False)
    revision = await cluster.assign(J, [a, b, c])
    await fsm.on_send_pipeline_sync()
    await fsm.on_recv_pipeline_sync()
    assert fsm.state is State.RESOLVE
    assert fsm.read_through_rev >= revision and fsm.pln is None
    fsm.return_pipeline()


async def test_pipeline_sync_fails_when_a_peer_is_gone(cluster: Cluster) -> None:
    a, b = await two_brokers(cluster)
    fsm = fsm_of(a)
    await run_to(fsm, State.SEND_PIPELINE_SYNC)
    await b.stop()  # Its server goes away; its keys stay until the test closes the backend.
    cluster.brokers.remove(b)
    await fsm.on_send_pipeline_sync()
    await fsm.on_recv_pipeline_sync()
    assert fsm.state is State.ERROR and isinstance(fsm.err, PeerError)
    assert fsm.pln is None
    fsm.return_pipeline()
    await b.backend.close()


# --- UPDATE_ASSIGNMENTS -------------------------------------------------------------------------


async def test_update_assignments_advertises_the_route(cluster: Cluster) -> None:
    a, _ = await two_brokers(cluster)
    fsm = fsm_of(a)
    await run_to(fsm, State.UPDATE_ASSIGNMENTS)
    await fsm.on_update_assignments()
    assert fsm.state is State.RESOLVE and fsm.read_through_rev > 0
    await a.ks.wait_for_revision(fsm.read_through_rev, 5.0)
    entries = journal_assignments(a.ks, ROOT, J)
    assert fsm.resolved is not None
    for entry in entries:
        advertised = assignment_of(entry).route
        assert advertised is not None and routes_equivalent(advertised, fsm.resolved.route)
        assert entry.kv.lease in (a.lease_id, cluster.brokers[1].lease_id)  # Lease kept.

    # Resolved again, the assignments match: a no-op.
    await run_to(fsm, State.UPDATE_ASSIGNMENTS)
    await fsm.on_update_assignments()
    assert fsm.state is State.AWAIT_DESIRED_REPLICAS
    fsm.return_pipeline()


async def test_update_assignments_fails_when_etcd_does(cluster: Cluster) -> None:
    a, _ = await two_brokers(cluster)
    closed = cluster.store.connect()
    await closed.close()
    fsm = AppendFSM(replace(a.append_env, backend=closed), pb.AppendRequest(journal=J))
    await run_to(fsm, State.UPDATE_ASSIGNMENTS)
    await fsm.on_update_assignments()
    assert fsm.state is State.ERROR and isinstance(fsm.err, BackendClosedError)
    fsm.return_pipeline()


# --- AWAIT_DESIRED_REPLICAS ---------------------------------------------------------------------


async def test_await_desired_replicas_ok_on_the_primary(cluster: Cluster) -> None:
    a, _ = await two_brokers(cluster)
    fsm = fsm_of(a)
    await run_to(fsm, State.AWAIT_DESIRED_REPLICAS)
    await fsm.on_await_desired_replicas()
    assert fsm.state is State.VALIDATE_PRECONDITIONS
    fsm.return_pipeline()


async def test_await_desired_replicas_proxies_from_a_replica(cluster: Cluster) -> None:
    _, b = await two_brokers(cluster)
    fsm = fsm_of(b)
    await run_to(fsm, State.AWAIT_DESIRED_REPLICAS)
    await fsm.on_await_desired_replicas()
    assert fsm.state is State.PROXY


async def test_await_desired_replicas_with_too_few(cluster: Cluster) -> None:
    a, _ = await two_brokers(cluster, replication=3)
    fsm = fsm_of(a)
    await run_to(fsm, State.AWAIT_DESIRED_REPLICAS)
    await fsm.on_await_desired_replicas()
    assert (fsm.state, fsm.status) == (State.ERROR, pb.INSUFFICIENT_JOURNAL_BROKERS)
    fsm.return_pipeline()


async def test_await_desired_replicas_with_too_many_waits_for_the_next_revision(
    cluster: Cluster,
) -> None:
    a, _ = await two_brokers(cluster, replication=1)
    fsm = fsm_of(a)
    await run_to(fsm, State.AWAIT_DESIRED_REPLICAS)
    await fsm.on_await_desired_replicas()
    assert fsm.resolved is not None
    assert (fsm.state, fsm.read_through_rev) == (State.RESOLVE, fsm.resolved.revision + 1)
    fsm.return_pipeline()


# --- VALIDATE_PRECONDITIONS ---------------------------------------------------------------------


async def test_validate_preconditions_ok(cluster: Cluster) -> None:
    a, _ = await two_brokers(cluster)
    fsm = fsm_of(a)
    await run_to(fsm, State.VALIDATE_PRECONDITIONS)
    await fsm.on_validate_preconditions()
    assert fsm.state is State.STREAM_CONTENT
    await finish(fsm)


async def test_validate_preconditions_register_mismatch(cluster: Cluster) -> None:
    a, _ = await two_brokers(cluster)
    first = fsm_of(a, union_registers=OWNER_X)
    await run_to(first, State.STREAM_CONTENT)
    await finish(first, [b"x"])
    selector = pb.LabelSelector(include=label_set([("owner", "y")]))
    fsm = fsm_of(a, check_registers=selector)
    await run_to(fsm, State.VALIDATE_PRECONDITIONS)
    await fsm.on_validate_preconditions()
    assert (fsm.state, fsm.status) == (State.ERROR, pb.REGISTER_MISMATCH)
    assert fsm.registers == OWNER_X
    fsm.return_pipeline()


async def test_validate_preconditions_wrong_append_offset(cluster: Cluster) -> None:
    a, _ = await two_brokers(cluster)
    fsm = fsm_of(a, offset=7)
    await run_to(fsm, State.VALIDATE_PRECONDITIONS)
    await fsm.on_validate_preconditions()
    assert (fsm.state, fsm.status) == (State.ERROR, pb.WRONG_APPEND_OFFSET)
    fsm.return_pipeline()


async def test_validate_preconditions_rolls_the_journals_first_write(cluster: Cluster) -> None:
    a, _ = await two_brokers(cluster)
    first = fsm_of(a)
    await run_to(first, State.STREAM_CONTENT)
    await finish(first, [b"first"])
    fsm = fsm_of(a)
    await run_to(fsm, State.VALIDATE_PRECONDITIONS)
    await fsm.on_validate_preconditions()
    assert (fsm.state, fsm.roll_to_offset) == (State.STREAM_CONTENT, 5)
    await finish(fsm, [b"second"])
    local = replica_of(a, J).index.local_fragments()
    assert [(f.begin, f.end) for f in local] == [(0, 5), (5, 11)]


class _StalledStore(FragmentStore):
    """A store whose listings wait until released: the index has no first refresh."""

    def __init__(self, url: StoreURL, release: asyncio.Event) -> None:
        super().__init__(url)
        self._release = release

    async def _list(self, prefix: str) -> list[ListedObject]:
        await self._release.wait()
        return []

    async def _put(self, key: str, content: object, content_encoding: str) -> None:
        raise NotImplementedError

    async def _open(self, key: str) -> FragmentReader:
        raise NotImplementedError

    async def _exists(self, key: str) -> bool:
        return False

    async def _delete(self, key: str) -> None:
        raise NotImplementedError

    async def _sign(self, key: str, ttl_s: float) -> str:
        raise NotImplementedError


async def test_validate_preconditions_waits_for_the_first_index_refresh(
    cluster: Cluster,
) -> None:
    release = asyncio.Event()
    cluster.stores = new_registry()
    cluster.stores.register("s3", lambda url: _StalledStore(url, release))
    a = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    await cluster.create(journal_spec(J, stores=["s3://bucket/path/"]), [a])
    fsm = AppendFSM(replace(a.append_env, index_refresh_wait_s=0.05), pb.AppendRequest(journal=J))
    await run_to(fsm, State.VALIDATE_PRECONDITIONS)
    await fsm.on_validate_preconditions()
    assert fsm.state is State.ERROR and isinstance(fsm.err, IndexNotReadyError)
    fsm.return_pipeline()

    # Invalidated while waiting: resolve again.
    fsm = fsm_of(a)
    await run_to(fsm, State.VALIDATE_PRECONDITIONS)
    waiting = asyncio.ensure_future(fsm.on_validate_preconditions())
    b = await cluster.start_broker("zone-b", "broker-b", pulse_enabled=False)
    await cluster.assign(J, [a, b])
    await waiting
    assert fsm.state is State.RESOLVE
    fsm.return_pipeline()
    release.set()


# --- STREAM_CONTENT / READ_ACKNOWLEDGEMENTS -----------------------------------------------------


async def test_stream_content_transitions(cluster: Cluster) -> None:
    a, b = await two_brokers(cluster)
    fsm = fsm_of(a)
    await run_to(fsm, State.STREAM_CONTENT)
    await fsm.on_stream_content(pb.AppendRequest(content=b"abc"), None)
    assert fsm.state is State.STREAM_CONTENT
    await fsm.on_stream_content(pb.AppendRequest(), None)  # The commit marker.
    assert fsm.state is State.STREAM_CONTENT and fsm.client_commit
    await fsm.on_stream_content(None, None)
    assert fsm.state is State.READ_ACKNOWLEDGEMENTS
    await fsm.on_read_acknowledgements()
    assert fsm.state is State.FINISHED and not fsm.owns_pipeline
    assert local_content(b, J) == (0, b"abc")


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ([b"abc", None], UnexpectedEOFError),  # End of stream without the commit marker.
        ([b"abc", b"", b"more"], ExpectedEOFError),  # Content after the commit marker.
        ([b"", None], RegisterUpdateWithEmptyAppendError),  # Register update, no content.
    ],
)
async def test_stream_content_rolls_back_on_client_errors(
    cluster: Cluster, messages: list[bytes | None], error: type[Exception]
) -> None:
    a, b = await two_brokers(cluster)
    fsm = fsm_of(a, union_registers=OWNER_X)
    await run_to(fsm, State.STREAM_CONTENT)
    for message in messages:
        if fsm.state is not State.STREAM_CONTENT:
            break
        await fsm.on_stream_content(
            pb.AppendRequest(content=message) if message is not None else None, None
        )
    assert fsm.state is State.READ_ACKNOWLEDGEMENTS
    await fsm.on_read_acknowledgements()
    assert fsm.state is State.ERROR and isinstance(fsm.err, error)
    fsm.return_pipeline()
    # Nothing was committed anywhere, registers included; the next append starts at 0.
    nxt = fsm_of(a)
    await run_to(nxt, State.STREAM_CONTENT)
    assert nxt.registers == pb.LabelSet()
    await finish(nxt, [b"ok"])
    assert nxt.client_fragment is not None and nxt.client_fragment.begin == 0
    assert local_content(b, J) == (0, b"ok")


async def test_stream_content_not_allowed_on_a_read_only_journal(cluster: Cluster) -> None:
    a = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    await cluster.create(journal_spec(J, flags=pb.JournalSpec.O_RDONLY), [a])
    fsm = fsm_of(a)
    await run_to(fsm, State.STREAM_CONTENT)
    await fsm.on_stream_content(pb.AppendRequest(content=b"abc"), None)
    assert fsm.state is State.READ_ACKNOWLEDGEMENTS
    await fsm.on_read_acknowledgements()
    assert (fsm.state, fsm.status) == (State.ERROR, pb.NOT_ALLOWED)
    fsm.return_pipeline()


async def test_client_cancellation_mid_append_rolls_back_on_every_replica(
    cluster: Cluster,
) -> None:
    a, b = await two_brokers(cluster)
    fsm = fsm_of(a)
    sent = 0

    async def recv() -> tuple[pb.AppendRequest | None, BaseException | None]:
        nonlocal sent
        sent += 1
        if sent == 1:
            return pb.AppendRequest(content=b"doomed"), None
        raise asyncio.CancelledError  # The client went away; gRPC cancels the handler.

    with pytest.raises(asyncio.CancelledError):
        await fsm.run(recv)
    assert fsm.state is State.ERROR and isinstance(fsm.err, ClientAbortedError)
    assert replica_of(a, J).pipeline_slot.available()

    nxt = fsm_of(a)
    await run_to(nxt, State.STREAM_CONTENT)
    await finish(nxt, [b"kept"])
    assert nxt.client_fragment is not None
    assert (nxt.client_fragment.begin, nxt.client_fragment.end) == (0, 4)
    assert local_content(b, J) == (0, b"kept")


async def test_read_acknowledgements_are_read_in_order_by_pipelined_appends(
    cluster: Cluster,
) -> None:
    a, b = await two_brokers(cluster)
    first = fsm_of(a)
    await run_to(first, State.STREAM_CONTENT)
    await first.on_stream_content(pb.AppendRequest(content=b"one"), None)
    await first.on_stream_content(pb.AppendRequest(), None)
    await first.on_stream_content(None, None)
    # The first append hands the pipeline on, and is still owed its acknowledgement when the
    # second one streams and commits.
    reading = asyncio.ensure_future(first.on_read_acknowledgements())
    second = fsm_of(a)
    await run_to(second, State.STREAM_CONTENT)
    await second.on_stream_content(pb.AppendRequest(content=b"two"), None)
    await second.on_stream_content(pb.AppendRequest(), None)
    await second.on_stream_content(None, None)
    await second.on_read_acknowledgements()
    await reading
    assert (first.state, second.state) == (State.FINISHED, State.FINISHED)
    assert first.client_fragment is not None and second.client_fragment is not None
    assert (second.client_fragment.begin, second.client_fragment.end) == (3, 6)
    assert local_content(b, J) == (0, b"onetwo")


@pytest.mark.parametrize("replication", [1, 2])
async def test_a_finished_append_has_read_its_own_acknowledgements(
    cluster: Cluster, replication: int
) -> None:
    # Each append reads its replicas' answers before it finishes (at R=1 there is none to
    # read, and nothing is waited for). One left unread would be taken by the next append
    # for its own, and the last one would come before the stream's end at close.
    a = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    b = await cluster.start_broker("zone-b", "broker-b", pulse_enabled=False)
    await cluster.create(journal_spec(J, replication=replication), [a, b][:replication])
    for content in (b"one", b"two"):
        fsm = fsm_of(a)
        await run_to(fsm, State.STREAM_CONTENT)
        await finish(fsm, [content])
        assert fsm.state is State.FINISHED, (fsm.status, fsm.err)
    pln = replica_of(a, J).pipeline_slot.take_nowait()
    assert pln is not None and not pln.broken
    assert pln.has_peers_to_read() is (replication > 1)
    pln.begin_shutdown()
    await pln.finish_shutdown(expect_err=False)
    assert pln.recv_err() is None  # After the close came each peer's end of stream.
    replica_of(a, J).pipeline_slot.put(None)
    assert local_content(a, J) == (0, b"onetwo")
    if replication > 1:
        assert local_content(b, J) == (0, b"onetwo")


async def test_read_acknowledgements_fails_when_a_peer_dies_mid_append(
    cluster: Cluster,
) -> None:
    a, b = await two_brokers(cluster)
    fsm = fsm_of(a)
    await run_to(fsm, State.STREAM_CONTENT)
    await fsm.on_stream_content(pb.AppendRequest(content=b"abc"), None)
    await b.stop()  # The replica's server goes away with the append half-done.
    cluster.brokers.remove(b)
    await fsm.on_stream_content(pb.AppendRequest(), None)
    await fsm.on_stream_content(None, None)
    await fsm.on_read_acknowledgements()
    assert fsm.state is State.ERROR and isinstance(fsm.err, PeerError)
    # The pipeline went back to its slot, broken: the next append rebuilds it.
    pln = replica_of(a, J).pipeline_slot.take_nowait()
    assert pln is None or pln.broken
    replica_of(a, J).pipeline_slot.put(pln)
    await b.backend.close()


async def test_handlers_refuse_the_wrong_state(cluster: Cluster) -> None:
    a, _ = await two_brokers(cluster)
    fsm = fsm_of(a)
    with pytest.raises(FSMStateError):
        await fsm.on_stream_content(None, None)
    with pytest.raises(FSMStateError):
        await fsm.on_validate_preconditions()
    assert fsm.state is State.RESOLVE


@pytest.mark.parametrize("cancel_after_yields", [0, 1, 2, 3])
async def test_client_cancellation_during_the_commit_leaves_every_replica_alike(
    cluster: Cluster, cancel_after_yields: int
) -> None:
    """The client goes away (gRPC cancels the handler) just after its end of stream, while
    the commit is being proposed to the replicas. The proposal must reach every replica and
    the primary's own spool, or none of them: a replica that committed what the primary then
    rolled back holds content its primary lacks (reads through the primary stop there until
    the replica persists it, minutes later)."""
    a, b = await two_brokers(cluster)
    fsm = fsm_of(a)
    script: list[pb.AppendRequest | None] = [
        pb.AppendRequest(content=b"abc"),
        pb.AppendRequest(),
        None,
    ]
    task: asyncio.Task[None] | None = None

    def cancel_later(yields: int) -> None:
        assert task is not None
        if yields == 0:
            task.cancel()
        else:
            asyncio.get_running_loop().call_soon(cancel_later, yields - 1)

    async def recv() -> tuple[pb.AppendRequest | None, BaseException | None]:
        message = script.pop(0)
        if message is None:  # End of stream: the commit is proposed next.
            cancel_later(cancel_after_yields)
        return message, None

    task = asyncio.ensure_future(fsm.run(recv))
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert replica_of(a, J).pipeline_slot.available()

    nxt = fsm_of(a)
    await run_to(nxt, State.STREAM_CONTENT)
    await finish(nxt, [b"kept"])
    assert nxt.state is State.FINISHED, (nxt.status, nxt.err)
    assert local_content(a, J) == local_content(b, J)
    assert local_content(a, J)[1].endswith(b"kept")
