"""Pipeline.scatter_content: large chunks are written to the primary's spool on a worker
thread. The worker owns the spool until it is done, so a cancelled append waits for it; a write
that fails becomes the pipeline's send error and leaves the spool unchanged; and content lands
in the spool exactly as the synchronous path puts it there."""

from __future__ import annotations

import asyncio
import hashlib
import threading

import pytest

from broker.fragment.spool import CompletedSpool, LocalFragment, Spool
from broker.fragment.spool_file import BytesLike, MemorySpoolFile
from broker.pipeline import Pipeline, local_offload_bytes_min
from broker.protocol import protocol_pb2 as pb
from broker.replica import Slot

J = "pipeline/content"
BIG = bytes(range(256)) * (2 * local_offload_bytes_min // 256)


class _Sink:
    def on_commit(self, fragment: LocalFragment) -> None:
        pass

    def on_complete(self, completed: CompletedSpool) -> None:
        pass


class GatedSpoolFile(MemorySpoolFile):
    """A memory spool file whose writes wait for `release`: a disk that is slow on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def pwrite(self, data: BytesLike, offset: int) -> None:
        self.entered.set()
        if not self.release.wait(timeout=30.0):
            raise AssertionError("gated write never released")
        super().pwrite(data, offset)


def solo_pipeline(spool: Spool) -> Pipeline:
    """A pipeline of a route with only the primary: no peers, only the local spool."""
    member = pb.ProcessSpec.ID(zone="z", suffix="primary")
    header = pb.Header(
        process_id=member, route=pb.Route(members=[member], primary=0, endpoints=["http://x:1"])
    )
    # The worker-thread path under test is taken by default only with peers to send to.
    return Pipeline(header, spool, Slot("spool", spool), local_offload=True)


@pytest.mark.parametrize("size", [local_offload_bytes_min - 1, local_offload_bytes_min, len(BIG)])
async def test_content_reaches_the_spool_and_the_appends_sum(size: int) -> None:
    spool = Spool(J, _Sink(), new_file=MemorySpoolFile)
    pln = solo_pipeline(spool)
    summer = hashlib.sha1()
    await pln.scatter_content(BIG[:size], 0, also_hash=summer)
    await pln.scatter_content(b"tail", size, also_hash=summer)
    assert pln.send_err() is None
    assert spool.delta == size + 4
    assert summer.digest() == hashlib.sha1(BIG[:size] + b"tail").digest()
    spool.apply(pb.ReplicateRequest(proposal=spool.next(), registers=spool.registers), True)
    local = spool.local_fragment
    assert local is not None and local.file.pread(size + 4, 0) == BIG[:size] + b"tail"


async def test_a_cancelled_scatter_waits_for_the_worker_that_holds_the_spool() -> None:
    file = GatedSpoolFile()
    spool = Spool(J, _Sink(), new_file=lambda: file)
    pln = solo_pipeline(spool)
    task = asyncio.create_task(pln.scatter_content(BIG, 0))
    assert await asyncio.to_thread(file.entered.wait, 30.0)  # The worker is writing.
    task.cancel()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()  # Cancelled, yet still waiting: the worker owns the spool.
    file.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The worker finished its write before anyone else could touch the spool: it is counted.
    assert spool.delta == len(BIG)


async def test_a_failed_local_write_is_the_pipelines_send_error_and_changes_nothing() -> None:
    spool = Spool(J, _Sink(), new_file=lambda: MemorySpoolFile(bytes_max=len(BIG) - 1))
    pln = solo_pipeline(spool)
    await pln.scatter_content(BIG, 0)
    err = pln.send_err()
    assert err is not None and "memory spool file would hold" in str(err)
    assert spool.delta == 0
