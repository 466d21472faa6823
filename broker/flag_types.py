"""argparse types of flags the commands share (``gazette serve``, ``gazette-consumer serve``,
``gazctl``): a bad value is refused while the command line is parsed, as argparse refuses any
malformed flag (usage, one line naming the flag, exit status 2), before anything starts.

- ``port``: a TCP port, [0, 65535] (0: any free port). Larger values would otherwise be taken
  modulo 65536 by the socket layer, or fail deep in gRPC's bind with a traceback.
- ``log_level``: a level ``broker.logging.configure`` accepts (debug, info, warning, error,
  critical; any case).
"""

from __future__ import annotations

import argparse
import logging
from typing import Final

PORT_MAX: Final = 65535
LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical")


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number (got {text!r})") from None
    if not 0 <= value <= PORT_MAX:
        raise argparse.ArgumentTypeError(f"must be in [0, {PORT_MAX}] (got {value})")
    return value


def log_level(text: str) -> str:
    # The rule of broker.logging.configure: a level name stdlib logging knows.
    if not isinstance(logging.getLevelName(text.upper()), int):
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(LOG_LEVELS)} (got {text!r})")
    return text
