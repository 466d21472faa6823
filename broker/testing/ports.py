"""Loopback ports for test servers: any free one now, or one kept across restarts.

``free_port`` asks the kernel for a free port (from its ephemeral range): right for a server
started once, though another process may take the port before the server binds it (callers
retry a start with a new one). ``reserve_port`` draws a free port *below* the ephemeral range,
so that no outgoing connection takes it as its local port while its server is down: right for a
server restarted on the same address (a broker behind a fixed address, a database).
"""

from __future__ import annotations

import random
import socket
from typing import Final

# Ports handed out by `reserve_port` are drawn below the kernel's ephemeral range (from which
# outgoing connections take their local ports), at or above this.
reserved_port_min: Final = 10000
# Random ports tried by `reserve_port` before it gives up.
reserve_port_attempts_max: Final = 200


class PortError(RuntimeError):
    """No free port could be found."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free now (it may be taken before it is bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def reserve_port(host: str = "127.0.0.1") -> int:
    """A port that is free now, drawn at random below the kernel's ephemeral port range (so
    that no outgoing connection takes it as its local port while its server is down)."""
    low = _ephemeral_port_min()
    for _ in range(reserve_port_attempts_max):
        port = random.randrange(reserved_port_min, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise PortError(
        f"no free port in [{reserved_port_min}, {low}) after {reserve_port_attempts_max} tries"
    )


def _ephemeral_port_min() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default.
