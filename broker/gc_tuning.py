"""Keep the garbage collector's full collections short in long-running processes.

A broker or consumer process holds a few hundred thousand long-lived objects once started
(imported modules, protobuf descriptors, gRPC and SQLAlchemy machinery). CPython's oldest
generation is collected by walking every tracked object, so each full collection paused the
event loop for ~100 ms under load (seen with bench_limits.py: one pause of 123 ms). Freezing
the heap once start-up is done moves those objects to a permanent generation that collections
skip; objects created later are collected as usual. (The cost: frozen garbage is never freed,
which is nothing for objects that live as long as the process.)
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect once, then freeze what survived; returns the number of frozen objects. Call when
    a process has finished starting (it may be called again after a later phase)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
