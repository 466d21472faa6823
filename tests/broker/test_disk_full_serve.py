"""A `gazette serve` process whose disk fills up (a real tmpfs of a few MiB, mounted for the
test, holding its spools, its embedded keyspace and its log, as one disk often holds all
three; its fragment store is elsewhere): the append that does not fit fails with a typed, retryable error that names the cause
(UNAVAILABLE, "No space left on device"), not an unexpected one; no acknowledged byte is lost
and no unacknowledged byte becomes readable; once space returns, appends continue at the
acknowledged end without a restart; the log lines the full disk swallowed are reported in the
log once it can be written; and after kill -9 and a restart, the journal reads back exactly
what was acknowledged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from broker.client.appender import append, attempts_max_default
from broker.client.list_apply import apply_journals, list_journals, upsert
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from tests.broker.serve_testkit import gazette_serve, stop_timeout_s
from tests.broker.test_spool_recovery_serve import kill9, read_exactly
from tests.small_disk import fill, resize, small_disk

JOURNAL = "full/disk"
OTHER = "full/after"
KEYSPACE_PREFIX = "full/keyspace-"
KEYSPACE_CHANGES_MAX = 64
DISK_BYTES = 8 << 20
DISK_BYTES_AFTER = 64 << 20
APPEND_BYTES = 256 << 10
# More appends than the disk can take: the loop ends at the first refused one.
APPENDS_MAX = 2 * DISK_BYTES // APPEND_BYTES
# Refused appends once the disk is filled to the last byte: the broker logs each (~150 bytes),
# more than the page its log file already holds can take, so its log loses lines too.
REFUSED_FULL = 64


def spec(name: str) -> pb.JournalSpec:
    """A journal whose fragments roll only as a journal's first append does (Gazette rolls
    that one at once), persisted to a store off the full disk: the spool holds the rest."""
    return pb.JournalSpec(
        name=name,
        replication=1,
        fragment=pb.JournalSpec.Fragment(
            length=1 << 30,
            compression_codec=pb.NONE,
            stores=["file:///"],
            refresh_interval=Duration(seconds=30),
            flush_interval=Duration(seconds=3600),
        ),
    )


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_disk(tmp_path / "disk", DISK_BYTES) as path:
        yield path


async def test_a_full_disk_refuses_appends_with_a_typed_error_and_loses_nothing(
    disk: Path,
) -> None:
    acked = bytearray()
    store = disk.parent / "store"
    store.mkdir()
    with gazette_serve(disk, "--file-root", str(store)) as (port, proc):
        client = JournalClient(f"http://127.0.0.1:{port}")
        try:
            await apply_journals(client, [upsert(spec(JOURNAL))])
            refused: grpc.aio.AioRpcError | None = None
            for i in range(APPENDS_MAX):
                data = bytes([65 + i % 26]) * APPEND_BYTES
                # Retried only while the new journal may still be without a primary: a
                # refusal is not retried, to be seen as it is.
                attempts = 1 if acked else attempts_max_default
                try:
                    resp = await append(
                        client, pb.AppendRequest(journal=JOURNAL), data, attempts_max=attempts
                    )
                except grpc.aio.AioRpcError as err:
                    refused = err
                    break
                assert (resp.commit.begin, resp.commit.end) == (len(acked), len(acked) + len(data))
                acked += data
            assert refused is not None, f"{APPENDS_MAX} appends of {APPEND_BYTES} all fit"
            assert len(acked) >= DISK_BYTES // 2, f"refused after only {len(acked)} bytes"
            # Typed and retryable, naming the cause.
            assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused
            assert "No space left on device" in (refused.details() or ""), refused
            # With no byte left for its log either: still that error, not an unexpected one
            # from the broker's log failing as each refusal is logged.
            filler = fill(disk)
            for _ in range(REFUSED_FULL):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    # Larger than the refused one, which left its partial write in the spool
                    # file's pages (rewritten in place by the next append at the same offset).
                    await append(
                        client,
                        pb.AppendRequest(journal=JOURNAL),
                        b"x" * (2 * APPEND_BYTES),
                        attempts_max=1,
                    )
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value
                assert "No space left on device" in (caught.value.details() or "")

            filler.unlink()
            resize(disk, DISK_BYTES_AFTER)
            # Without a restart: the next append lands at the acknowledged end, so nothing of
            # the refused one was committed.
            resp = await append(client, pb.AppendRequest(journal=JOURNAL), b"after\n")
            assert resp.commit.begin == len(acked)
            acked += b"after\n"
            assert await read_exactly(client, len(acked), JOURNAL) == bytes(acked)
            # Something the broker logs (a replica starting) once its log can be written.
            await apply_journals(client, [upsert(spec(OTHER))])
            resp = await append(client, pb.AppendRequest(journal=OTHER), b"other\n")
            assert resp.commit.begin == 0
            kill9(proc)
        finally:
            await client.close()
        log = (disk / "broker.log").read_text(errors="replace")
        assert "line(s) dropped, not written: OSError: [Errno 28]" in log, log[-4000:]

    with gazette_serve(disk, "--file-root", str(store)) as (port, proc):
        client = JournalClient(f"http://127.0.0.1:{port}")
        try:
            assert await read_exactly(client, len(acked), JOURNAL) == bytes(acked)
            resp = await append(client, pb.AppendRequest(journal=JOURNAL), b"restarted\n")
            assert resp.commit.begin == len(acked)
            resp = await append(client, pb.AppendRequest(journal=OTHER), b"again\n")
            assert resp.commit.begin == len(b"other\n")
        finally:
            await client.close()


async def test_a_keyspace_change_on_a_full_disk_is_refused_and_the_broker_stops(
    disk: Path,
) -> None:
    """The embedded keyspace's write-ahead log on the full disk: a change it cannot log is
    refused with UNAVAILABLE naming the cause (not INVALID_ARGUMENT: the request was fine), and
    the broker stops (fail-stop, as etcd does when its log cannot be written: memory may hold a
    change the disk does not). Restarted with room, it holds exactly the changes it
    acknowledged, and the journals' acknowledged content."""
    store, logs = disk.parent / "store", disk.parent / "logs"
    store.mkdir()
    logs.mkdir()
    applied: list[str] = []
    # Its log elsewhere this time, to read why it stopped.
    serve_args = ("--data-dir", str(disk), "--file-root", str(store))
    with gazette_serve(logs, *serve_args) as (port, proc):
        client = JournalClient(f"http://127.0.0.1:{port}")
        try:
            await apply_journals(client, [upsert(spec(JOURNAL))])
            resp = await append(client, pb.AppendRequest(journal=JOURNAL), b"before\n")
            assert resp.commit.end == len(b"before\n")
            fill(disk)
            # Changes fit into the log file's last page for a while; then one is refused.
            refused: grpc.aio.AioRpcError | None = None
            for i in range(KEYSPACE_CHANGES_MAX):
                name = f"{KEYSPACE_PREFIX}{i}"
                try:
                    await apply_journals(client, [upsert(spec(name))])
                except grpc.aio.AioRpcError as err:
                    refused = err
                    break
                applied.append(name)
            assert refused is not None, f"{KEYSPACE_CHANGES_MAX} keyspace changes fit"
            # Refused as UNAVAILABLE by the keyspace itself; or, when a write of the broker's own
            # (a lease, an assignment) met the full disk first, the broker stops at once and the
            # Apply still in flight ends as gRPC's core ends every call of a stopping server:
            # CANCELLED, which our clients retry as they do UNAVAILABLE (appender.py,
            # shard_retry.py). Either way the change is not kept (checked after the restart).
            assert refused.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.CANCELLED,
            ), refused
            assert proc.wait(timeout=stop_timeout_s) == 1
        finally:
            await client.close()
    # It says why, and what to do, as its last words (not a traceback).
    logged = (logs / "broker.log").read_text()
    last = logged.strip().splitlines()[-1]
    assert last.startswith("gazette serve: embedded keyspace"), last
    assert "No space left on device" in last and "restart the process" in last, last
    assert "Traceback" not in logged  # The components it stops say why, without one either.

    (disk / "filler").unlink()
    with gazette_serve(logs, *serve_args) as (port, proc):
        client = JournalClient(f"http://127.0.0.1:{port}")
        try:
            listed = await list_journals(client)
            names = {j.spec.name for j in listed.journals}
            assert names == {JOURNAL, *applied}, sorted(names)
            assert await read_exactly(client, len(b"before\n"), JOURNAL) == b"before\n"
            resp = await append(client, pb.AppendRequest(journal=JOURNAL), b"after\n")
            assert resp.commit.begin == len(b"before\n")
        finally:
            await client.close()
