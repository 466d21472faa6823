"""``python -m examples.stream_sum.soak``: the fault-injection soak (see run.py, faults.py).

    python -m examples.stream_sum.soak --duration 600          # every fault kind, for 10 min
    python -m examples.stream_sum.soak --faults etcd-restart,broker-zombie
    python -m examples.stream_sum.soak --duration 900 --replication-mode quorum
    make soak DURATION=600

Exits 0 if nothing was found, 1 on any violation or unrecovered fault (each is listed), 2 on
bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Callable, Sequence

from broker import logging as gazette_logging
from examples.stream_sum.layout import REPLICATION_MODES
from examples.stream_sum.soak.context import Timeouts
from examples.stream_sum.soak.faults import FAULTS, FaultConfig
from examples.stream_sum.soak.run import SoakConfig, run_soak
from examples.stream_sum.soak.stack import StackConfig


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m examples.stream_sum.soak",
        description="Run the stream-sum workload on a real cluster under injected faults.",
    )
    p.add_argument("--duration", type=float, default=600.0, help="seconds of faults (default 600)")
    p.add_argument(
        "--faults",
        default="",
        help=f"comma-separated fault kinds to run in this order (instead of --duration): {', '.join(FAULTS)}",
    )
    p.add_argument("--kinds", default=",".join(FAULTS), help="kinds --duration draws from")
    p.add_argument("--seed", type=int, default=12)
    p.add_argument("--rate", type=float, default=40.0, help="chunks published per second")
    p.add_argument("--store-outage", type=float, default=30.0, help="seconds a store is down")
    p.add_argument("--sum-deadline", type=float, default=120.0, help="seconds a sum may take")
    p.add_argument(
        "--replication-mode",
        choices=REPLICATION_MODES,
        default="all",
        help="which R=3 journals are quorum journals: none (all, default), every one, or some",
    )
    p.add_argument("--keep-dir", action="store_true", help="keep logs and data after the run")
    p.add_argument("--log-level", default="error", help="of this process (default error)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    gazette_logging.configure("console", args.log_level)
    try:
        config = SoakConfig(
            faults=[f for f in args.faults.split(",") if f],
            duration_s=args.duration,
            kinds=[k for k in args.kinds.split(",") if k],
            seed=args.seed,
            chunks_per_s=args.rate,
            sum_deadline_s=args.sum_deadline,
            faults_config=FaultConfig(store_outage_s=args.store_outage),
            timeouts=Timeouts(),
            stack=StackConfig(
                keep_dir=args.keep_dir or None, replication_mode=args.replication_mode
            ),
        )
    except ValueError as err:
        print(f"soak: {err}", file=sys.stderr)
        return 2
    try:
        ok = asyncio.run(_until_terminated(config, out=lambda line: print(line, flush=True)))
    except asyncio.CancelledError:
        print("soak: terminated (SIGTERM); its processes were stopped", file=sys.stderr)
        return 128 + signal.SIGTERM
    return 0 if ok else 1


async def _until_terminated(config: SoakConfig, out: Callable[[str], None]) -> bool:
    """Run the soak; SIGTERM cancels it as Ctrl-C does, so that its stack (etcd, PostgreSQL,
    S3, brokers, consumers) is stopped on the way out rather than left running orphaned."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return (await run_soak(config, out=out)).ok


if __name__ == "__main__":
    sys.exit(main())
