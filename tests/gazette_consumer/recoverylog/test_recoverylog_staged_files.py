"""StagedFiles (the player's local files): writes to more files than it keeps open, interleaved,
land byte for byte; background writebacks and the final syncs leave no descriptor open; a
staged file the FSM does not know is a typed error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.protocol.recorded_op_pb2 import RecordedOp
from gazette_consumer.recoverylog import staged_files
from gazette_consumer.recoverylog.fsm import FSM
from gazette_consumer.recoverylog.staged_files import (
    FNODES_DIR,
    OPEN_FILES_MAX,
    StagedFiles,
    StagingError,
)

LOG = "recovery/staged"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fsm_with(paths: list[str]) -> tuple[FSM, list[int]]:
    """An FSM in which each of `paths` is a live file (its fnodes, in order)."""
    fsm, fnodes = FSM(LOG), []
    for path in paths:
        op = RecordedOp(seq_no=fsm.next_seq_no, checksum=fsm.next_checksum, author=1)
        op.create.path = path
        fnodes.append(op.seq_no)
        fsm.apply(op, op.SerializeToString())
    return fsm, fnodes


async def test_interleaved_writes_to_more_files_than_kept_open(tmp_path: Path) -> None:
    files_count = OPEN_FILES_MAX + 5
    paths = [f"/dir-{i % 3}/file-{i}" for i in range(files_count)]
    fsm, fnodes = fsm_with(paths)
    before = open_fds()
    files = StagedFiles(tmp_path / "played", writeback_bytes=4096)  # Writebacks start, too.
    files.prepare()
    expected: dict[str, bytearray] = {path: bytearray() for path in paths}
    for fnode in fnodes:
        files.create(fnode)
    for round_ in range(3):
        for path, fnode in zip(paths, fnodes, strict=True):
            piece = os.urandom(1500 + round_)
            files.write(fnode, memoryview(piece), len(expected[path]))
            expected[path] += piece
    files.write(fnodes[0], b"REWRITTEN", 10)  # In place, as a WAL is not, but a file may be.
    expected[paths[0]][10:19] = b"REWRITTEN"
    assert open_fds() <= before + OPEN_FILES_MAX + staged_files.WRITEBACKS_IN_FLIGHT_MAX
    await files.make_live(fsm)
    files.close()

    assert open_fds() == before
    for path in paths:
        assert (tmp_path / "played" / path.lstrip("/")).read_bytes() == expected[path]
    assert not (tmp_path / "played" / FNODES_DIR).exists()


async def test_a_staged_file_the_fsm_does_not_know_is_a_staging_error(tmp_path: Path) -> None:
    fsm, fnodes = fsm_with(["/known"])
    files = StagedFiles(tmp_path / "played")
    files.prepare()
    files.create(fnodes[0])
    files.create(99)  # Never created in the FSM.
    with pytest.raises(StagingError, match=r"\['99'\]"):
        await files.make_live(fsm)
    files.close()
