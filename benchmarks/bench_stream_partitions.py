"""A streaming micro-batch's partitions, timed in one process without Spark: the stream reader's
`initialOffset`, `latestOffset` and `partitions` (the driver's part), then each partition's
`read()` in turn (an executor's), to its first record batch and to its end.

The journal is bench_spark.py's shape: two transactions of N/2 messages each, interleaved,
their ACKs at its end (two writer tasks committing together), in 1 MiB fragments persisted to a
file:// store. Its rows are ~200 bytes of JSON. What it shows is when a partition hands out its
first rows (before or after it has read the ACKs), which no Spark figure isolates.

Usage: bench_stream_partitions.py [rows] [runs] [--profile] [--tune-malloc]

Each partition's CPU time (user and system, and its minor page faults: fresh memory costs
system time) is printed beside its wall time. With --profile, the
last run's partitions are read under cProfile, and the functions taking most time are listed.
With --tune-malloc, glibc's thresholds are raised as a broker's are (broker/malloc_tuning.py):
what fresh pages still cost the partitions (little, 2026-11-27: json_lines reuses its buffer).
"""

from __future__ import annotations

import cProfile
import pstats
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_spark import wait_persisted  # noqa: E402
from gazette_consumer.message.uuid import Flag, build_uuid  # noqa: E402
from tests.broker.serve_testkit import gazette_serve  # noqa: E402
from tests.spark_integration.spark_testkit import (  # noqa: E402
    ACK,
    CONTINUE,
    append_raw,
    as_producer_id,
    producer,
)
from tests.spark_integration.test_range_split import (  # noqa: E402
    create_small_fragment_journal,
)

rows_default = 400_000
runs_default = 3
# Messages per append while writing the journal (each append is one request): ~1 MB, so that
# fragments are ~1 MiB as bench_spark's (a fragment holds whole appends).
append_messages_max = 4_000
# Functions listed by --profile.
profile_lines = 30


class _Row(msgspec.Struct):
    """A row of bench_spark.py's frame, encoded as its batch write encodes it (arrow_json.py:
    compact, the UUID last), so that scans read the UUIDs from the lines' tails as there."""

    id: int
    user: str
    text: str
    UUID: str


def line(producer_id: bytes, clock: int, flags: Flag, fields: dict[str, Any] | None) -> bytes:
    uuid = str(build_uuid(as_producer_id(producer_id), clock, flags))
    if fields is None:
        return b'{"UUID":"%s"}\n' % uuid.encode()
    return msgspec.json.encode(_Row(**fields, UUID=uuid)) + b"\n"


def write_journal(broker: str, journal: str, n: int) -> None:
    p1, p2 = producer(), producer()
    text = "x" * 150
    lines = []
    for i in range(n):
        p = p1 if i % 2 == 0 else p2
        lines.append(line(p, 1 + i, CONTINUE, {"id": i, "user": f"user-{i % 1000}", "text": text}))
    for lo in range(0, n, append_messages_max):
        append_raw(broker, journal, b"".join(lines[lo : lo + append_messages_max]))
    append_raw(broker, journal, line(p1, n + 1, ACK, None) + line(p2, n + 2, ACK, None))


def run_once(broker: str, journal: str, n: int, profile: bool = False) -> None:
    from spark_integration import GazetteDataSource

    source = GazetteDataSource({"broker": broker, "journals": journal})
    t0 = time.perf_counter()
    reader = source.streamReader(source.schema())
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    parts = reader.partitions(start, end)
    t_plan = time.perf_counter() - t0
    line = [f"plan {t_plan:5.2f} s, {len(parts)} partitions:"]
    rows = 0
    profiler = cProfile.Profile() if profile else None
    for part in parts:
        t, use = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        own = time.thread_time()  # The event loop's thread (the rest: fragment loads, SHA1).
        first = None
        if profiler is not None:
            profiler.enable()
        for batch in reader.read(part):
            if first is None and batch.num_rows:
                first = time.perf_counter() - t
            rows += batch.num_rows
        if profiler is not None:
            profiler.disable()
        total, used = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
        user, system = used.ru_utime - use.ru_utime, used.ru_stime - use.ru_stime
        own = time.thread_time() - own
        faults = used.ru_minflt - use.ru_minflt
        first_s = "none" if first is None else f"{first:5.2f} s"
        line.append(
            f"[{part.begin}, {part.end}) first rows {first_s}, all {total:5.2f} s"
            f" (CPU {user + system:5.2f} s: user {user:4.2f}, sys {system:4.2f}, loop {own:4.2f};"
            f" {faults} page faults);"
        )
    assert rows == n, f"{rows} rows read, not {n}"
    print(" ".join(line), flush=True)
    if profiler is not None:
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(profile_lines)
        stats.sort_stats("cumulative").print_stats(profile_lines)


def main() -> None:
    if "--tune-malloc" in sys.argv[1:]:
        from broker.malloc_tuning import tune_malloc

        tune_malloc()
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    profile = "--profile" in sys.argv[1:]
    n = int(args[0]) if args else rows_default
    runs = int(args[1]) if len(args) > 1 else runs_default
    with tempfile.TemporaryDirectory() as tmp, gazette_serve(Path(tmp)) as (port, _proc):
        broker = f"127.0.0.1:{port}"
        journal = "bench/stream-partitions"
        (Path(tmp) / "frag").mkdir()
        create_small_fragment_journal(broker, journal, 1 << 20, ("file:///frag/",))
        write_journal(broker, journal, n)
        print(f"rows={n}; {wait_persisted(broker, journal)} fragments persisted", flush=True)
        for i in range(runs):
            run_once(broker, journal, n, profile=profile and i == runs - 1)


if __name__ == "__main__":
    main()
