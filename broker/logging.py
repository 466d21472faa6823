"""Process-wide structured logging, configured once.

Every entry point (``gazette``, ``gazctl``, ``gazette-consumer``, tests) calls ``configure()``;
later calls are no-ops unless ``force`` is set, so that libraries never fight over the global
logging configuration.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

Format = Literal["console", "json"]

_configured: tuple[Format, str] | None = None


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
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
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
