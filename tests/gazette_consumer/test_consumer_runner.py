"""``gazette-consumer serve``: an ``--app`` that does not name an Application class, and bad
settings, are refused with one line naming the problem (exit 2) before anything starts; an
embedded process runs the counting example's shards for real (counts, derived messages, and
its metrics at /debug/metrics), and exits 0 on SIGTERM. (gazctl against a consumer process:
tests/broker/cli/test_gazctl_shards.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections import Counter as Counter_
from pathlib import Path

import aiohttp
import pytest
import sqlalchemy as sa
from google.protobuf.duration_pb2 import Duration
from prometheus_client.parser import text_string_to_metric_families

from broker.client.append_service import AppendService
from broker.client.async_append import AsyncAppend
from broker.client.list_apply import apply_journals, upsert
from broker.client.route_cache import JournalClient
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from examples.counter import Count, Counted, Counter, read_counts
from gazette_consumer.application import Application
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES, Partition, Publisher
from gazette_consumer.runner import AppLoadError, load_app, main
from gazette_consumer.sequencer.read_iter import ReadCommittedIter
from gazette_consumer.shard_client import ShardClient
from gazette_consumer.shard_client import upsert as shard_upsert
from tests.broker.broker_testkit import journal_spec
from tests.gazette_consumer.consumer_testkit import ConsumerProcess, process_ready_s, stat_through

REPO = str(Path(__file__).resolve().parents[2])


class Outer:
    class Nested(Counter):
        pass

    class Abstract(Application):
        pass

    class Broken(Counter):
        def __init__(self) -> None:
            raise RuntimeError("no config")


HERE = "tests.gazette_consumer.test_consumer_runner"


def test_load_app_finds_applications_and_nested_classes() -> None:
    assert load_app("examples.counter:Counter") is Counter
    # (pytest imported this file under another module name: compare what can be compared.)
    nested = load_app(f"{HERE}:Outer.Nested")
    assert nested.__qualname__ == "Outer.Nested" and issubclass(nested, Counter)


def test_load_app_looks_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An installed console script has no working directory on its path; `--app` finds the
    # project's own modules anyway, as `python -m` would.
    (tmp_path / "my_cwd_app_xyz.py").write_text(
        "from examples.counter import Counter\n\nclass Mine(Counter):\n    pass\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_cwd_app_xyz", raising=False)
    app = load_app("my_cwd_app_xyz:Mine")
    assert app.__name__ == "Mine" and issubclass(app, Counter)
    assert sys.path[-1] == str(tmp_path)


@pytest.mark.parametrize(
    ("app", "message"),
    [
        ("json", "expected module:Class"),
        (":Thing", "expected module:Class"),
        ("no_such_module_xyz:App", "cannot import module 'no_such_module_xyz'"),
        ("json:NoSuchClass", "module 'json' has no attribute 'NoSuchClass'"),
        ("json:dumps", "'dumps' is a function, not a class"),
        ("json:JSONDecoder", "'JSONDecoder' is not a subclass of gazette_consumer.application"),
        (f"{HERE}:Outer.Abstract", "'Outer.Abstract' does not implement consume_message, "),
    ],
)
def test_bad_apps_are_refused(app: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(AppLoadError, match=message):
        load_app(app)
    assert main(["serve", "--app", app, "--log-level", "error"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gazette-consumer: --app {app!r}: ") and message in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--zone", "a#b"], "--zone: must"),
        (["--id", "c"], "--id: length must be in [4, 128]"),
        (["--shard-limit", "0"], "--shard-limit: must be >= 1 (got 0)"),
        (["--drain-timeout", "-1"], "--drain-timeout: must be >= 0"),
        (["--lease-ttl", "0"], "--lease-ttl: must be >= 1 (got 0)"),
    ],
)
def test_bad_settings_are_refused(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--app", "examples.counter:Counter", *flags]) == 2
    assert capsys.readouterr().err.startswith(f"gazette-consumer: {message}")


def test_an_app_that_cannot_be_made_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--app", f"{HERE}:Outer.Broken", "--log-level", "error"]) == 2
    err = capsys.readouterr().err
    assert "Broken() failed: RuntimeError: no config" in err


# --- A real process, embedded mode ----------------------------------------------------------------

SHARD = "counter-000"
SOURCE = "counts/in-000"
OUTPUT = "counts/out"
MESSAGES = 300
KEYS = ("apple", "pear", "plum")


def counter_shard(shard: str, sources: list[str], output: str) -> cpb.ShardSpec:
    return cpb.ShardSpec(
        id=shard,
        sources=[cpb.ShardSpec.Source(journal=j) for j in sources],
        max_txn_duration=Duration(nanos=100_000_000),
        labels=pb.LabelSet(labels=[pb.Label(name="counter.example/output", value=output)]),
    )


def json_journal(name: str) -> pb.JournalSpec:
    spec = journal_spec(name)
    spec.labels.CopyFrom(labels.label_set([(labels.CONTENT_TYPE, CONTENT_TYPE_JSON_LINES)]))
    return spec


def metric(text: str, name: str, shard: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("shard") == shard:
                return float(sample.value)
    raise AssertionError(f"no {name}{{shard={shard!r}}} in the metrics")


async def test_embedded_process_counts_publishes_and_serves_metrics(tmp_path: Path) -> None:
    consumer = ConsumerProcess(
        [
            *("--app", "examples.counter:Counter", "--id", "consumer-1", "--port", "0"),
            *("--data-dir", str(tmp_path / "broker"), "--http-port", "0"),
            *("--drain-timeout", "5", "--log-level", "info"),
        ],
        tmp_path / "consumer.log",
        env={"COUNTER_DATA_DIR": str(tmp_path / "db")},
    )
    await consumer.start()
    try:
        broker = JournalClient(consumer.printed["embedded broker"])
        shards = ShardClient(consumer.endpoint)
        closing = contextlib.AsyncExitStack()
        closing.push_async_callback(broker.close)
        async with closing, shards, AppendService(broker) as appends:
            await apply_journals(broker, [upsert(json_journal(j)) for j in (SOURCE, OUTPUT)])
            await shards.apply([shard_upsert(counter_shard(SHARD, [SOURCE], OUTPUT))])
            publisher: Publisher[AsyncAppend] = Publisher(appends)
            source = Partition(SOURCE, CONTENT_TYPE_JSON_LINES)
            want: Counter_[str] = Counter_()
            last = None
            for i in range(MESSAGES):
                key = KEYS[i % len(KEYS)]
                want[key] += i % 4
                last = await publisher.publish_committed(lambda _m: source, Count(key=key, n=i % 4))
            assert last is not None
            head = (await last).commit.end
            stat = await stat_through(consumer, SHARD, {SOURCE: head})
            assert stat.read_through[SOURCE] >= head

            engine = sa.create_engine(f"sqlite:///{tmp_path / 'db' / f'{SHARD}.sqlite'}")
            try:
                assert read_counts(engine, SHARD) == dict(want)
            finally:
                engine.dispose()

            # The derived stream: one Counted per input message, totals increasing per key.
            derived: list[Counted] = []
            async with ReadCommittedIter(broker, {OUTPUT: 0}, message_type=Counted) as it:
                async with asyncio.timeout(process_ready_s):
                    while len(derived) < MESSAGES:
                        derived.append((await it.next()).message)
            totals: dict[str, list[int]] = {}
            for message in derived:
                totals.setdefault(message.key, []).append(message.total)
            assert {key: values[-1] for key, values in totals.items()} == dict(want)
            assert all(values == sorted(values) for values in totals.values())
            assert len({m.source for m in derived}) == MESSAGES

            async with aiohttp.ClientSession() as http:
                async with http.get(consumer.printed["metrics"]) as response:
                    assert response.status == 200
                    text = await response.text()
            name = "gazette_consumer_shard_messages_total"
            assert metric(text, name, SHARD) == MESSAGES
            assert metric(text, "gazette_consumer_shard_transactions_total", SHARD) >= 1
            commits = metric(text, "gazette_consumer_shard_commit_latency_seconds_count", SHARD)
            assert commits >= 1
            assert metric(text, "gazette_consumer_shard_txn_duration_seconds_count", SHARD) >= 1
        assert await consumer.terminate() == 0
    finally:
        await consumer.kill()


async def test_a_sigterm_while_starting_stops_the_process_gracefully(tmp_path: Path) -> None:
    # The soak sent SIGTERM right after start and the process died of it (-15): the handlers
    # were installed only once it served. The metrics line is printed before the embedded
    # broker and the member start.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
    }
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "gazette_consumer.runner", "serve"),
        *("--app", "examples.counter:Counter", "--id", "consumer-1", "--port", "0"),
        *("--data-dir", str(tmp_path / "data"), "--http-port", "0", "--drain-timeout", "5"),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(process_ready_s):
            first = (await proc.stdout.readline()).decode()
            assert first.startswith("metrics on"), first
            proc.send_signal(signal.SIGTERM)
            rest = (await proc.stdout.read()).decode()
            assert await proc.wait() == 0
        assert "serving on" in rest  # It finished starting, then stopped.
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
