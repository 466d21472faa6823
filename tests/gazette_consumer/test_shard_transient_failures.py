"""Shards ride out transient failures: a recovery log created after its shard started, a broker
restarting while its shard starts; they retry with back-off in BACKFILL, not FAILED, and serve
once the cause is gone, without an operator. A broken spec still fails at once, saying what to
fix, and a transient cause that persists gives up as FAILED. The classification of errors and
the retry state machine, from their types alone. Real in-process brokers, SQLite, JSON stores."""

from __future__ import annotations

import asyncio
import errno
import itertools
from pathlib import Path

import grpc
import grpc.aio
import pytest
import sqlalchemy.exc

from broker.client.append_errors import (
    AppendRetriesExhaustedError,
    DependencyFailedError,
    JournalFailedError,
)
from broker.client.append_service import AppendService
from broker.keyspace.backend import NoSpaceError, UnavailableError
from broker.protocol import consumer_pb2 as cpb
from broker.protocol.status import (
    FragmentStoreUnhealthyError,
    IndexHasGreaterOffsetError,
    JournalNotFoundError,
    NoJournalPrimaryBrokerError,
    NotAllowedError,
    NotJournalPrimaryBrokerError,
)
from examples.word_count import WordCount, counts_of
from gazette_consumer.recovery import RecoveryLogError, RecoveryLogMissingError
from gazette_consumer.recoverylog.recorder import RecorderFailedError, RecorderFencedError
from gazette_consumer.shard import PrimaryShard
from gazette_consumer.shard_handle import ShardRole, ShardStart
from gazette_consumer.shard_retry import (
    GiveUp,
    RetryAfter,
    ShardRetries,
    ShardRetryPolicy,
    Transience,
    classify,
)
from gazette_consumer.shard_runner import LocalShard, ShardRunner
from gazette_consumer.stores.base import CommitDependencyError, FencedError, StoreIOError
from gazette_consumer.stores.jsonfile import JSONFileStore
from gazette_consumer.txn_driver import ShardFailedError, StrayCancelledError
from tests.gazette_consumer.recovery_testkit import Texts, create_log, words_spec
from tests.gazette_consumer.shard_testkit import (
    CountingApp,
    Notifier,
    Producer,
    broker_env,
    read_counts,
    shard_spec,
    sqlite_engine,
)

Code = cpb.ReplicaStatus.Code
ROOT = "/test/transient"
# Quick retries for tests; enough attempts that a cause the test removes is surely outlived.
QUICK = ShardRetryPolicy(initial_s=0.05, max_s=0.2, attempts_max=50)


async def test_a_recovery_log_created_after_its_shard_started_is_picked_up(
    tmp_path: Path,
) -> None:
    async with broker_env() as env, AppendService(env.client) as appends:
        source = await env.journal("in/words-late-log")
        spec = words_spec("shard-late-log", source)
        changed, texts = Notifier(), Texts(appends)
        async with ShardRunner(
            WordCount(), env.client, root=ROOT, data_dir=tmp_path, retry=QUICK
        ) as runner:
            handle = runner.start(spec, on_change=changed.notify)
            # It fails for want of its log, again and again, without going FAILED.
            await changed.until(
                lambda: handle.retrying is not None and handle.retrying.attempt >= 2
            )
            assert handle.status().code == Code.BACKFILL
            assert handle.retrying is not None
            assert "RecoveryLogMissingError" in handle.retrying.error
            # The operator creates the log: the shard serves, with no other action.
            await create_log(env, spec)
            await changed.until(lambda: handle.status().code == Code.PRIMARY)
            assert handle.retrying is None
            end = await texts.send(source, ["late but there"])
            await changed.until(lambda: handle.progress().read_through.get(source, 0) >= end)
            assert handle.primary is not None
            store = handle.primary.store
            assert isinstance(store, JSONFileStore)
            assert counts_of(store) == texts.expected


