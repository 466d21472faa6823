"""Fragment boundaries and persistence as driven by the write path: rolls at the target
length, at flush-interval boundaries, on codec and route changes; the pulse; the fragment index
ahead of the spool (INDEX_HAS_GREATER_OFFSET) and its explicit recovery."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from broker_testkit import Cluster, journal_spec, local_content, replica_of, wait_until

from broker.append_pulse import pulse
from broker.fragment.index import IndexClosedError
from broker.fragment.naming import sum_from_digest
from broker.fragment.stores.registry import new_registry
from broker.protocol import protocol_pb2 as pb
from broker.server import Broker

J = "frag/journal"


def boundaries(broker: Broker) -> list[tuple[int, int]]:
    """Fragment boundaries as this broker's index sees its local (spool) fragments."""
    return [(f.begin, f.end) for f in replica_of(broker, J).index.local_fragments()]


def stored(root: Path) -> list[tuple[int, int]]:
    """(begin, end) of every fragment file under a file:// store root."""
    out = []
    for path in sorted((root / J).glob("*")):
        begin, end, _ = path.name.split("-")
        out.append((int(begin, 16), int(end, 16)))
    return out


async def test_fragments_roll_at_the_target_length(cluster: Cluster) -> None:
    b = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    await cluster.create(journal_spec(J, length=1024), [b])
    for _ in range(4):
        assert (await cluster.append(b, J, [b"x" * 600])).status == pb.OK
    # [0, 600) is the journal's first write (rolled at once); [600, 1800) reached the target
    # length with its second append, so the fourth append starts a new fragment.
    assert boundaries(b) == [(0, 600), (600, 1800), (1800, 2400)]


async def test_fragments_roll_when_the_codec_changes(cluster: Cluster) -> None:
    b = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    await cluster.create(journal_spec(J), [b])
    await cluster.append(b, J, [b"first"])
    await cluster.append(b, J, [b"second"])
    resp = await cluster.append(b, J, [b"third"])
    assert resp.commit.compression_codec == pb.NONE
    await cluster.sync(await cluster.put_spec(journal_spec(J, codec=pb.GZIP)))

    resp = await cluster.append(b, J, [b"fourth"])
    assert resp.commit.compression_codec == pb.GZIP
    assert boundaries(b) == [(0, 5), (5, 16), (16, 22)]


async def test_fragments_roll_when_the_route_changes(cluster: Cluster) -> None:
    a = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    b = await cluster.start_broker("zone-b", "broker-b", pulse_enabled=False)
    await cluster.create(journal_spec(J, replication=2), [a, b])
    for chunk in (b"one", b"two", b"three"):
        await cluster.append(a, J, [chunk])
    assert boundaries(a) == [(0, 3), (3, 11)]

    # b leaves the route. Every remaining replica could extend the fragment, but a fragment
    # holds appends of one route only: it is closed, and a new one begins.
    await cluster.put_spec(journal_spec(J, replication=1))
    await cluster.assign(J, [a])
    await cluster.append(a, J, [b"four"])
    await cluster.append(a, J, [b"five"])
    assert boundaries(a) == [(0, 3), (3, 11), (11, 19)]

    # b joins again (it cannot extend [11, 19), which it never saw).
    await cluster.put_spec(journal_spec(J, replication=2))
    await cluster.assign(J, [a, b])
    await cluster.append(a, J, [b"six"])
    assert boundaries(a) == [(0, 3), (3, 11), (11, 19), (19, 22)]
    assert local_content(b, J)[1].endswith(b"six")


async def test_pulse_rolls_at_flush_interval_boundaries(cluster: Cluster) -> None:
    now = [600.0 * 1000 + 1]  # Just after a 10-minute boundary.
    b = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False, clock=lambda: now[0])
    await cluster.create(journal_spec(J, flush_interval_s=600), [b])

    await cluster.append(b, J, [b"first"])
    await pulse(b.append_env, J)  # Rolls the journal's first write.
    await cluster.append(b, J, [b"a"])
    now[0] += 300
    await pulse(b.append_env, J)  # Same interval: nothing to roll.
    await cluster.append(b, J, [b"b"])
    now[0] += 300
    await pulse(b.append_env, J)  # The interval has passed: roll without any traffic.
    await cluster.append(b, J, [b"c"])
    assert boundaries(b) == [(0, 5), (5, 7), (7, 8)]


