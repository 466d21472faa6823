"""``gazette-consumer serve``: run a consumer process of an Application.

    gazette-consumer serve --app examples.word_count:WordCount \\
        --etcd 127.0.0.1:2379 --zone us-east-1a --id consumer-1 --port 9000 \\
        --broker 127.0.0.1:8080

With ``--etcd``, the process joins the consumer group under ``--root`` (default
``/gazette/consumers/<Class>``) of that etcd cluster, and its shards read and write journals
through the broker at ``--broker``. Without it, the process runs *embedded*: an in-process
keyspace, a broker of its own (on ``--broker-port``, fragments under ``--data-dir``) and the
consumer, all in one process (the embedded mode of docs/architecture.md, "Two ways to run").

Each shard assigned here runs in this process (``shard_runner.ShardRunner``) against the
broker at ``--broker`` (embedded: its own broker), with one instance of the ``--app`` class for
all of them. The application's own gRPC services (``Application.register_services``) are served
on the process's ``--port`` beside the Shard service. ``--http-port`` serves Prometheus metrics at ``/debug/metrics`` (shard metrics
from ``gazette_consumer.metrics``; the embedded broker's too), and ``/debug/ready``: 503 until
the member serves (a restarted process first waits out its predecessor's lease; its Shard
service answers UNAVAILABLE meanwhile), 200 while it does.

Security (docs/security.md): with ``--auth-keys`` every RPC of the Shard service needs a token
signed by one of the keys (as brokers' do), and the process signs its own calls to peers and
brokers with the first (``--broker-auth-token`` / ``--broker-auth-keys`` to authorize to brokers
otherwise); ``--tls-cert`` / ``--tls-key`` serve TLS (``--tls-client-ca``: mutual TLS), and
``--tls-ca`` is what https:// peers and brokers are trusted with; ``--etcd-ca`` and friends
secure etcd. The embedded broker, if any, takes the same keys and certificate.

SIGTERM or SIGINT stop it gracefully: the member hands its shards off to the other members
(bounded by ``--drain-timeout``), then exits 0. Bad arguments (an ``--app`` that does not name
an importable class, say) exit 2 with one line naming what was wrong; a member that fails (it
lost its etcd lease, say) exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc.aio

from broker import task_dump
from broker.auth import Authorizer, client_interceptors
from broker.client.route_cache import ChannelPool, JournalClient
from broker.flag_types import log_level, port
from broker.gc_tuning import freeze_startup_heap
from broker.keyspace.backend import Backend, KeySpaceError, NoSpaceError, error_within
from broker.keyspace.embedded import (
    EmbeddedStore,
    KeySpaceStorageError,
    log_failure,
    storage_error_within,
)
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
    at,
    validate_token,
)
from broker.security_flags import (
    add_etcd_options,
    add_server_tls_options,
    authorizer_of,
    check_auth_keys,
    etcd_options_of,
    peer_tls_of,
    server_tls_of,
)
from broker.tls import ClientTls, PortBindError, ServerTls
from gazette_consumer.application import Application, ServiceContext
from gazette_consumer.hints import HintStore
from gazette_consumer.member import (
    ConsumerConfig,
    ConsumerMember,
    drain_timeout_s_default,
    lease_ttl_s_default,
)
from gazette_consumer.metrics import serve_metrics
from gazette_consumer.shard_handle import StartShard
from gazette_consumer.shard_runner import ShardRunner
from gazette_consumer.topology import default_root

log = get_logger(__name__)

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


class AppLoadError(ValueError):
    """``--app`` does not name an importable Application class, or it cannot be instantiated."""


def load_app(text: str) -> type[Application]:
    """The Application subclass ``module:Class`` names (``Class`` may be dotted:
    ``module:Outer.Inner``). The module is looked up in the working directory too, as
    ``python -m`` would: an application is usually a module of the project the command runs
    in (``examples.counter`` from this repository's root), not an installed package."""
    module_name, sep, attr = text.partition(":")
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.append(cwd)  # Last: an installed package of the same name still wins.
    if not sep or not module_name or not attr:
        raise AppLoadError(f"--app {text!r}: expected module:Class (e.g. examples.counter:Counter)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AppLoadError(f"--app {text!r}: cannot import module {module_name!r}: {exc}") from None
    target: object = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise AppLoadError(
                f"--app {text!r}: module {module_name!r} has no attribute {attr!r}"
            ) from None
    if not isinstance(target, type):
        raise AppLoadError(f"--app {text!r}: {attr!r} is a {type(target).__name__}, not a class")
    if not issubclass(target, Application):
        raise AppLoadError(
            f"--app {text!r}: {attr!r} is not a subclass of "
            "gazette_consumer.application.Application"
        )
    if getattr(target, "__abstractmethods__", None):
        missing = ", ".join(sorted(target.__abstractmethods__))
        raise AppLoadError(f"--app {text!r}: {attr!r} does not implement {missing}")
    return target


def new_app(app: type[Application], text: str) -> Application:
    """One instance of `app` (named `text` on the command line), made with no arguments."""
    try:
        return app()
    except Exception as exc:
        raise AppLoadError(
            f"--app {text!r}: {app.__name__}() failed: {type(exc).__name__}: {exc}"
        ) from exc


@dataclass
class Readiness:
    """What ``/debug/ready`` answers: whether the member serves (it knows the cluster, and is
    neither stopping nor failed), once there is one."""

    member: ConsumerMember | None = None

    def __call__(self) -> bool:
        return self.member is not None and self.member.is_ready()


@dataclass(frozen=True)
class ShardRuntime:
    """What the shards of this process run against."""

    app: Application
    # The consumer group's etcd root: shard FQNs are ``<root>/items/<id>``.
    root: str
    # host:port of a broker of the cluster the shards' journals live in.
    broker: str
    # The consumer group's etcd (or embedded keyspace): recovery-log hints are stored there.
    backend: Backend | None = None
    # Where shards play their recovery logs (None: the system's temporary directory).
    shard_dir: str | None = None
    # How shards' calls to brokers are authorized and secured (both None: as the environment
    # says, see JournalClient).
    broker_authorizer: Authorizer | None = None
    broker_tls: ClientTls | None = None


@contextlib.asynccontextmanager
async def shard_factory(runtime: ShardRuntime) -> AsyncIterator[StartShard]:
    """The one wiring point between the consumer process and the shard runner: the StartShard
    that runs each shard assigned here with ``runtime.app``, valid for the ``async with`` (the
    member is stopped, and its shards with it, before it exits; leaving stops any shard still
    running, then closes the broker client)."""
    channels = None
    if runtime.broker_authorizer is not None or runtime.broker_tls is not None:
        interceptors = client_interceptors(runtime.broker_authorizer)
        channels = ChannelPool(interceptors=interceptors, tls=runtime.broker_tls)
    client = JournalClient(runtime.broker, channels=channels)
    try:
        hints = HintStore(runtime.backend) if runtime.backend is not None else None
        async with ShardRunner(
            runtime.app, client, root=runtime.root, data_dir=runtime.shard_dir, hints=hints
        ) as runner:
            yield runner.start_shard
    finally:
        await client.close()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gazette-consumer", description="Run consumer shards.")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the shards of an Application")
    serve.add_argument("--app", required=True, help="module:Class of the Application")
    serve.add_argument(
        "--etcd", action="append", default=[], help="etcd endpoint host:port (repeatable)"
    )
    serve.add_argument("--root", default=None, help="etcd root of the consumer group")
    serve.add_argument(
        "--zone",
        default="local",
        help="this process's failure zone: the allocator spreads each shard's primary and"
        " standbys over zones (default: local)",
    )
    serve.add_argument("--id", default="consumer", help="this process's ID within its zone")
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on and to advertise to peers and clients (default: 127.0.0.1)",
    )
    serve.add_argument(
        "--port", type=port, default=9000, help="Shard service gRPC port (0: any free port)"
    )
    serve.add_argument(
        "--shard-limit",
        type=int,
        default=1024,
        help="most shards (primaries and standbys) assigned to this process (default: 1024)",
    )
    serve.add_argument(
        "--broker",
        default=os.environ.get("BROKER_ADDRESS", "127.0.0.1:8080"),
        help="broker address (with --etcd)",
    )
    serve.add_argument("--broker-port", type=port, default=0, help="embedded broker's port")
    serve.add_argument(
        "--data-dir",
        default=None,
        help="embedded broker's spools and fragments, and the embedded keyspace (its keyspace/);"
        " shards' recovery-log directories go to its shards/ (default: the system's temporary"
        " directory, and the keyspace in memory)",
    )
    serve.add_argument(
        "--fsync",
        action="store_true",
        help="embedded: fdatasync the keyspace's log before acknowledging a write (survives an"
        " OS crash too, not only the process being killed)",
    )
    serve.add_argument(
        "--drain-timeout",
        type=float,
        default=drain_timeout_s_default,
        help="seconds an exiting process waits for its shards to move to other members"
        f" before it stops anyway (default: {drain_timeout_s_default:g})",
    )
    serve.add_argument(
        "--lease-ttl",
        type=int,
        default=lease_ttl_s_default,
        help="seconds the member's etcd key (and its shards) outlive a crash",
    )
    serve.add_argument(
        "--http-port",
        type=port,
        default=None,
        help="serve Prometheus metrics at /debug/metrics on this port (0: any free port)",
    )
    serve.add_argument(
        "--auth-keys",
        default=os.environ.get("GAZETTE_AUTH_KEYS", ""),
        help="base64 pre-shared keys, comma separated: every RPC then needs a token signed by"
        " one of them, and the first signs this process's own calls; default"
        " $GAZETTE_AUTH_KEYS",
    )
    serve.add_argument(
        "--broker-auth-token",
        default=os.environ.get("GAZETTE_BROKER_AUTH_TOKEN", ""),
        help="bearer token for calls to brokers (default: signed with --auth-keys); default"
        " $GAZETTE_BROKER_AUTH_TOKEN",
    )
    serve.add_argument(
        "--broker-auth-keys",
        default=os.environ.get("GAZETTE_BROKER_AUTH_KEYS", ""),
        help="base64 keys to sign calls to brokers with, when theirs differ from --auth-keys;"
        " default $GAZETTE_BROKER_AUTH_KEYS",
    )
    add_server_tls_options(serve)
    add_etcd_options(serve)
    serve.add_argument(
        "--log-level",
        type=log_level,
        default="info",
        help="debug, info, warning or error (default: info)",
    )
    serve.add_argument(
        "--log-format",
        choices=("console", "json"),
        default="console",
        help="console (for people) or json (one object per line, for collectors)",
    )
    return p


