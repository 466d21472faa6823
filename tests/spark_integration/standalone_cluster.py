"""A Spark standalone cluster of real processes on loopback, for a driver job of its own: a
master, and one worker per host given, each a `spark-class` JVM started with pyspark's own
scripts. Unlike `local-cluster[...]`, whose workers all run on one host name, each worker here
runs on a loopback address of its own (127.0.0.1, 127.0.0.2, ...: all of 127/8 is local), so
Spark's scheduler sees its executors on different hosts. Speculative copies of a task need
that: Spark never launches one on a host where an attempt of the task already runs.

The processes are this process's children and in its process group (a driver job started by
`spark_testkit.start_job` has a group of its own, killed by the test whatever happens); they
are also terminated when the context exits.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

# How long the master may take to start (a JVM's start-up under load), and the polling backoff
# of its log.
MASTER_START_S = 120.0
LOG_POLL_S_MAX = 0.2
# How long a JVM may take to exit on SIGTERM before it is killed.
STOP_S = 10.0
# Each worker offers one core and this much memory: one executor of `EXECUTOR_MEMORY`.
WORKER_MEMORY = "1g"
EXECUTOR_MEMORY = "768m"

_MASTER_URL = re.compile(rb"Starting Spark master at (spark://[0-9.]+:[0-9]+)")


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _start(cls: str, args: Sequence[str], host: str, log: Path) -> subprocess.Popen[bytes]:
    """`spark-class CLS ARGS` bound to `host` (SPARK_LOCAL_IP: its RPC and web UI, and the
    executors a worker launches, inherit it), its output in `log`."""
    home = _spark_home()
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": host}
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(home / "bin" / "spark-class"), cls, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def _master_url(proc: subprocess.Popen[bytes], log: Path) -> str:
    """The master's URL, from its log once it logged it (polled, backing off, for at most
    MASTER_START_S); RuntimeError if it exits or takes longer."""
    deadline, wait = time.monotonic() + MASTER_START_S, 0.05
    while True:
        found = _MASTER_URL.search(log.read_bytes())
        if found:
            return found.group(1).decode()
        if proc.poll() is not None:
            raise RuntimeError(f"the Spark master exited ({proc.returncode}): see {log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Spark master did not start in {MASTER_START_S:g} s: {log}")
        time.sleep(wait)
        wait = min(wait * 2, LOG_POLL_S_MAX)


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + STOP_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def standalone_cluster(root: Path, worker_hosts: Sequence[str]) -> Iterator[str]:
    """A master on 127.0.0.1 and a worker on each of `worker_hosts` (one core each), their
    logs and work directories under `root`: yields the master's URL. The workers register
    with the master on their own; a driver waits for their executors
    (`wait_for_executors`)."""
    root.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        log = root / "master.log"
        master = _start(
            "org.apache.spark.deploy.master.Master",
            ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
            "127.0.0.1",
            log,
        )
        procs.append(master)
        url = _master_url(master, log)
        for i, host in enumerate(worker_hosts):
            work = root / f"worker-{i}"
            work.mkdir()
            args = ["--host", host, "--port", "0", "--webui-port", "0", "--cores", "1"]
            args += ["--memory", WORKER_MEMORY, "--work-dir", str(work), url]
            procs.append(
                _start("org.apache.spark.deploy.worker.Worker", args, host, work / "worker.log")
            )
        yield url
    finally:
        _stop(procs[::-1])


def wait_for_executors(spark: object, hosts: Sequence[str], timeout_s: float) -> None:
    """Return once the driver of session `spark` has an executor on each of `hosts` (polled,
    backing off, for at most `timeout_s`); RuntimeError naming the hosts seen otherwise."""
    sc = spark.sparkContext  # type: ignore[attr-defined]
    deadline, wait, seen = time.monotonic() + timeout_s, 0.05, set[str]()
    while True:
        infos = sc._jsc.sc().statusTracker().getExecutorInfos()
        seen = {str(info.host()) for info in infos}
        if set(hosts) <= seen:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"executors on {sorted(seen)}, not on all of {list(hosts)}")
        time.sleep(wait)
        wait = min(wait * 2, LOG_POLL_S_MAX)