async def test_a_shard_starting_while_its_broker_restarts_serves_once_it_is_back(
    tmp_path: Path,
) -> None:
    async with broker_env() as env, sqlite_engine(tmp_path) as engine:
        source = await env.journal("in/broker-restarts")
        port = int(env.broker.endpoint.rsplit(":", 1)[1])
        await env.cluster.stop_broker(env.broker)
        app, changed = CountingApp(engine), Notifier()
        async with ShardRunner(app, env.client, root=ROOT, retry=QUICK) as runner:
            handle = runner.start(shard_spec("shard-restart", [source]), on_change=changed.notify)
            # Its broker is down: the shard retries (UNAVAILABLE), in BACKFILL.
            await changed.until(lambda: handle.retrying is not None)
            assert handle.status().code == Code.BACKFILL
            # The broker is back, at the same address, and assigned its journal again.
            broker = await env.cluster.start_broker("zone-a", "broker-a", port=port)
            await env.cluster.assign(source, [broker])
            await changed.until(lambda: handle.status().code == Code.PRIMARY)
            async with AppendService(env.client) as appends:
                producer = Producer(appends, "p")
                end = (await (await producer.committed(source, "k"))).commit.end
                await changed.until(lambda: handle.progress().read_through.get(source, 0) >= end)
            assert await read_counts(engine, "shard-restart") == {"k": 1}
            assert handle.status().code == Code.PRIMARY


async def test_a_broken_spec_fails_at_once_saying_what_to_fix(tmp_path: Path) -> None:
    async with broker_env() as env:
        source = await env.journal("in/words-broken")
        spec = words_spec("shard-broken", source)
        spec.recovery_log_prefix = "in"
        await env.journal(f"in/{spec.id}")  # A JSON-lines journal, not a recovery log.
        changed = Notifier()
        async with ShardRunner(
            WordCount(), env.client, root=ROOT, data_dir=tmp_path, retry=QUICK
        ) as runner:
            handle = runner.start(spec, on_change=changed.notify)
            await changed.until(lambda: handle.status().code == Code.FAILED)
        [error] = handle.status().errors
        assert "RecoveryLogError" in error and f"journal 'in/{spec.id}' is labelled" in error
        assert handle.retrying is None  # Not retried: no attempt would fix it.


async def test_a_transient_cause_that_persists_gives_up_as_failed(tmp_path: Path) -> None:
    async with broker_env() as env, sqlite_engine(tmp_path) as engine:
        changed = Notifier()
        policy = ShardRetryPolicy(initial_s=0.01, max_s=0.02, attempts_max=3)
        async with ShardRunner(CountingApp(engine), env.client, root=ROOT, retry=policy) as runner:
            spec = shard_spec("shard-never", ["in/never-created"])
            handle = runner.start(spec, on_change=changed.notify)
            await changed.until(lambda: handle.status().code == Code.FAILED)
        [error] = handle.status().errors
        assert "opening the message source: JournalNotFoundError" in error
        assert "persisted through 3 attempts" in error and "unassign --failed" in error


async def test_an_error_outside_the_shards_steps_is_classified_by_its_cause() -> None:
    # An error that escapes a primary outside its named steps is reported as the runner's,
    # with the error itself as the cause: a full disk is then retried as anywhere else, and
    # only a cause of no known kind parks the shard in FAILED.
    causes = iter([OSError(errno.ENOSPC, "No space left on device"), ValueError("a bug")])

    def new_primary(*_args: object) -> PrimaryShard:
        raise next(causes)

    start = ShardStart(shard_spec("shard-runner", ["in/x"]), ShardRole.PRIMARY, "fqn", lambda: None)
    shard = LocalShard(start, new_primary, retry=QUICK, sleep=lambda _s: asyncio.sleep(0))
    await asyncio.wait_for(shard.run(), 10)
    assert shard.retrying is not None and shard.retrying.attempt == 1
    assert "No space left on device" in shard.retrying.error
    [error] = shard.status().errors
    assert shard.status().code == Code.FAILED and "shard runner: ValueError: a bug" in error


