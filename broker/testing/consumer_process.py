"""A ``gazette-consumer serve`` process, for tests and soaks that kill and restart consumers.

``ConsumerProcess`` runs one consumer process of an Application against a real etcd and broker
cluster (``ProcessCluster``), restartable under the same identity (zone, ID) and, with
``keep_port``, on the same port: a restart is a new process with the same arguments, as a
supervisor would make. Readiness is an event: the process is ready once it printed ``serving
on <endpoint>`` (its member key is then in etcd). Its log (stderr and stdout) goes to
``log_path``, appended across restarts. Starting, faults and the log are ``ServedProcess``'s
(broker/testing/served_process.py).

Usage::

    consumer = ConsumerProcess(
        "zone-a", "consumer-1", app="examples.counter:Counter", etcd=cluster.etcd.endpoint,
        broker=cluster.brokers[0].endpoint, root="/gazette/consumers/x", data_dir=tmp / "c1",
    )
    await consumer.start()
    await consumer.kill()          # kill -9
    await consumer.start()         # same identity (and port, with keep_port)
    code = await consumer.terminate()  # SIGTERM: shards handed off, exit 0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from broker.testing.ports import reserve_port
from broker.testing.served_process import PACKAGE_PARENT, ServedProcess

# A consumer process that has not printed its endpoint this long after starting failed to start.
ready_timeout_s_default: Final = 60.0

_SERVING: Final = "serving"


class ConsumerProcess(ServedProcess):
    """One ``gazette-consumer serve`` process (see the module docstring). Drive it from one
    event loop, one call at a time."""

    def __init__(
        self,
        zone: str,
        suffix: str,
        *,
        app: str,
        etcd: str,
        broker: str,
        root: str,
        data_dir: Path,
        lease_ttl_s: int = 3,
        drain_timeout_s: float = 10.0,
        keep_port: bool = True,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        ready_timeout_s: float = ready_timeout_s_default,
    ) -> None:
        super().__init__(f"consumer {suffix}", data_dir.parent / f"{suffix}.log")
        self.zone = zone
        self.suffix = suffix
        self.app = app
        self.etcd = etcd
        self.broker = broker.removeprefix("http://")
        self.root = root
        self.data_dir = data_dir
        self.lease_ttl_s = lease_ttl_s
        self.drain_timeout_s = drain_timeout_s
        self.keep_port = keep_port
        self.env = dict(env or {})
        self.extra_args = list(extra_args)
        self.ready_timeout_s = ready_timeout_s
        # "http://127.0.0.1:<port>" once ready.
        self.endpoint = ""
        self.port = 0

    def args(self) -> list[str]:
        return [
            *("serve", "--app", self.app, "--etcd", self.etcd, "--root", self.root),
            *("--zone", self.zone, "--id", self.suffix, "--host", "127.0.0.1"),
            *("--port", str(self.port), "--broker", self.broker),
            *("--lease-ttl", str(self.lease_ttl_s), "--drain-timeout", str(self.drain_timeout_s)),
            *("--data-dir", str(self.data_dir)),
            *self.extra_args,
        ]

    async def start(self) -> None:
        """Start the process and wait until it serves (its member key is in etcd)."""
        if self.keep_port and not self.port:
            self.port = reserve_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.endpoint = ""
        printed = await self.spawn(
            ["-m", "gazette_consumer.runner", *self.args()],
            expect=(_SERVING,),
            ready_timeout_s=self.ready_timeout_s,
            env=self.env,
            cwd=PACKAGE_PARENT,
        )
        self.endpoint = printed[_SERVING]
