"""`make demo` (``python -m gazette_consumer.demo``): the exactly-once counting pipeline on the
embedded default, run twice on one data directory as a newcomer would; and the verdict's check,
which must name every way the observed result can differ from what was committed."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from uuid import uuid1

import msgspec
import sqlalchemy as sa
import zstandard

from examples.counter import Counted, read_counts
from gazette_consumer.demo import (
    COMMITTED_MESSAGES,
    DUPLICATE_EVERY,
    INPUTS,
    SHARDS,
    TRANSACTIONS,
    check,
)

REPO = Path(__file__).resolve().parents[2]
run_timeout_s = 90.0  # Bound of one run; the demo itself bounds each of its waits.

COMMITTED = COMMITTED_MESSAGES + sum(n for n, acknowledged in TRANSACTIONS if acknowledged)
WRITTEN = COMMITTED_MESSAGES + sum(n for n, _ in TRANSACTIONS)  # Before duplicates.
DUPLICATES = COMMITTED_MESSAGES // DUPLICATE_EVERY


def run_demo(data_dir: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "gazette_consumer.demo", "--data-dir", str(data_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=run_timeout_s,
        check=False,
    )
    assert done.returncode == 0, f"demo exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def store_counts(data_dir: Path) -> Counter[str]:
    """The counts the shards committed, read from their SQLite files (not from the demo's
    output)."""
    out: Counter[str] = Counter()
    for shard in SHARDS:
        engine = sa.create_engine(f"sqlite:///{data_dir / 'db' / f'{shard}.sqlite'}")
        try:
            counts = read_counts(engine, shard)
        finally:
            engine.dispose()
        assert counts, f"shard {shard} counted nothing"
        out.update(counts)
    return out


class Frame(msgspec.Struct):
    UUID: str
    key: str = ""


def input_frames(data_dir: Path) -> list[Frame]:
    """Every message frame of the input journals, from their persisted fragment files
    (read-uncommitted: duplicates and rolled-back messages included, ACKs left out)."""
    frames = []
    for journal in INPUTS:
        for path in sorted((data_dir / "fragments" / journal).glob("*.zst")):
            with zstandard.ZstdDecompressor().stream_reader(path.open("rb")) as reader:
                content = reader.read()
            for line in content.splitlines():
                frame = msgspec.json.decode(line, type=Frame)
                if frame.key:  # ACKs are Count() with no key.
                    frames.append(frame)
    return frames


def test_demo_counts_exactly_once_and_a_second_run_continues(tmp_path: Path) -> None:
    first = run_demo(tmp_path)
    assert "exactly-once: OK" in first
    assert f"=> {COMMITTED} must count, each once" in first
    counts = store_counts(tmp_path)
    assert sum(counts.values()) == COMMITTED
    # The input really held the duplicates and the rolled-back transaction.
    # (A retry of an append whose response was lost would add more copies, never fewer.)
    frames = input_frames(tmp_path)
    assert len(frames) >= WRITTEN + DUPLICATES
    assert len({f.UUID for f in frames}) == WRITTEN

    second = run_demo(tmp_path)
    assert "continuing an earlier run: " in second
    assert "exactly-once: OK" in second
    assert f"{COMMITTED} this run, {2 * COMMITTED} in all" in second
    # Every run publishes the same workload: each key's count grew by exactly one run's worth.
    assert store_counts(tmp_path) == Counter({key: 2 * n for key, n in counts.items()})
    assert len({f.UUID for f in input_frames(tmp_path)}) == 2 * WRITTEN


def test_the_verdict_names_each_difference() -> None:
    a, b, gone = uuid1(), uuid1(), uuid1()
    before = {"s": Counter({"k": 1})}
    after = {"s": Counter({"k": 3})}
    old = Counted(key="k", total=1, source=str(uuid1()))  # An earlier run's.
    derived = [
        old,
        Counted(key="k", total=2, source=str(a)),
        Counted(key="k", total=3, source=str(b)),
    ]
    expected = {"k": 2}

    def problems(
        expected: dict[str, int] = expected, derived: list[Counted] = derived
    ) -> list[str]:
        return check(expected, {a, b}, {gone}, before, after, derived)

    assert problems() == []
    assert problems(expected={"k": 3}) == ["counts grew by {'k': 2}, not by the {'k': 3} committed"]
    twice = [*derived, derived[-1]]
    assert problems(derived=twice) == [
        "k: derived totals are not 1, 2, ..., 3, each once",
        "1 derived messages came twice",
    ]
    assert problems(derived=derived[:2]) == [
        "k: derived totals are not 1, 2, ..., 3, each once",
        "1 committed messages of this run were not derived",
    ]
    rolled = [*derived[:2], Counted(key="k", total=3, source=str(gone))]
    assert problems(derived=rolled) == [
        "1 committed messages of this run were not derived",
        "1 derived messages came from rolled-back input",
    ]