async def test_pulse_persists_content_without_traffic(cluster: Cluster, tmp_path: Path) -> None:
    (tmp_path / "frags").mkdir()
    cluster.stores = new_registry(file_root=tmp_path)
    b = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    await cluster.create(journal_spec(J, stores=["file:///frags/"]), [b])
    index = replica_of(b, J).index
    await index.wait_first_refresh(5.0)

    resp = await cluster.append(b, J, [b"persist me"])
    assert resp.status == pb.OK
    assert stored(tmp_path / "frags") == []
    await pulse(b.append_env, J)  # Rolls: the completed fragment goes to the persister.
    # The persister uploads in the background, then tells the index (which drops its copy).
    await wait_until(lambda: not index.has_local)
    assert stored(tmp_path / "frags") == [(0, 10)]
    assert [f.backing_store for f in index.fragments()] == ["file:///frags/"]
    name = next((tmp_path / "frags" / J).iterdir()).name
    assert name.split("-")[2].startswith(hashlib.sha1(b"persist me").hexdigest())


async def _stored_elsewhere(cluster: Cluster, tmp_path: Path, content: bytes) -> None:
    """`content` as journal J's [0, len) in the store file:///frags/, persisted by another
    cluster (or a lost broker): no broker of this one ever held it."""
    (tmp_path / "frags").mkdir()
    cluster.stores = new_registry(file_root=tmp_path)
    fragment = pb.Fragment(
        journal=J,
        begin=0,
        end=len(content),
        sum=sum_from_digest(hashlib.sha1(content).digest()),
        compression_codec=pb.NONE,
    )
    await cluster.stores.get("file:///frags/").put(fragment, content)