async def _serve(args: argparse.Namespace, app: Application) -> int:
    from broker.keyspace.etcd import EtcdBackend

    # Handled from here on: a SIGTERM (or SIGINT) that arrives while the process starts is not
    # lost, nor fatal: whoever saw "serving on" may signal at once, and the member stops
    # gracefully as soon as it has started.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    task_dump.install(loop)  # SIGUSR1: what every task waits on, to the log.
    store = None if args.etcd else _embedded_store(args.data_dir, args.fsync)
    backend: Backend = (
        EtcdBackend(args.etcd, **args.etcd_options) if store is None else store.connect()
    )
    embedded = (
        await start_embedded_broker(
            store,
            zone=args.zone,
            port=args.broker_port,
            data_dir=args.data_dir,
            fsync=args.fsync,
            file_root=args.data_dir or "/",
            auth_keys=args.auth_keys,
            tls=args.server_tls,
            peer_tls=args.peer_tls,
        )
        if store is not None
        else None
    )
    broker_address = embedded[0] if embedded is not None else args.broker
    root = args.root or default_root(type(app).__name__)
    readiness = Readiness()
    http = None
    try:
        if args.http_port is not None:
            # Listening before the member starts: /debug/ready answers 503 until it serves.
            http, http_port = await serve_metrics(args.host, args.http_port, ready=readiness)
            print(f"metrics on http://{args.host}:{http_port}/debug/metrics", flush=True)
        shard_dir = os.path.join(args.data_dir, "shards") if args.data_dir else None
        runtime = ShardRuntime(
            app,
            root,
            broker_address,
            backend,
            shard_dir,
            broker_authorizer=authorizer_of(
                args.broker_auth_token, args.broker_auth_keys or args.auth_keys
            ),
            broker_tls=args.peer_tls,
        )
        async with shard_factory(runtime) as start_shard:
            embedded_broker = broker_address if embedded is not None else None
            return await _run_member(
                args, app, backend, root, start_shard, embedded_broker, readiness, stop
            )
    finally:
        if http is not None:
            await http.cleanup()
        if embedded is not None:
            await embedded[1]()
        await backend.close()
        if store is not None:
            await store.close()


