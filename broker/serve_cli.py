"""The `gazette` command: `gazette serve` runs one broker process (on etcd, or on the embedded
keyspace without `--etcd`) until SIGTERM/SIGINT, handing its journals off first; `gazette demo`
runs the embedded end-to-end demo. The Broker itself is broker/server.py.

The embedded keyspace persists under `<--data-dir>/keyspace/` (broker/keyspace/persisted.py), or
lives in memory without `--data-dir`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from broker import task_dump
from broker.append_receive import flow_control_burst_s_default, min_append_rate_bytes_per_s_default
from broker.auth import decode_keys
from broker.broker_config import BrokerConfig, lease_ttl_s_default
from broker.flag_types import port
from broker.fragment.stores.registry import new_registry
from broker.gc_tuning import freeze_startup_heap
from broker.hand_off import handoff_wait_s_default
from broker.keyspace.backend import Backend, KeySpaceError, NoSpaceError, error_within
from broker.keyspace.embedded import EmbeddedStore, storage_error_within
from broker.keyspace.etcd import EtcdAuthError
from broker.keyspace.etcd_errors import failure_line
from broker.keyspace.persisted import KeySpaceDirError
from broker.keyspace.wal import CorruptLogError
from broker.logging import get_logger
from broker.protocol.validate import (
    PROCESS_SUFFIX_LEN_MAX,
    PROCESS_SUFFIX_LEN_MIN,
    ZONE_LEN_MAX,
    ZONE_LEN_MIN,
    ValidationError,
    validate_token,
)
from broker.read_staging import stage_bytes_max_default
from broker.security_flags import (
    add_etcd_options,
    add_server_tls_options,
    etcd_options_of,
    peer_tls_of,
    server_tls_of,
)
from broker.serve_watchdog import StopWatchdog, stop_wait_s_default
from broker.server import Broker
from broker.tls import PortBindError
from broker.topology import DEFAULT_ROOT

log = get_logger(__name__)


def _auth_keys(text: str) -> str:
    if text.strip():
        try:
            decode_keys(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix("auth_keys")) from None
    return text


def _token(len_min: int, len_max: int) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            validate_token(text, len_min, len_max)
        except ValidationError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return text

    return parse


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer (got {text!r})") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (got {value})")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer (got {text!r})") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {value})")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds (got {text!r})") from None
    if not value >= 0:  # Also refuses NaN.
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {text})")
    return value


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (got {text})")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gazette", description="Run a Gazette broker.")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve journals")
    serve.add_argument(
        "--zone",
        type=_token(ZONE_LEN_MIN, ZONE_LEN_MAX),
        default="local",
        help="this broker's failure zone: the allocator spreads each journal's replicas over"
        " zones (default: local)",
    )
    serve.add_argument(
        "--suffix",
        "--id",
        type=_token(PROCESS_SUFFIX_LEN_MIN, PROCESS_SUFFIX_LEN_MAX),
        default="broker",
        help="this broker's ID within its zone",
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on and to advertise to peers and clients (default: 127.0.0.1)",
    )
    serve.add_argument(
        "--port", type=port, default=8080, help="gRPC port (0: any free port; default: 8080)"
    )
    serve.add_argument(
        "--http-port",
        type=port,
        default=None,
        help="serve the HTTP gateway, /debug/metrics and /debug/ready here (0: any free port)",
    )
    serve.add_argument(
        "--root",
        default=DEFAULT_ROOT,
        help=f"etcd prefix of this broker cluster's specs, members and assignments (default:"
        f" {DEFAULT_ROOT})",
    )
    serve.add_argument(
        "--auth-keys",
        type=_auth_keys,
        default=os.environ.get("GAZETTE_AUTH_KEYS", ""),
        help="base64 pre-shared keys, comma separated: every RPC then needs a token signed by"
        " one of them (the first signs the broker's own); default $GAZETTE_AUTH_KEYS",
    )
    serve.add_argument("--etcd", action="append", default=[], help="etcd endpoint host:port")
    serve.add_argument(
        "--file-root",
        default="/",
        help="directory that file:// fragment store URLs are rooted at; it must exist (a"
        " missing one is usually an unmounted volume; default: /)",
    )
    serve.add_argument(
        "--data-dir",
        default=None,
        help="the broker's data directory: spools are durable files under <dir>/spools, and a"
        " broker restarted on it (after kill -9, or SIGTERM) recovers every appended byte it"
        " acknowledged and continues each journal at its offset (README, 'Data directory');"
        " without --etcd, the embedded keyspace persists under <dir>/keyspace",
    )
    serve.add_argument(
        "--fsync",
        action="store_true",
        help="fdatasync spool content, commit records and the embedded keyspace's log before"
        " acknowledging a write, so that it survives power loss too, not only the process"
        " being killed (slower)",
    )
    serve.add_argument(
        "--spool-dir",
        default=None,
        help="without --data-dir: the directory of temporary spool files, unlinked at creation"
        " and lost with the process (default: the system's temporary directory)",
    )
    serve.add_argument(
        "--spool-memory",
        action="store_true",
        help="keep spools in process memory, in blocks re-used across fragments (faster than"
        " files; needs RAM for each journal's open fragment). Never durable, even with"
        " --data-dir: a killed broker loses what it did not persist yet",
    )
    serve.add_argument(
        "--no-allocator",
        action="store_true",
        help="do not run the allocator (assignments are made by someone else)",
    )
    serve.add_argument(
        "--lease-ttl",
        dest="lease_ttl_s",
        type=_positive_int,
        default=lease_ttl_s_default,
        help="seconds the broker's etcd lease outlives it (how fast a crash is noticed)",
    )
    serve.add_argument(
        "--handoff-timeout",
        dest="handoff_timeout_s",
        type=_non_negative_float,
        default=handoff_wait_s_default,
        help="seconds an exiting broker waits for its journals to move before it stops anyway",
    )
    serve.add_argument(
        "--stop-timeout",
        dest="stop_timeout_s",
        type=_positive_float,
        default=stop_wait_s_default,
        help="seconds an exiting broker may take to stop after its hand-off; past them it"
        " logs where it is stuck (thread stacks, asyncio tasks) and exits at once with"
        " status 70",
    )
    serve.add_argument(
        "--min-append-rate",
        dest="min_append_rate_bytes_per_s",
        type=_positive_int,
        default=min_append_rate_bytes_per_s_default,
        help="bytes per second an Append client must sustain while it streams content; a"
        " slower (or stalled) append is rolled back, freeing the journal for the others",
    )
    serve.add_argument(
        "--flow-control-burst",
        dest="flow_control_burst_s",
        type=_positive_float,
        default=flow_control_burst_s_default,
        help="seconds an Append client may fall behind --min-append-rate before its append is"
        " rolled back",
    )
    serve.add_argument(
        "--quorum-log-bytes-max",
        dest="quorum_log_bytes_max",
        type=_positive_int,
        default=None,
        help="bytes a quorum journal's leader holds in its entry log beyond what the fragment"
        " store holds: appends past it are refused (RESOURCE_EXHAUSTED) until uploads catch"
        " up; the log compacts at half of it (default 64 MiB)",
    )
    serve.add_argument(
        "--read-stage-bytes-max",
        dest="stage_bytes_max",
        type=_non_negative_int,
        default=stage_bytes_max_default,
        help="bytes of stored fragments over 1 MiB this broker holds at once in scratch files"
        " (unlinked, where the spools' scratch goes) to verify them whole before a Read serves"
        " their first byte; a fragment with no room is read twice instead, a first pass"
        " verifying it; 0: always read twice (default 4 GiB)",
    )
    add_server_tls_options(serve)
    add_etcd_options(serve)
    demo = sub.add_parser("demo", help="run the embedded end-to-end demo")
    demo.add_argument("--data-dir", default=None, help="default: ./demo-data")
    return p


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _parser()
    args = p.parse_args(argv)
    if args.command == "serve":
        if args.spool_dir and args.data_dir and not args.spool_memory:
            p.error("--spool-dir: not with --data-dir (spools are durable under <data-dir>/spools)")
        for flag, directory in (("--spool-dir", args.spool_dir), ("--data-dir", args.data_dir)):
            if directory:
                # Make it rather than fail every append.
                try:
                    os.makedirs(directory, exist_ok=True)
                except OSError as err:
                    p.error(f"{flag} {directory}: cannot create it: {err.strerror}")
        if not os.path.isdir(args.file_root):
            # Not created: a missing root is usually a volume that failed to mount.
            p.error(f"--file-root {args.file_root}: no such directory (is its volume mounted?)")
        try:  # Certificates are read and checked now: a bad one changes nothing.
            args.server_tls, args.peer_tls = server_tls_of(args), peer_tls_of(args)
            args.etcd_options = etcd_options_of(args)
        except ValueError as err:
            p.error(str(err))
    return args


async def _serve(args: argparse.Namespace) -> None:
    from broker.http_gateway import HttpGateway
    from broker.keyspace.etcd import EtcdBackend

    store = None if args.etcd else _embedded_store(args.data_dir, args.fsync)
    backend: Backend = (
        EtcdBackend(args.etcd, **args.etcd_options) if store is None else store.connect()
    )
    broker = Broker(
        backend,
        BrokerConfig(
            zone=args.zone,
            suffix=args.suffix,
            root=args.root,
            host=args.host,
            port=args.port,
            spool_dir=args.spool_dir,
            data_dir=args.data_dir,
            fsync=args.fsync,
            memory_spools=args.spool_memory,
            auth_keys=args.auth_keys,
            tls=args.server_tls,
            peer_tls=args.peer_tls,
            lease_ttl_s=args.lease_ttl_s,
            min_append_rate_bytes_per_s=args.min_append_rate_bytes_per_s,
            flow_control_burst_s=args.flow_control_burst_s,
            quorum_log_bytes_max=args.quorum_log_bytes_max,
            stage_bytes_max=args.stage_bytes_max,
        ),
        stores=new_registry(file_root=args.file_root),
    )
    # The first SIGTERM (or SIGINT) asks for a graceful exit; a second one cuts the hand-off.
    # Handled from here on: a signal that arrives while the broker starts is not lost (nor
    # fatal), and whoever saw "serving on" may signal at once.
    stop, hurry = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: (hurry if stop.is_set() else stop).set())
    task_dump.install(loop)  # SIGUSR1: what every task waits on, to the log.
    # Bounds the stop, from its first step to the process's exit (serve_watchdog.py).
    watchdog = StopWatchdog(args.stop_timeout_s, loop)
    # The HTTP gateway listens first, so that /debug/ready answers (503) while the broker starts.
    gateway = (
        HttpGateway(ready=broker.is_ready, store_health=broker.store_health.report)
        if args.http_port is not None
        else None
    )
    if gateway is not None:
        await gateway.start(args.host, args.http_port, tls=args.server_tls)
    if not await _start_unless_stopped(broker, stop):
        # Asked to exit while starting (waiting out a predecessor's lease, say): the start was
        # abandoned (port and lease released); exit now rather than serve first.
        log.info("broker stopped while starting", broker=repr(broker))
        watchdog.start()
        if gateway is not None:
            await gateway.stop()
        await backend.close()
        if store is not None:
            await store.close()
        return
    freeze_startup_heap()  # Long-lived start-up objects out of full collections (gc_tuning).
    log.info("broker serving", endpoint=broker.endpoint)
    print(f"serving on {broker.endpoint}", flush=True)
    if gateway is not None:
        gateway.attach(broker.endpoint, tls=args.peer_tls)
        log.info("http gateway serving", port=gateway.port)
        scheme = "https" if args.server_tls is not None else "http"
        print(f"http gateway on {scheme}://{args.host}:{gateway.port}", flush=True)
    # Every broker runs the allocator; it acts only while this broker is the leader (the
    # member with the oldest key), so one process on the embedded keyspace assigns itself.
    allocator: asyncio.Future[None] | None = None
    if not args.no_allocator:
        from broker.allocator import MemberId, broker_is_consistent
        from broker.allocator import serve as allocate

        allocator = asyncio.ensure_future(
            allocate(
                backend,
                broker.ks,
                MemberId(args.zone, args.suffix),
                is_consistent=broker_is_consistent,
            )
        )
    try:
        await _serve_until_exit(broker, allocator, stop, hurry, args.handoff_timeout_s)
    finally:
        watchdog.start()
        if allocator is not None:
            allocator.cancel()
            await asyncio.gather(allocator, return_exceptions=True)
        await broker.stop()
        if gateway is not None:
            await gateway.stop()  # After the broker: /debug/ready says 503 while it stops.
        await backend.close()
        if store is not None:
            await store.close()


async def _start_unless_stopped(broker: Broker, stop: asyncio.Event) -> bool:
    """Start ``broker``; False if ``stop`` was set first (the start is then cancelled, which
    releases what it took). Raises what made the start fail."""
    starting = asyncio.ensure_future(broker.start())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
    if starting.cancelled():
        return False
    starting.result()  # Raises what made the start fail.
    return True


def _embedded_store(data_dir: str | None, fsync: bool) -> EmbeddedStore:
    """The embedded keyspace: persisted under ``data_dir``/keyspace, else in memory."""
    if data_dir is None:
        return EmbeddedStore()
    return EmbeddedStore.open(os.path.join(data_dir, "keyspace"), fsync=fsync)


async def _serve_until_exit(
    broker: Broker,
    allocator: asyncio.Future[None] | None,
    stop: asyncio.Event,
    hurry: asyncio.Event,
    handoff_timeout_s: float,
) -> None:
    """Serve until ``stop``, then hand every journal off (``Broker.hand_off``) while the
    allocator keeps running, for at most ``handoff_timeout_s`` or until ``hurry``. Raises if
    the broker or the allocator fails meanwhile; the caller then stops the broker."""
    waiter = asyncio.ensure_future(broker.wait())
    stopper = asyncio.ensure_future(stop.wait())
    hurrier = asyncio.ensure_future(hurry.wait())
    handoff: asyncio.Future[bool] | None = None
    tasks: list[asyncio.Future[Any]] = [waiter, stopper, hurrier]
    try:
        pending: set[asyncio.Future[Any]] = {waiter, stopper}
        if allocator is not None:
            pending.add(allocator)
        while not stopper.done():
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            _raise_failures(done)
            if waiter in done:
                return  # The broker ended on its own (it was stopped).
        handoff = asyncio.ensure_future(broker.hand_off(handoff_timeout_s))
        tasks.append(handoff)
        pending |= {handoff, hurrier}
        while not handoff.done():
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            # The allocator returns by itself once this broker is drained: that is no failure.
            _raise_failures(done - {handoff})
            if hurrier in done:
                log.warning("broker exiting: hand-off cut short by a second signal")
                return
            if waiter in done:
                return
        handoff.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _raise_failures(done: set[asyncio.Future[Any]]) -> None:
    for task in done:
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            raise exc


def main(argv: list[str] | None = None) -> None:
    from broker import logging as gazette_logging

    args = _parse_args(argv)
    if args.command != "demo":  # The demo configures quieter logging itself.
        gazette_logging.configure()
    if args.command == "demo":
        from broker.demo import main as demo_main

        sys.exit(demo_main(args.data_dir))
    from broker.malloc_tuning import tune_malloc

    tune_malloc()  # Large append buffers: see malloc_tuning.py.
    try:
        asyncio.run(_serve(args))
    except (KeySpaceDirError, CorruptLogError) as err:  # Locked, unusable or corrupt.
        sys.exit(f"gazette serve: --data-dir: {err}")
    except BaseExceptionGroup as group:
        # The embedded keyspace could not write its log (a full disk): it fails the broker's
        # tasks, whose group ends the process. Its message says what to do; no traceback.
        storage = storage_error_within(group)
        if storage is not None:
            sys.exit(f"gazette serve: {storage}")
        keyspace = error_within(group, KeySpaceError)
        if keyspace is None:
            raise
        sys.exit(f"gazette serve: {failure_line(keyspace, args.etcd)}")
    except PortBindError as err:  # --port in use: the message says what to do.
        sys.exit(f"gazette serve: {err}")
    except (EtcdAuthError, NoSpaceError) as err:
        # Wrong or missing --etcd-user/--etcd-password; etcd out of space (its lease refused):
        # the message says what to do.
        sys.exit(f"gazette serve: {err}")
    except KeySpaceError as err:
        # etcd unreachable (at start-up, most often: a wrong --etcd, or etcd not running), or
        # another of the keyspace's typed errors: one line naming the endpoints, no traceback.
        sys.exit(f"gazette serve: {failure_line(err, args.etcd)}")
