"""What a process's readers skipped: offset jumps, counted per journal.

A read whose answer starts beyond the offset it asked for (an *offset jump*: the content in
between was removed by retention, or lost, or a read of a hole that the broker gave up waiting
on) follows it, as Gazette's reader does: whatever lay between is gone for this reader, and
nothing but these counters and a WARNING says so. (Not counted: a read from offset 0, which
starts at the journal's first content wherever retention left it, and a metadata-only read,
a probe of the write head.) Consumers, library users and the Spark source's planning all read
through `Reader` (reader.py), so a process exports:

- ``gazette_client_read_offset_jumps_total{journal}``: offset jumps followed;
- ``gazette_client_read_skipped_bytes_total{journal}``: the bytes they went past.

One series per journal a process has seen jump (never more than it reads).
"""

from __future__ import annotations

from typing import Final

from prometheus_client import Counter

READ_OFFSET_JUMPS: Final = Counter(
    "gazette_client_read_offset_jumps_total",
    "Reads that went on past content missing from the journal (an offset jump), by journal.",
    ["journal"],
)
READ_SKIPPED_BYTES: Final = Counter(
    "gazette_client_read_skipped_bytes_total",
    "Journal bytes reads went past at offset jumps (removed or lost content), by journal.",
    ["journal"],
)


def count_jump(journal: str, skipped: int) -> None:
    READ_OFFSET_JUMPS.labels(journal).inc()
    READ_SKIPPED_BYTES.labels(journal).inc(skipped)
