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
from collections.abc import Sequence
from dataclasses import dataclass, field

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
        """The progress line printed once the fault is dealt with."""
        status = "ok" if self.ok else f"FAILED ({len(self.findings)} finding(s))"
        parts = [
            f"fault {self.index:3d} {self.kind:<22} {self.target:<34}",
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


def _stats(values: list[float]) -> str:
    if not values:
        return f"{'-':>7} {'-':>7}"
    return f"{_fmt(percentile(values, 0.5)):>7} {_fmt(max(values)):>7}"


def summary(records: Sequence[FaultRecord]) -> str:
    """The table printed at the end: per fault kind, how many, how many failed, and p50/max
    of kill-to-append and kill-to-progress (the latter split by hot standby where both
    occur)."""
    header = (
        f"{'fault':<22} {'n':>3} {'failed':>6}   {'append p50':>7} {'max':>7}"
        f"   {'progress p50':>7} {'max':>7}   {'restored p50':>7} {'max':>7}"
    )
    lines = [header, "-" * len(header)]
    kinds: dict[str, list[FaultRecord]] = {}
    for r in records:
        kinds.setdefault(r.kind, []).append(r)
    for kind, rs in kinds.items():
        appends = [v for r in rs if (v := r.worst_append_s()) is not None]
        restored = [r.restored_s if r.restored_s is not None else math.inf for r in rs]
        failed = sum(1 for r in rs if not r.ok)
        groups: dict[str, list[float]] = {}
        for r in rs:
            for shard, value in r.progress_s.items():
                label = "standby" if r.standby.get(shard) else "no standby"
                groups.setdefault(label, []).append(math.inf if value is None else value)
        everything = [v for values in groups.values() for v in values]
        rows = list(groups.items()) if len(groups) > 1 else [("", everything)]
        for i, (label, progress) in enumerate(rows):
            name = kind if i == 0 else ""
            tag = f" ({label})" if label else ""
            n = f"{len(rs):>3}" if i == 0 else "   "
            f = f"{failed:>6}" if i == 0 else "      "
            a = _stats(appends) if i == 0 else f"{'':>7} {'':>7}"
            d = _stats(restored) if i == 0 else f"{'':>7} {'':>7}"
            lines.append(f"{name:<22} {n} {f}   {a}   {_stats(progress)}   {d}{tag}".rstrip())
    return "\n".join(lines)
