"""What durable spools cost: one Spool committing appends as a replica does, with its content
in an unlinked temporary file (a broker without --data-dir), in named files with a commit
record (--data-dir), and the same with fdatasync before each acknowledgement (--fsync).

    .venv/bin/python benchmarks/bench_spool_durability.py [--seconds 2] [--dir /path]

Each mode runs alternately, twice, for `--seconds` each, per append size; the figure is the
better of the two runs (wall clock; less exposed to a neighbour's burst on a shared machine).
`--dir` picks the file system (default: the temporary directory; fsync on tmpfs is free).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from broker.fragment.spool import CompletedSpool, LocalFragment, Spool
from broker.fragment.spool_dir import SpoolDir
from broker.fragment.spool_file import TempSpoolFile, unlink_durable
from broker.fragment.spool_types import FragmentFiles, ScratchFiles
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set

JOURNAL = "bench/spool"
REGISTERS = label_set([("owner", "bench")])
# Appends per fragment before it rolls (and its files are released, as after a persist).
ROLL_BYTES = 64 << 20


class _Sink:
    def on_commit(self, fragment: LocalFragment) -> None:
        pass

    def on_complete(self, completed: CompletedSpool) -> None:
        unlink_durable(completed.content_file)
        completed.content_file.close()


def run(new_files: Callable[[], FragmentFiles], directory: str, size: int, seconds: float) -> float:
    """Commits per second of `size`-byte appends."""
    spool = Spool(JOURNAL, _Sink(), new_file=lambda: TempSpoolFile(directory), files=new_files())
    data = b"x" * size
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        spool.apply_content(data, 0)
        spool.apply(pb.ReplicateRequest(proposal=spool.next(), registers=REGISTERS), False)
        count += 1
        if spool.content_length >= ROLL_BYTES:
            end = spool.fragment.end
            roll = pb.Fragment(journal=JOURNAL, begin=end, end=end, compression_codec=pb.NONE)
            spool.apply(pb.ReplicateRequest(proposal=roll, registers=REGISTERS), False)
    elapsed = time.perf_counter() - t0
    spool.close()
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--dir", default=None, help="file system to spool on")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        base = Path(tmp)
        durable = SpoolDir(base / "durable", fsync=False)
        synced = SpoolDir(base / "fsync", fsync=True)
        modes: dict[str, Callable[[], FragmentFiles]] = {
            # Today's default: unlinked temporary files, nothing recorded.
            "temp file (no --data-dir)": lambda: ScratchFiles(lambda: TempSpoolFile(tmp)),
            "--data-dir": lambda: durable.journal_files(JOURNAL),
            "--data-dir --fsync": lambda: synced.journal_files(JOURNAL),
        }
        print(f"spool on {tmp} ({args.seconds:g} s per run, best of 2):")
        for size in (1 << 10, 64 << 10, 1 << 20):
            best = dict.fromkeys(modes, 0.0)
            for _ in range(2):
                for name, files in modes.items():
                    best[name] = max(best[name], run(files, tmp, size, args.seconds))
            base_rate = best["temp file (no --data-dir)"]
            for name, rate in best.items():
                mb_s = rate * size / (1 << 20)
                print(
                    f"  {size >> 10:5d} KiB commits, {name:27s} {rate:9.0f} commits/s"
                    f"  {mb_s:8.1f} MB/s  {1e6 / rate:8.1f} us/commit"
                    f"  ({rate / base_rate:.2f}x)"
                )


if __name__ == "__main__":
    main()