# --- Classification and the retry state machine --------------------------------------------------


def _failed(step: str, *chain: BaseException) -> ShardFailedError:
    """A ShardFailedError over `chain`, each error the cause of the one before it."""
    for outer, inner in itertools.pairwise(chain):
        outer.__cause__ = inner
    err = ShardFailedError("shard-x", step, chain[0])
    err.__cause__ = chain[0]
    return err


class RegisterMismatch(Exception):
    """Stands in for the cause of a fenced recorder (any cause: fencing decides first)."""


def _rpc(code: grpc.StatusCode, details: str | None = None) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


@pytest.mark.parametrize(
    ("err", "expected"),
    [
        (_failed("recovering", RecoveryLogMissingError("create it")), Transience.TRANSIENT),
        (_failed("recovering", RecoveryLogError("not a log")), Transience.PERMANENT),
        (_failed("reading", JournalNotFoundError()), Transience.TRANSIENT),
        (_failed("reading", _rpc(grpc.StatusCode.UNAVAILABLE)), Transience.TRANSIENT),
        (_failed("reading", _rpc(grpc.StatusCode.PERMISSION_DENIED)), Transience.PERMANENT),
        (_failed("hints", UnavailableError("etcd")), Transience.TRANSIENT),
        (
            _failed(
                "store commit",
                CommitDependencyError("wait_for[0]"),
                DependencyFailedError("dependency"),
                AppendRetriesExhaustedError("j", 9, 600.0, NoJournalPrimaryBrokerError()),
                NoJournalPrimaryBrokerError(),
            ),
            Transience.TRANSIENT,
        ),
        (
            _failed("store commit", CommitDependencyError("x"), IndexHasGreaterOffsetError()),
            Transience.PERMANENT,
        ),
        (
            _failed("store commit", CommitDependencyError("x"), NotAllowedError()),
            Transience.PERMANENT,
        ),
        (_failed("store commit", FencedError("newer primary")), Transience.PERMANENT),
        (
            _failed("store commit", RecorderFencedError("hand-off"), RegisterMismatch()),
            Transience.PERMANENT,
        ),
        (
            _failed(
                "store commit", RecorderFailedError("append"), _rpc(grpc.StatusCode.UNAVAILABLE)
            ),
            Transience.TRANSIENT,
        ),
        (
            # Found by the soak: a recorder's append on a connection a broker kill just broke.
            _failed(
                "store commit",
                RecorderFailedError("append"),
                _rpc(grpc.StatusCode.INTERNAL, "Internal error from Core"),
            ),
            Transience.TRANSIENT,
        ),
        (
            # Found by the soak: a zombie broker back from SIGSTOP, its lease gone, stopped at
            # once and cancelled a recorder's append.
            _failed("store commit", RecorderFailedError("append"), _rpc(grpc.StatusCode.CANCELLED)),
            Transience.TRANSIENT,
        ),
        (_rpc(grpc.StatusCode.INTERNAL, "a broker's own INTERNAL answer"), Transience.PERMANENT),
        (
            _failed(
                "store commit",
                sqlalchemy.exc.OperationalError(
                    "COMMIT", {}, OSError("server closed the connection")
                ),
            ),
            Transience.TRANSIENT,
        ),
        (
            _failed(
                "store commit",
                sqlalchemy.exc.IntegrityError("INSERT", {}, ValueError("duplicate key")),
            ),
            Transience.PERMANENT,
        ),
        # A store's disk full (test_store_disk_full.py runs it): a new instance restores once
        # there is room again; other local OSErrors are decided by their types.
        (
            _failed("store commit", StoreIOError("RocksDBStore at /d: IO error")),
            Transience.TRANSIENT,
        ),
        (
            _failed("playing recovery log", OSError(errno.ENOSPC, "No space left on device")),
            Transience.TRANSIENT,
        ),
        # etcd out of space: a recovering shard cannot store its recovered hints until there
        # is room (test_e2e_etcd_out_of_space.py); tried again, not FAILED at once.
        (
            _failed("storing recovered hints", NoSpaceError("Txn", "database space exceeded")),
            Transience.TRANSIENT,
        ),
        # A journal's fragment store found down: appends to it are refused until it is back
        # (docs/reliability.md); the shard tries again rather than end FAILED at once.
        (
            _failed(
                "publishing",
                JournalFailedError("out/j", FragmentStoreUnhealthyError("s3: timeout")),
            ),
            Transience.TRANSIENT,
        ),
        (_failed("store commit", PermissionError(errno.EACCES, "denied")), Transience.PERMANENT),
        (_failed("app.consume_message", ValueError("poison")), Transience.PERMANENT),
        (_failed("app.consume_message", ConnectionResetError()), Transience.TRANSIENT),
        # A CancelledError nobody asked for: a call on a channel its pool closed (grpc.aio
        # cancels it) as well as an Application's bug, which fails at every attempt anyway.
        (_failed("reading messages", StrayCancelledError()), Transience.TRANSIENT),
        # A listing that could not reach the journal's primary (source_heads.py): retried.
        (
            _failed("opening the message source", NotJournalPrimaryBrokerError("in/j")),
            Transience.TRANSIENT,
        ),
    ],
)
def test_failures_are_classified_by_their_types(err: BaseException, expected: Transience) -> None:
    assert classify(err) is expected


