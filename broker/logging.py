"""Process-wide structured logging, configured once.

Every entry point (``gazette``, ``gazctl``, ``gazette-consumer``, tests) calls ``configure()``;
later calls are no-ops unless ``force`` is set, so that libraries never fight over the global
logging configuration.

A log line that cannot be written (stderr is a file on a full disk, or a pipe whose reader
went away) is dropped, never raised into the code that logged it: a broker whose log disk
filled would otherwise fail every RPC that logs with an unexpected OSError (hiding the real
error it was logging, such as its spool's own ENOSPC), and its background loops with it. The
lines dropped are counted, and the next line written is preceded by one that says how many
were lost and why (stdlib logging's handlers already report and go on).
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Literal, TextIO

import structlog

Format = Literal["console", "json"]

_configured: tuple[Format, str] | None = None


class _Dropped:
    """Log lines that could not be written since the last one that could: how many, and the
    last error (shared by every logger of the process, under `lock`)."""

    lock = threading.Lock()
    count = 0
    error = ""


def dropped_log_lines() -> int:
    """Log lines dropped (not written) since the last line that was written."""
    return _Dropped.count


class SturdyPrintLogger(structlog.PrintLogger):
    """structlog's PrintLogger, but a line whose write fails (OSError: a full disk, a closed
    pipe; ValueError: a closed file) is dropped and counted, and the next line written is
    preceded by a note of what was dropped (see the module docstring)."""

    def msg(self, message: str) -> None:
        file = self._file
        with _Dropped.lock:
            try:
                if _Dropped.count:
                    note = f"log: {_Dropped.count} line(s) dropped, not written: {_Dropped.error}"
                    print(note, file=file, flush=True)
                    _Dropped.count, _Dropped.error = 0, ""
                print(message, file=file, flush=True)
            except (OSError, ValueError) as err:
                _Dropped.count += 1
                _Dropped.error = f"{type(err).__name__}: {err}"

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


class SturdyPrintLoggerFactory:
    """structlog's `logger_factory` of SturdyPrintLoggers writing to `file`."""

    def __init__(self, file: TextIO) -> None:
        self._file = file

    def __call__(self, *args: Any) -> SturdyPrintLogger:
        return SturdyPrintLogger(self._file)


def configure(fmt: Format = "console", level: str = "info", *, force: bool = False) -> None:
    """Route structlog and stdlib logging to stderr as console lines or JSON objects."""
    global _configured
    if _configured is not None and not force:
        return
    if fmt not in ("console", "json"):
        raise ValueError(f"log format: must be 'console' or 'json' (got {fmt!r})")
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"log level: unknown level {level!r}")

    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=SturdyPrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(
        level=numeric, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s", force=True
    )
    _configured = (fmt, level)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A logger bound to ``name`` (the module), usable before or after configure()."""
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger
