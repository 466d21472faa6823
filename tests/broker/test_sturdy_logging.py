"""A log line that cannot be written is dropped and reported later, never raised into the code
that logged (broker/logging.py): a broker whose log disk filled, or whose log pipe closed, must
go on serving (tests/e2e/test_e2e_disk_full.py runs the first case with a real full disk)."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

import pytest
import structlog

from broker.logging import SturdyPrintLogger, dropped_log_lines


class FillingFile:
    """A text file (a real one) whose writes fail as on a full disk while `full` is set."""

    def __init__(self, path: Path) -> None:
        self.real = path.open("w")
        self.full = False

    def write(self, text: str) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real.write(text)

    def flush(self) -> None:
        self.real.flush()

    def close(self) -> None:
        self.real.close()


def test_lines_dropped_on_a_full_disk_are_counted_then_reported(tmp_path: Path) -> None:
    out = FillingFile(tmp_path / "log")
    logger = SturdyPrintLogger(out)  # type: ignore[arg-type]
    logger.info("first")
    out.full = True
    logger.warning("lost one")
    logger.error("lost two")
    assert dropped_log_lines() == 2
    out.full = False
    logger.info("after")
    assert dropped_log_lines() == 0
    out.close()
    lines = (tmp_path / "log").read_text().splitlines()
    assert lines == [
        "first",
        "log: 2 line(s) dropped, not written: OSError: [Errno 28] No space left on device",
        "after",
    ]


def test_a_closed_pipe_drops_lines_without_raising() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    pipe = os.fdopen(write_end, "w")
    try:
        SturdyPrintLogger(pipe).info("nobody reads this")
        assert dropped_log_lines() == 1
        with pytest.raises(BrokenPipeError):  # What structlog's own logger lets through.
            structlog.PrintLogger(pipe).info("nobody reads this either")
    finally:
        with contextlib.suppress(BrokenPipeError):  # Its buffer still holds the lines.
            pipe.close()
    # The dropped count is process-wide: a later line written reports it; leave none behind.
    with open(os.devnull, "w") as null:
        SturdyPrintLogger(null).info("reset")
    assert dropped_log_lines() == 0
