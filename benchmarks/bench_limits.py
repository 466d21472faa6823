"""Acceptance benchmark of the request limits: a broker serving a journal at the limits (the most
labels, of the longest values, and as many registers) answers List and unrelated appends within
10 ms of its unloaded latency.

    .venv/bin/python benchmarks/bench_limits.py [--samples 200] [--traffic-rps 10]

One ``gazette serve`` process (embedded keyspace) is the broker. This process measures, one
request at a time: a List of one small journal by name, a List of every journal, and 1 KiB
appends to an unrelated journal. Three phases, printed side by side (p50 and p99, ms):

- unloaded: the broker serves only small journals;
- loaded: it also serves the journal at the limits (labels_per_set_max labels of
  LABEL_VALUE_LEN_MAX-byte values, about 1 MiB of spec), whose registers were set to
  labels_per_set_max labels as large; every "List (every journal)" now carries that spec. This
  is the acceptance criterion: p99 within 10 ms of unloaded;
- loaded + traffic: as loaded, while a second process sends, at --traffic-rps each, Lists of
  every journal and appends to the journal at the limits that check and unite registers at the
  limits (about 2 MiB per append request). That work competes with the measured requests for
  the broker's one event loop: the figures show how long its steps are. (The traffic runs in a
  process of its own so that decoding its responses does not count here; on a machine with
  fewer free cores than processes, they also compete for CPU.)

Before the limits and the near-linear label operations, the same journal (at 10,000 labels,
which is now refused) made every List take seconds and stalled every request of the broker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import grpc
import grpc.aio
from bench_kit import free_port
from google.protobuf.duration_pb2 import Duration

from broker import client
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.protocol.limits import labels_per_set_max
from broker.protocol.validate import LABEL_NAME_LEN_MAX, LABEL_VALUE_LEN_MAX

SMALL, UNRELATED, HEAVY = "bench/small", "bench/unrelated", "bench/limits"
# How much worse than unloaded the loaded p99 may be (the acceptance criterion).
loaded_delta_ms_max = 10.0
# Attempts, with doubling backoff, for a new journal to become appendable.
ready_attempts_max = 50
ready_backoff_s_initial, ready_backoff_s_max = 0.02, 0.5


def journal_spec(name: str, labels: pb.LabelSet | None = None) -> pb.JournalSpec:
    spec = pb.JournalSpec(
        name=name,
        replication=1,
        fragment=pb.JournalSpec.Fragment(
            length=1 << 26, compression_codec=pb.NONE, refresh_interval=Duration(seconds=30)
        ),
    )
    if labels is not None:
        spec.labels.CopyFrom(labels)
    return spec


def labels_at_the_limit(prefix: str) -> pb.LabelSet:
    """labels_per_set_max labels, each of the longest name and value."""
    names = (f"{prefix}-{i:06d}".ljust(LABEL_NAME_LEN_MAX, "x") for i in range(labels_per_set_max))
    return label_set((name, "v" * LABEL_VALUE_LEN_MAX) for name in names)


async def append_once(
    stub: object, journal: str, content: bytes, **first: object
) -> pb.AppendResponse:
    call = stub.Append()  # type: ignore[attr-defined]
    await call.write(pb.AppendRequest(journal=journal, **first))  # type: ignore[arg-type]
    await call.write(pb.AppendRequest(content=content))
    await call.write(pb.AppendRequest())
    await call.done_writing()
    resp: pb.AppendResponse = await call
    return resp


async def until_appendable(stub: object, journal: str) -> None:
    backoff = ready_backoff_s_initial
    for _ in range(ready_attempts_max):
        with contextlib.suppress(grpc.aio.AioRpcError):  # E.g. UNAVAILABLE while assigning.
            if (await append_once(stub, journal, b"warm\n")).status == pb.OK:
                return
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, ready_backoff_s_max)
    raise RuntimeError(f"{journal}: not appendable after {ready_attempts_max} attempts")


async def list_all(stub: object, request: pb.ListRequest) -> int:
    return sum([len(r.journals) async for r in stub.List(request)])  # type: ignore[attr-defined]


# --- Measurement ------------------------------------------------------------------------------


async def sample(
    samples: int, requests: dict[str, Callable[[], Awaitable[object]]]
) -> dict[str, list[float]]:
    """Latencies (ms) of each request, taken in turns, one request at a time."""
    out: dict[str, list[float]] = {name: [] for name in requests}
    for _ in range(samples):
        for name, request in requests.items():
            started = time.perf_counter()
            await request()
            out[name].append((time.perf_counter() - started) * 1e3)
    return out


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


def report(phases: dict[str, dict[str, list[float]]]) -> bool:
    """Print each request's p50 / p99 in each phase; whether "loaded" is within
    loaded_delta_ms_max of "unloaded" at p99 for every request."""
    names = list(phases)
    print(f"{'request (ms)':<32}" + "".join(f"{name + ' p50':>20}{'p99':>8}" for name in names))
    ok = True
    for request in phases[names[0]]:
        cells = [
            (quantile(phases[n][request], 0.5), quantile(phases[n][request], 0.99)) for n in names
        ]
        ok &= cells[1][1] - cells[0][1] <= loaded_delta_ms_max
        print(f"{request:<32}" + "".join(f"{p50:>20.2f}{p99:>8.2f}" for p50, p99 in cells))
    verdict = "within" if ok else "NOT within"
    print(f"{names[1]} p99 {verdict} {loaded_delta_ms_max:g} ms of {names[0]} for every request")
    return ok


# --- The load (a process of its own) ----------------------------------------------------------


async def traffic(broker: str, rps: float) -> None:
    """List every journal, and append to the journal at the limits with registers at the
    limits, each `rps` times a second, until killed."""
    c = client.JournalClient(broker)
    stub = c.default_stub()
    registers = labels_at_the_limit("register")
    check = pb.LabelSelector(include=registers)

    async def paced(request: Callable[[], Awaitable[object]]) -> None:
        period = 1.0 / rps
        next_at = time.monotonic()
        while True:
            await request()
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def heavy_append() -> None:
        resp = await append_once(
            stub, HEAVY, b"x" * 1024, check_registers=check, union_registers=registers
        )
        if resp.status != pb.OK:
            raise RuntimeError(f"traffic append: {pb.Status.Name(resp.status)}")

    await asyncio.gather(paced(lambda: list_all(stub, pb.ListRequest())), paced(heavy_append))


# --- Driver -----------------------------------------------------------------------------------


@contextlib.contextmanager
def process(
    args: list[str], log: Path, wait_for_line: str = ""
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as err:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err)
        try:
            if wait_for_line:
                assert proc.stdout is not None
                line = proc.stdout.readline().decode()
                if not line.startswith(wait_for_line):
                    raise RuntimeError(f"{args[:3]}: {line!r}; see {log}")
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


@contextlib.asynccontextmanager
async def journal_client(broker: str) -> AsyncIterator[client.JournalClient]:
    c = client.JournalClient(broker)
    try:
        yield c
    finally:
        await c.channels.close()


async def measure(broker: str, samples: int, traffic_rps: float, root: Path) -> bool:
    async with journal_client(broker) as c:
        stub = c.default_stub()
        small = journal_spec(SMALL, label_set([("tag", "x")]))
        await client.apply_journals(
            c, [client.upsert(small), client.upsert(journal_spec(UNRELATED))]
        )
        await until_appendable(stub, UNRELATED)
        by_name = pb.ListRequest(selector=pb.LabelSelector(include=label_set([("name", SMALL)])))
        requests: dict[str, Callable[[], Awaitable[object]]] = {
            f"List name={SMALL}": lambda: list_all(stub, by_name),
            "List (every journal)": lambda: list_all(stub, pb.ListRequest()),
            f"Append 1 KiB to {UNRELATED}": lambda: append_once(stub, UNRELATED, b"u" * 1024),
        }
        await sample(max(1, samples // 10), requests)  # Warm up.
        phases = {"unloaded": await sample(samples, requests)}

        heavy = journal_spec(HEAVY, labels_at_the_limit("label"))
        await client.apply_journals(c, [client.upsert(heavy)])
        await until_appendable(stub, HEAVY)
        registers = labels_at_the_limit("register")
        resp = await append_once(stub, HEAVY, b"r", union_registers=registers)
        print(
            f"journal at the limits: {heavy.ByteSize()} bytes of spec ({labels_per_set_max}"
            f" labels), {resp.registers.ByteSize()} bytes of registers"
        )
        phases["loaded"] = await sample(samples, requests)

        traffic_args = [sys.executable, __file__, "--traffic", str(traffic_rps), "--broker", broker]
        with process(traffic_args, root / "traffic.log") as sender:
            await asyncio.sleep(1.0)  # Under way.
            phases["+traffic"] = await sample(samples, requests)
            if sender.poll() is not None:
                raise RuntimeError(f"the traffic process ended; see {root / 'traffic.log'}")
    return report(phases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--traffic-rps", type=float, default=10.0)
    parser.add_argument("--traffic", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--broker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.traffic:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(traffic(args.broker, args.traffic))
        return
    with tempfile.TemporaryDirectory(prefix="bench-limits-") as tmp:
        root = Path(tmp)
        port = free_port()
        serve = [
            *(sys.executable, "-c", "from broker.serve_cli import main; main()", "serve"),
            *("--port", str(port), "--data-dir", str(root), "--file-root", str(root)),
        ]
        with process(serve, root / "broker.log", wait_for_line="serving on"):
            ok = asyncio.run(measure(f"127.0.0.1:{port}", args.samples, args.traffic_rps, root))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