def _embedded_store(data_dir: str | None, fsync: bool) -> EmbeddedStore:
    """The embedded keyspace: persisted under ``data_dir``/keyspace, else in memory."""
    if data_dir is None:
        return EmbeddedStore()
    return EmbeddedStore.open(os.path.join(data_dir, "keyspace"), fsync=fsync)


def application_services(
    app: Application, member: Callable[[], ConsumerMember]
) -> Callable[[grpc.aio.Server], None]:
    """The ``add_services`` of a member that serves ``app``'s own gRPC services: it calls
    ``app.register_services`` with the member's resolver and channels (``member()`` is the
    member, which exists by the time its server is built)."""

    def add(server: grpc.aio.Server) -> None:
        m = member()
        app.register_services(server, ServiceContext(resolver=m.resolver, channels=m.channels))

    return add


async def _run_member(
    args: argparse.Namespace,
    app: Application,
    backend: Backend,
    root: str,
    start_shard: StartShard,
    embedded_broker: str | None,
    readiness: Readiness,
    stop: asyncio.Event,
) -> int:
    member = ConsumerMember(
        backend,
        ConsumerConfig(
            zone=args.zone,
            suffix=args.id,
            root=root,
            host=args.host,
            port=args.port,
            shard_limit=args.shard_limit,
            drain_timeout_s=args.drain_timeout,
            lease_ttl_s=args.lease_ttl,
            auth_keys=args.auth_keys,
            tls=args.server_tls,
            peer_tls=args.peer_tls,
        ),
        start_shard,
        add_services=application_services(app, lambda: member),
    )
    readiness.member = member
    await member.start()  # Returns once the member serves (see broker.readiness).
    freeze_startup_heap()  # Long-lived start-up objects out of full collections (gc_tuning).
    print(f"serving on {member.endpoint}", flush=True)
    if embedded_broker is not None:
        print(f"embedded broker on {embedded_broker}", flush=True)
    stopping = asyncio.ensure_future(stop.wait())
    waiting = asyncio.ensure_future(member.wait())
    await asyncio.wait((stopping, waiting), return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    waiting.cancel()
    await asyncio.gather(stopping, waiting, return_exceptions=True)
    try:
        await member.stop(graceful=True)
    except Exception as exc:
        log_failure(log, "consumer failed", exc)
        return EXIT_FAILED
    return 0


async def start_embedded_broker(
    store: EmbeddedStore,
    *,
    zone: str,
    port: int = 0,
    data_dir: str | None = None,
    fsync: bool = False,
    file_root: str = "/",
    auth_keys: str = "",
    tls: ServerTls | None = None,
    peer_tls: ClientTls | None = None,
) -> tuple[str, Callable[[], Awaitable[None]]]:
    """An in-process broker (and its allocator) over the embedded keyspace ``store``; returns
    its address and an async stopper (which persists the broker's fragments)."""
    from broker.allocator import MemberId, broker_is_consistent
    from broker.allocator import serve as allocate
    from broker.fragment.stores.registry import new_registry
    from broker.server import Broker, BrokerConfig

    if data_dir is not None:
        os.makedirs(data_dir, exist_ok=True)
    backend = store.connect()
    broker = Broker(
        backend,
        # With a data directory, its spools are durable (<data_dir>/spools): a process killed
        # and restarted on it loses no acknowledged append, and writes no offset twice.
        BrokerConfig(
            zone=zone,
            suffix="broker",
            port=port,
            data_dir=data_dir,
            fsync=fsync,
            auth_keys=auth_keys,
            tls=tls,
            peer_tls=peer_tls,
        ),
        stores=new_registry(file_root=file_root),
    )
    await broker.start()
    allocator = asyncio.ensure_future(
        allocate(backend, broker.ks, MemberId(zone, "broker"), is_consistent=broker_is_consistent)
    )

    async def stop() -> None:
        allocator.cancel()
        await asyncio.gather(allocator, return_exceptions=True)
        await broker.stop()
        await backend.close()

    # A TLS broker keeps its https:// scheme: clients dial it with TLS.
    return broker.endpoint.removeprefix("http://"), stop


def _check_args(args: argparse.Namespace) -> None:
    """Refuse bad settings before anything starts (each names its flag)."""
    with at("--zone"):
        validate_token(args.zone, ZONE_LEN_MIN, ZONE_LEN_MAX)
    with at("--id"):
        validate_token(args.id, PROCESS_SUFFIX_LEN_MIN, PROCESS_SUFFIX_LEN_MAX)
    if args.shard_limit < 1:
        raise ValidationError(f"must be >= 1 (got {args.shard_limit})", "--shard-limit")
    if args.drain_timeout < 0:
        raise ValidationError(f"must be >= 0 (got {args.drain_timeout})", "--drain-timeout")
    if args.lease_ttl < 1:
        raise ValidationError(f"must be >= 1 (got {args.lease_ttl})", "--lease-ttl")
    for flag, keys in (("--auth-keys", args.auth_keys), ("--broker-auth-keys",
                                                          args.broker_auth_keys)):  # fmt: skip
        if keys.strip():
            check_auth_keys(keys, flag)


def _load_security(args: argparse.Namespace) -> None:
    """Read and check certificates now, before anything binds or dials (each error names its
    option)."""
    args.server_tls, args.peer_tls = server_tls_of(args), peer_tls_of(args)
    args.etcd_options = etcd_options_of(args)


def main(argv: Sequence[str] | None = None) -> int:
    from broker import logging as gazette_logging

    args = _parser().parse_args(argv)
    gazette_logging.configure(args.log_format, args.log_level)
    try:
        _check_args(args)
        _load_security(args)
        app = new_app(load_app(args.app), args.app)
    except ValueError as exc:
        print(f"gazette-consumer: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return asyncio.run(_serve(args, app))
    except ValueError as exc:  # Bad configuration (a zone or ID that is not a valid token, ...)
        print(f"gazette-consumer: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (KeySpaceDirError, CorruptLogError) as exc:  # Locked, unusable or corrupt.
        print(f"gazette-consumer: --data-dir: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (BaseExceptionGroup, KeySpaceStorageError) as exc:
        # The embedded keyspace could not write its log (a full disk): it fails the process's
        # tasks, whose group ends it. Its message says what to do; no traceback.
        storage = storage_error_within(exc)
        if storage is not None:
            print(f"gazette-consumer: {storage}", file=sys.stderr)
            return EXIT_FAILED
        keyspace = error_within(exc, KeySpaceError)
        if keyspace is None:
            raise
        print(f"gazette-consumer: {failure_line(keyspace, args.etcd)}", file=sys.stderr)
        return EXIT_FAILED
    except PortBindError as exc:  # --port in use: the message says what to do.
        print(f"gazette-consumer: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except NoSpaceError as exc:  # etcd out of space (the lease refused): says what to do.
        print(f"gazette-consumer: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeySpaceError as exc:
        # etcd unreachable (at start-up, most often: a wrong --etcd, or etcd not running), or
        # another of the keyspace's typed errors: one line naming the endpoints, no traceback.
        print(f"gazette-consumer: {failure_line(exc, args.etcd)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
