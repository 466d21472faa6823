"""What a soak records per fault, the line it prints for each, and the summary table at the end.

A `FaultRecord` holds, for one injected fault, how long appends were impossible per journal
(kill-to-first-successful-append) and how long each shard made no progress (kill-to-first sum
verified for a stream that ended after the fault), whether each such shard had a hot standby,
how long the whole stack took to be back as specified, notes (processes restarted, shards
unassigned), and the findings (violations and unrecovered faults). `summary` aggregates the
records per fault kind: counts, p50 and max of the recovery times.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from examples.stream_sum.verifier import Finding

__all__ = ["FaultRecord", "one_line", "percentile", "summary"]


@dataclass
class FaultRecord:
    index: int
    kind: str
    target: str = ""
    started_at: float = 0.0  # Monotonic.
    # Seconds from the fault to the first successful append, per journal (None: none in time).
    append_s: dict[str, float | None] = field(default_factory=dict)
    # Seconds from the fault to the shard's first verified sum of a stream ended after it.
    progress_s: dict[str, float | None] = field(default_factory=dict)
    # Shards whose progress was measured with a hot standby ready to take over.
    standby: dict[str, bool] = field(default_factory=dict)
    # The replication of each journal whose appends were measured: journals of replication 2
    # fail over when a broker dies, those of replication 3 (on three brokers) wait for it.
    replication: dict[str, int] = field(default_factory=dict)
    # Quorum journals whose leader the fault took away: seconds from the fault to the first
    # append a leader served again (None: none in time).
    leader_s: dict[str, float | None] = field(default_factory=dict)
    # Quorum journals appended to while a follower was stopped: the longest single append.
    stall_s: dict[str, float] = field(default_factory=dict)
    # Seconds from the fault until every process, journal and shard was back as specified.
    restored_s: float | None = None
    notes: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def worst_append_s(self) -> float | None:
        return _worst(self.append_s.values())

    def worst_progress_s(self) -> float | None:
        return _worst(self.progress_s.values())

    def line(self) -> str:
        """The progress line printed once the fault is dealt with (with the wall-clock time
        of the fault, UTC, to find it in the processes' logs)."""
        status = "ok" if self.ok else f"FAILED ({len(self.findings)} finding(s))"
        wall = time.time() - (time.monotonic() - self.started_at)
        at = time.strftime("%H:%M:%S", time.gmtime(wall))
        parts = [
            f"fault {self.index:3d} {at} {self.kind:<22} {self.target:<34}",
            f"append {_fmt(self.worst_append_s())}",
            f"progress {_fmt(self.worst_progress_s())}",
            f"restored {_fmt(self.restored_s)}",
            status,
        ]
        out = "  ".join(parts)
        for note in self.notes:
            out += f"\n      note: {one_line(note)}"
        for finding in self.findings:
            out += f"\n      {one_line(str(finding))}"
        return out


# A finding or note is printed on one line of at most this many characters.
line_chars_max = 600


def one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= line_chars_max else flat[: line_chars_max - 3] + "..."


def _worst(values: object) -> float | None:
    """The largest time, or inf if any measurement never succeeded; None if nothing was
    measured."""
    items = list(values)  # type: ignore[call-overload]
    if not items:
        return None
    if any(v is None for v in items):
        return math.inf
    return max(items)


def _fmt(value: float | None) -> str:
    if value is None:
        return "   -  "
    if math.isinf(value):
        return " never"
    return f"{value:5.1f}s"


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of `values` by nearest rank (inf counts as the largest)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(0, math.ceil(q * len(ordered)) - 1)
    return ordered[rank]


def _stats(values: Sequence[float]) -> str:
    """``p50 / max`` of `values`, or ``-``."""
    if not values:
        return "-"
    return f"{_fmt(percentile(values, 0.5)).strip()} / {_fmt(max(values)).strip()}"


# Columns of the summary: (heading, width).
_COLUMNS: Final = (
    ("append R=2", 15),
    ("append R=3", 15),
    ("progress (standby)", 19),
    ("progress (none)", 16),
    ("restored", 15),
    ("leader (quorum)", 16),
    ("stall (quorum)", 15),
)


def summary(records: Sequence[FaultRecord]) -> str:
    """The table printed at the end: per fault kind, how many, how many failed, and p50 / max
    of kill-to-append (the worst journal of each fault, by replication), kill-to-progress (the
    worst shard of each fault, with and without a hot standby), everything restored, and on
    quorum journals kill-to-leader (a new leader serving appends) and the longest append with
    a follower stopped."""
    header = f"{'fault':<22} {'n':>3} {'failed':>6}" + "".join(
        f"  {name:>{width}}" for name, width in _COLUMNS
    )
    lines = [
        header,
        "-" * len(header),
        f"{'':<33}" + "".join(f"  {'p50 / max':>{width}}" for _, width in _COLUMNS),
    ]
    kinds: dict[str, list[FaultRecord]] = {}
    for r in records:
        kinds.setdefault(r.kind, []).append(r)
    for kind, rs in kinds.items():
        cells = [
            _stats(_worst_each(rs, lambda r: _by_replication(r, 2))),
            _stats(_worst_each(rs, lambda r: _by_replication(r, 3))),
            _stats(_worst_each(rs, lambda r: _progress(r, standby=True))),
            _stats(_worst_each(rs, lambda r: _progress(r, standby=False))),
            _stats([r.restored_s if r.restored_s is not None else math.inf for r in rs]),
            _stats(_worst_each(rs, lambda r: list(r.leader_s.values()))),
            _stats(_worst_each(rs, lambda r: list(r.stall_s.values()))),
        ]
        failed = sum(1 for r in rs if not r.ok)
        row = f"{kind:<22} {len(rs):>3} {failed:>6}" + "".join(
            f"  {cell:>{width}}" for cell, (_, width) in zip(cells, _COLUMNS, strict=True)
        )
        lines.append(row)
    return "\n".join(lines)


def _by_replication(record: FaultRecord, replication: int) -> list[float | None]:
    return [
        v
        for journal, v in record.append_s.items()
        if record.replication.get(journal, 0) == replication
    ]


def _progress(record: FaultRecord, *, standby: bool) -> list[float | None]:
    return [
        v for shard, v in record.progress_s.items() if record.standby.get(shard, False) == standby
    ]


def _worst_each(
    records: Sequence[FaultRecord], values: Callable[[FaultRecord], list[float | None]]
) -> list[float]:
    """Per record, its worst value (inf if one never came), for records that measured any."""
    out = []
    for r in records:
        worst = _worst(values(r))
        if worst is not None:
            out.append(worst)
    return out