async def test_index_ahead_of_the_spool_refuses_until_an_explicit_offset(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Another cluster (or a lost broker) persisted [0, 100) that this route never saw.
    await _stored_elsewhere(cluster, tmp_path, b"z" * 100)

    brokers = [await cluster.start_broker(f"zone-{z}", f"broker-{z}") for z in "ab"]
    await cluster.create(journal_spec(J, replication=2, stores=["file:///frags/"]), brokers)
    await replica_of(brokers[0], J).index.wait_first_refresh(5.0)

    resp = await cluster.append(brokers[0], J, [b"lost?"])
    assert resp.status == pb.INDEX_HAS_GREATER_OFFSET
    resp = await cluster.append(brokers[0], J, [b"lost?"], offset=50)
    assert resp.status == pb.WRONG_APPEND_OFFSET

    # The operator confirms the journal's end (gazctl journals reset-head).
    resp = await cluster.append(brokers[0], J, [b"resumed"], offset=100)
    assert resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (100, 107)
    resp = await cluster.append(brokers[1], J, [b"!"])  # Proxied; no offset needed now.
    assert (resp.status, resp.commit.begin) == (pb.OK, 107)
    for b in brokers:
        assert local_content(b, J) == (100, b"resumed!")


async def test_a_pulse_refused_for_an_index_ahead_of_the_spool_waits_for_its_interval(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Only an operator's append at an explicit offset can end INDEX_HAS_GREATER_OFFSET: the
    pulse is not failed-and-retried within seconds (a warning each time) but done for its
    interval, as Gazette's; once the operator confirmed the end, it commits again."""
    await _stored_elsewhere(cluster, tmp_path, b"z" * 100)
    b = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    await cluster.create(journal_spec(J, stores=["file:///frags/"]), [b])
    await replica_of(b, J).index.wait_first_refresh(5.0)

    refused = await pulse(b.append_env, J)
    assert (refused.ok, refused.committed) == (True, False)
    resp = await cluster.append(b, J, [b"resumed"], offset=100)  # gazctl journals reset-head
    assert resp.status == pb.OK
    again = await pulse(b.append_env, J)
    assert (again.ok, again.committed) == (True, True)


async def test_read_only_journal_accepts_zero_byte_appends_past_the_index(
    cluster: Cluster, tmp_path: Path
) -> None:
    await _stored_elsewhere(cluster, tmp_path, b"y" * 10)
    b = await cluster.start_broker("zone-a", "broker-a")
    spec = journal_spec(J, stores=["file:///frags/"], flags=pb.JournalSpec.O_RDONLY)
    await cluster.create(spec, [b])
    await replica_of(b, J).index.wait_first_refresh(5.0)

    # A transaction barrier: no bytes, so no offset can be double-written.
    resp = await cluster.append(b, J, [])
    assert resp.status == pb.OK
    resp = await cluster.append(b, J, [b"data"])
    assert resp.status == pb.NOT_ALLOWED


async def test_a_replica_holding_commits_its_primary_missed_persists_them_at_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    # What a soak saw: a primary stopped between its commit reaching one replica and another.
    # The next primary (the other replica) proposed less, and rolled every spool past the
    # first replica's end: only that replica held the tail, and it waited the replica delay
    # (120 s) to upload it, while reads of those offsets at every other broker, the new
    # primary included, waited at a hole.
    (tmp_path / "frags").mkdir()
    cluster.stores = new_registry(file_root=tmp_path)
    a = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    b = await cluster.start_broker("zone-b", "broker-b", pulse_enabled=False)
    await cluster.create(journal_spec(J, replication=2, stores=["file:///frags/"]), [a, b])
    for broker in (a, b):
        await replica_of(broker, J).index.wait_first_refresh(5.0)
    # b committed [0, 4) under a primary that is gone; a never saw it.
    peer = replica_of(b, J)
    spool = peer.spool_slot.take_nowait()
    assert spool is not None
    spool.apply(pb.ReplicateRequest(content=b"lost", content_delta=0), primary=False)
    spool.apply(pb.ReplicateRequest(proposal=spool.next(), registers=spool.registers), False)
    peer.spool_slot.put(spool)

    resp = await cluster.append(a, J, [b"after"])  # a rolls every spool forward past b's.
    assert (resp.status, resp.commit.begin) == (pb.OK, 4)
    assert local_content(a, J) == (4, b"after")
    # Uploaded at once (not after the persister's 120 s replica delay), a's index lists it:
    # a serves [0, 4) though it never held it.
    index = replica_of(a, J).index
    await wait_until(lambda: any(f.begin == 0 and f.end == 4 for f in index.fragments()), 15.0)
    assert stored(tmp_path / "frags") == [(0, 4)]


async def test_a_replica_stopped_while_its_spool_is_held_still_ends_its_blocking_reads(
    cluster: Cluster,
) -> None:
    # Found by review: a replica stopping while an append held its spool past the shutdown
    # wait returned without closing its index, and a blocking read waiting there (at the
    # journal's head) waited for ever on a replica that was gone.
    b = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False, shutdown_wait_s=0.1)
    await cluster.create(journal_spec(J), [b])
    replica = replica_of(b, J)
    held = replica.spool_slot.take_nowait()  # As a long append would hold it.
    assert held is not None
    waiting = asyncio.ensure_future(replica.index.wait_for(0))
    await asyncio.sleep(0)
    replica.stop()
    async with asyncio.timeout(10.0):
        await replica._stopped.wait()
        with pytest.raises(IndexClosedError):
            await waiting
    assert replica.index.closed


async def test_a_durable_spool_held_past_the_stop_is_left_for_the_next_replica_once_back(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Found by review: the replica's claim on the journal's spool files was released though
    # an append still held the spool, and its state was not left behind: the next replica of
    # the journal on this broker started a fresh spool at offset 0 in the same directory, whose
    # first commit overwrote the committed content's file. Now the files stay claimed until the
    # holder gives the spool back; it is then rolled and its state left as a stop leaves it.
    b = await cluster.start_broker(
        "zone-a",
        "broker-a",
        pulse_enabled=False,
        shutdown_wait_s=0.1,
        memory_spools=False,
        data_dir=str(tmp_path / "data"),
    )
    await cluster.create(journal_spec(J), [b])
    assert (await cluster.append(b, J, [b"hello"])).status == pb.OK
    replica = replica_of(b, J)
    held = replica.pipeline_slot.take_nowait()  # An append holds the pipeline (and its spool).
    assert held is not None
    replica.stop()
    async with asyncio.timeout(10.0):
        await replica._stopped.wait()
    assert b.spool_dir is not None
    assert b.spool_dir.pending() == []  # Not handed on while the holder may still write.
    replica.pipeline_slot.put(held)  # The append ends.
    await wait_until(lambda: b.spool_dir is not None and b.spool_dir.pending() == [J])
    recovered = b.spool_dir.take(J)
    assert recovered is not None
    assert (recovered.spool.fragment.begin, recovered.spool.fragment.end) == (5, 5)
    b.spool_dir.put_back(recovered)
