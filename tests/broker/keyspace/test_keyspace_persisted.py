"""EmbeddedStore.open: the embedded keyspace persisted under a directory.

"Crash" here means copying the directory while the store is open and opening the copy: the
files are then exactly what a process killed at that moment leaves (every acknowledged change
was written to the OS before it was acknowledged). Real kill -9, SIGTERM and write failures of
real processes are in test_keyspace_restart_e2e.py."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest
import structlog

from broker.keyspace.backend import CompactedError, EventType, KeyValue, LeaseNotFoundError
from broker.keyspace.conformance import EmbeddedHarness, check_keyspace
from broker.keyspace.embedded import EmbeddedBackend, EmbeddedStore
from broker.keyspace.persisted import KeySpaceDirError, KeySpaceLockedError
from broker.keyspace.wal import CorruptLogError, frame, header_bytes

ALL = (b"\x00", b"\x00")
wait_s = 5.0  # upper bound on waits that should end promptly


def wal_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("wal-*.log"))


def crash_copy(directory: Path, to: Path) -> Path:
    """What a process killed now would leave in ``directory`` (see the module docstring)."""
    shutil.copytree(directory, to)
    return to


async def everything(backend: EmbeddedBackend) -> tuple[int, tuple[KeyValue, ...]]:
    resp = await backend.range(*ALL)
    return resp.header.revision, resp.kvs


@pytest.mark.parametrize("fsync", [False, True], ids=["no-fsync", "fsync"])
async def test_conformance_persisted_then_after_reopen(tmp_path: Path, fsync: bool) -> None:
    store = EmbeddedStore.open(tmp_path, fsync=fsync)
    try:
        await check_keyspace(EmbeddedHarness(store.connect()))
        before = await everything(store.connect())
    finally:
        await store.close()
    store = EmbeddedStore.open(tmp_path, fsync=fsync)
    try:
        backend = store.connect()
        # The checks leave no lease behind: nothing was revoked at open, all is as it was.
        assert await everything(backend) == before
        await check_keyspace(EmbeddedHarness(backend))
    finally:
        await store.close()


async def test_a_crash_loses_no_acknowledged_change(tmp_path: Path) -> None:
    store = EmbeddedStore.open(tmp_path / "ks")
    try:
        backend = store.connect()
        await backend.put(b"/a", b"1")
        await backend.put(b"/b", b"2")
        await backend.put(b"/a", b"3")
        await backend.delete(b"/b")
        await backend.txn([], [], [])  # Changes nothing.
        before = await everything(backend)
        crashed = crash_copy(tmp_path / "ks", tmp_path / "crashed")
    finally:
        await store.close()
    reopened = EmbeddedStore.open(crashed)
    try:
        backend = reopened.connect()
        assert await everything(backend) == before
        assert before[1] == (KeyValue(b"/a", b"3", 2, 4, 2),)
        # The revision continues from where it was, never back.
        assert (await backend.put(b"/c", b"")).revision == before[0] + 1
    finally:
        await reopened.close()


async def test_leases_are_revoked_at_open_in_new_revisions(tmp_path: Path) -> None:
    store = EmbeddedStore.open(tmp_path / "ks")
    try:
        backend = store.connect()
        member, _ = await backend.lease_grant(3600)
        await backend.put(b"/members/m1", b"", member)
        await backend.put(b"/assign/j1#m1", b"", member)
        idle, _ = await backend.lease_grant(3600)  # No keys: its revocation is no revision.
        await backend.put(b"/spec", b"kept")
        before, _ = await everything(backend)
        crashed = crash_copy(tmp_path / "ks", tmp_path / "crashed")
    finally:
        await store.close()
    reopened = EmbeddedStore.open(crashed)
    try:
        assert reopened.core.revision == before + 1  # Revoked by open itself, durably.
        backend = reopened.connect()
        revision, kvs = await everything(backend)
        # As etcd would show once the TTLs ran out: deleted, in one new revision per lease.
        assert revision == before + 1
        assert [kv.key for kv in kvs] == [b"/spec"]
        watch = backend.watch(b"/", b"0", start_revision=before + 1)
        resp = await asyncio.wait_for(anext(watch), wait_s)
        assert resp.header.revision == before + 1
        assert [(e.type, e.kv.key) for e in resp.events] == [
            (EventType.DELETE, b"/assign/j1#m1"),
            (EventType.DELETE, b"/members/m1"),
        ]
        await watch.aclose()
        for lease in (member, idle):
            with pytest.raises(LeaseNotFoundError):
                await backend.lease_keepalive_once(lease)
        new, _ = await backend.lease_grant(10)
        assert new not in (member, idle)  # Lease IDs are not reused.
    finally:
        await reopened.close()


async def test_compaction_and_history_survive(tmp_path: Path) -> None:
    store = EmbeddedStore.open(tmp_path)
    try:
        backend = store.connect()
        for i in range(5):
            await backend.put(b"/k", str(i).encode())
        await backend.compact(4)
    finally:
        await store.close()
    store = EmbeddedStore.open(tmp_path)
    try:
        backend = store.connect()
        with pytest.raises(CompactedError):
            await backend.range(b"/k", revision=3)
        assert (await backend.range(b"/k", revision=4)).kvs[0].value == b"2"
        with pytest.raises(CompactedError):
            await backend.compact(4)
    finally:
        await store.close()


async def test_snapshots_bound_the_log_and_replay_continues_from_them(tmp_path: Path) -> None:
    wal_bytes_max = 4096
    store = EmbeddedStore.open(tmp_path, wal_bytes_max=wal_bytes_max)
    try:
        backend = store.connect()
        for i in range(200):
            header = await backend.put(f"/k/{i % 50:02}".encode(), b"v" * 40)
            assert store.directory is not None
            assert store.directory.wal_bytes <= wal_bytes_max + 200  # One record over, at most.
        [wal] = wal_files(tmp_path)
        assert wal.name != "wal-0000000000000000.log"  # Rotated: older logs are deleted.
        before = await everything(backend)
        last = header.revision
    finally:
        await store.close()
    store = EmbeddedStore.open(tmp_path, wal_bytes_max=wal_bytes_max)
    try:
        backend = store.connect()
        assert await everything(backend) == before
        assert before[0] == last and len(before[1]) == 50
        # Even if a snapshot was taken at exactly `last`, a watch from it gets its events.
        watch = backend.watch(b"/k/", b"/k0", start_revision=last)
        resp = await asyncio.wait_for(anext(watch), wait_s)
        assert resp.header.revision == last and resp.events[0].kv.key == b"/k/49"
        await watch.aclose()
    finally:
        await store.close()


async def test_a_snapshot_at_the_current_revision_still_serves_watches_from_it(
    tmp_path: Path,
) -> None:
    # wal_bytes_max 1: every change is followed by a snapshot, so the last revision is always
    # the snapshot's.
    store = EmbeddedStore.open(tmp_path, wal_bytes_max=1)
    try:
        backend = store.connect()
        await backend.put(b"/a", b"1")
        header = await backend.put(b"/b", b"2")
        assert (tmp_path / "snapshot").exists()
    finally:
        await store.close()
    store = EmbeddedStore.open(tmp_path, wal_bytes_max=1)
    try:
        backend = store.connect()
        watch = backend.watch(b"/", b"0", start_revision=header.revision)
        resp = await asyncio.wait_for(anext(watch), wait_s)
        assert [e.kv.key for e in resp.events] == [b"/b"]
        await watch.aclose()
        with pytest.raises(CompactedError):
            await backend.range(b"/a", revision=header.revision - 1)
    finally:
        await store.close()


async def test_a_torn_final_record_is_dropped_with_a_warning(tmp_path: Path) -> None:
    store = EmbeddedStore.open(tmp_path)
    try:
        await store.connect().put(b"/a", b"1")
        before = await everything(store.connect())
    finally:
        await store.close()
    [wal] = wal_files(tmp_path)
    intact = wal.stat().st_size
    with wal.open("ab") as f:
        f.write(frame(b"a change whose write was cut short")[:20])
    with structlog.testing.capture_logs() as logs:
        store = EmbeddedStore.open(tmp_path)
    try:
        [warning] = [e for e in logs if e["log_level"] == "warning"]
        assert "torn tail" in warning["event"]
        assert (warning["offset"], warning["dropped_bytes"]) == (intact, 20)
        assert wal.stat().st_size == intact  # Truncated: new records follow the intact ones.
        backend = store.connect()
        assert await everything(backend) == before
        await backend.put(b"/b", b"2")
        after = await everything(backend)
    finally:
        await store.close()
    store = EmbeddedStore.open(tmp_path)
    try:
        assert await everything(store.connect()) == after
    finally:
        await store.close()


async def test_a_corrupt_record_before_the_tail_is_refused_naming_file_and_offset(
    tmp_path: Path,
) -> None:
    store = EmbeddedStore.open(tmp_path)
    try:
        for key in (b"/a", b"/b", b"/c"):
            await store.connect().put(key, b"value")
    finally:
        await store.close()
    [wal] = wal_files(tmp_path)
    data = bytearray(wal.read_bytes())
    second = header_bytes + (int.from_bytes(data[:4], "little"))
    data[second + header_bytes + 4] ^= 0x01  # Inside the second record's payload.
    wal.write_bytes(bytes(data))
    for _ in range(2):  # Refused each time, nothing changed: the lock was released too.
        with pytest.raises(CorruptLogError) as info:
            EmbeddedStore.open(tmp_path)
        assert (info.value.path, info.value.offset) == (str(wal), second)
        assert str(wal) in str(info.value) and f"offset {second}" in str(info.value)
        assert wal.read_bytes() == bytes(data)


async def test_a_corrupt_snapshot_is_refused(tmp_path: Path) -> None:
    store = EmbeddedStore.open(tmp_path, wal_bytes_max=1)
    try:
        await store.connect().put(b"/a", b"1")
    finally:
        await store.close()
    snapshot = tmp_path / "snapshot"
    data = bytearray(snapshot.read_bytes())
    data[-1] ^= 0x01
    snapshot.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match="snapshot") as info:
        EmbeddedStore.open(tmp_path)
    assert info.value.path == str(snapshot)


async def test_a_second_opener_is_refused_until_the_first_closes(tmp_path: Path) -> None:
    store = EmbeddedStore.open(tmp_path / "ks")
    try:
        await store.connect().put(b"/a", b"1")
        with pytest.raises(KeySpaceLockedError) as info:
            EmbeddedStore.open(tmp_path / "ks")
        assert str(tmp_path / "ks") in str(info.value)
        assert f"process {os.getpid()}" in str(info.value)
        assert (await store.connect().range(b"/a")).kvs[0].value == b"1"  # Undisturbed.
    finally:
        await store.close()
    store = EmbeddedStore.open(tmp_path / "ks")
    await store.close()


async def test_fsync_group_commits_concurrent_writes(tmp_path: Path) -> None:
    store = EmbeddedStore.open(tmp_path, fsync=True)
    try:
        assert store.directory is not None
        backend = store.connect()
        watch = backend.watch(b"/k/", b"/k0")
        first = asyncio.ensure_future(anext(watch))
        syncs = store.directory.syncs
        await backend.put(b"/one", b"")
        assert store.directory.syncs == syncs + 1  # Answered once synced.
        syncs += 1
        headers = await asyncio.gather(
            *(backend.put(f"/k/{i:03}".encode(), b"") for i in range(100))
        )
        assert sorted(h.revision for h in headers) == list(range(3, 103))
        # Every put waited for an fdatasync covering it, but they shared them.
        assert 1 <= store.directory.syncs - syncs < 100
        resp = await asyncio.wait_for(first, wait_s)
        assert resp.header.revision == 3
        await watch.aclose()
        before = await everything(backend)
        crashed = crash_copy(tmp_path, tmp_path.parent / f"{tmp_path.name}-crashed")
    finally:
        await store.close()
    reopened = EmbeddedStore.open(crashed)
    try:
        assert await everything(reopened.connect()) == before
    finally:
        await reopened.close()


async def test_an_unusable_directory_is_a_typed_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "keyspace").write_text("a file, not a directory")
    with pytest.raises(KeySpaceDirError, match=f"directory {tmp_path / 'keyspace'}: "):
        EmbeddedStore.open(tmp_path / "keyspace")
    assert (tmp_path / "keyspace").read_text() == "a file, not a directory"