def test_retries_back_off_give_up_and_start_afresh_after_serving() -> None:
    policy = ShardRetryPolicy(initial_s=0.1, max_s=0.3, attempts_max=4, healthy_s=60.0)
    retries = ShardRetries(policy)
    transient = _failed("reading", JournalNotFoundError())
    decisions = [retries.on_failure(transient, served_s=None) for _ in range(3)]
    assert [d.delay_s for d in decisions if isinstance(d, RetryAfter)] == [0.1, 0.2, 0.3]
    assert [d.attempt for d in decisions if isinstance(d, RetryAfter)] == [1, 2, 3]
    # Serving briefly does not make it a new incident...
    gave_up = retries.on_failure(transient, served_s=5.0)
    assert isinstance(gave_up, GiveUp) and "persisted through 4 attempts" in gave_up.message
    # ...serving for `healthy_s` does.
    again = retries.on_failure(transient, served_s=60.0)
    assert isinstance(again, RetryAfter) and again.attempt == 1
    # A permanent failure gives up at once, with its own message.
    permanent = _failed("app.consume_message", ValueError("poison"))
    assert retries.on_failure(permanent, served_s=None) == GiveUp(str(permanent))


@pytest.mark.parametrize(
    "bad",
    [
        {"initial_s": 2.0, "max_s": 1.0},
        {"initial_s": -1.0},
        {"attempts_max": 0},
        {"healthy_s": -1.0},
    ],
)
def test_a_bad_retry_policy_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ShardRetryPolicy(**bad)  # type: ignore[arg-type]


def test_the_default_policy_resumes_soon_after_an_outage_and_gives_up_in_minutes() -> None:
    """However long a cause lasts (a database restarting under load took 25 s), a shard tries
    again at most 5 s after it went away: no back-off in the default policy is longer. A cause
    that persists is given up after two to three minutes of back-off, not retried for ever."""
    retries = ShardRetries(ShardRetryPolicy())
    delays = []
    while not isinstance(
        decision := retries.on_failure(ConnectionResetError("server closed"), served_s=None),
        GiveUp,
    ):
        delays.append(decision.delay_s)
    assert max(delays) <= 5.0
    assert 120.0 <= sum(delays) == retries.failing_s <= 180.0
