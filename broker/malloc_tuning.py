"""Process-wide tuning of glibc's allocator for a broker's large, short-lived buffers.

Every appended chunk passes through several buffers of its size (up to a MiB or more): the
gRPC message, the parsed protobuf, its content, the wire encoding to peers. glibc serves
allocations above its mmap threshold with fresh mappings and, as the heap's top shrinks, gives
memory back to the kernel: either way each chunk's buffers are page-faulted (and zeroed by the
kernel) anew, which costs about a third of a broker's CPU per appended MiB (see
docs/benchmarks.md). Raising the mmap threshold and the trim threshold keeps those buffers in
the heap and re-uses their pages.

The cost is memory held rather than returned: up to `trim_threshold_bytes` of freed heap. Call
once at process start (``gazette serve`` does); a no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Final

# Allocations below this are served from the heap (glibc's default is 128 KiB, rising
# dynamically to at most 32 MiB; setting it fixes it).
mmap_threshold_bytes: Final = 32 << 20
# Free heap memory at the top of the heap is returned to the kernel beyond this much.
trim_threshold_bytes: Final = 128 << 20

# mallopt() parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3


def tune_malloc() -> bool:
    """Apply the thresholds above. Returns whether glibc accepted them."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # Not glibc (no mallopt), or no C library to load.
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold_bytes)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_threshold_bytes)
    )
