"""A shard whose output journal's broker runs out of disk: the broker (its spools on a real
tmpfs, filled to the last byte by another file) refuses the shard's derived messages; the
shard's AppendService retries them with back-off, its transaction waits and commits nothing
meanwhile, and once there is room the shard goes on: every input counted once, and exactly
one derived message per input read back read-committed. In-process brokers (the source's
and the output's), SQLite, a real full file system."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from structlog.testing import capture_logs

from broker.protocol import labels
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES
from gazette_consumer.shard_runner import ShardRunner
from tests.broker.broker_testkit import journal_spec
from tests.gazette_consumer.shard_testkit import (
    CountingApp,
    Notifier,
    Producer,
    read_committed,
    read_counts,
    shard_env,
    shard_spec,
)
from tests.small_disk import fill, small_disk

OUTPUT = "out/full-disk"
DISK_BYTES = 4 << 20
BEFORE, DURING = 50, 50  # Input messages before the disk fills, and while it is full.
wait_s = 60.0


async def _until(what: str, condition: Callable[[], bool]) -> None:
    """Wait (bounded) for a condition with no event to await (log records): every 20 ms."""
    try:
        async with asyncio.timeout(wait_s):
            while not condition():  # noqa: ASYNC110 -- the condition is a list of log records.
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {wait_s} s: {what}") from None


async def test_a_shard_rides_out_its_output_brokers_full_disk(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        async with shard_env(tmp_path) as (env, engine, appends):
            source = await env.journal("in/full-disk")
            out_broker = await env.cluster.start_broker(
                "zone-o", "broker-o", data_dir=str(disk), memory_spools=False
            )
            output = journal_spec(OUTPUT, length=1 << 30)
            output.labels.CopyFrom(
                labels.label_set([(labels.CONTENT_TYPE, CONTENT_TYPE_JSON_LINES)])
            )
            await env.cluster.create(output, [out_broker])
            app = CountingApp(engine, output=OUTPUT)
            changed = Notifier()
            producer = Producer(appends, "p")
            spec = shard_spec("shard-full", [source], max_txn_s=0.2)
            async with ShardRunner(app, env.client, root="/test/full-disk") as runner:
                handle = runner.start(spec, on_change=changed.notify)
                for i in range(BEFORE):
                    last = await producer.committed(source, f"k{i % 7}")
                await changed.read_through(handle, source, (await last).commit.end)

                with capture_logs() as logs:
                    filler = fill(disk)
                    for i in range(DURING):
                        last = await producer.committed(source, f"k{i % 7}")
                    end = (await last).commit.end

                    def refused() -> bool:
                        return any(
                            log["event"] == "append failed (will retry)"
                            and log.get("journal") == OUTPUT
                            and "No space left on device" in log.get("error", "")
                            for log in logs
                        )

                    await _until("the shard's output append was refused", refused)
                    # Nothing of the refused transaction committed meanwhile.
                    assert handle.progress().read_through.get(source, 0) < end
                    filler.unlink()
                    await changed.read_through(handle, source, end)
            assert await read_counts(engine, "shard-full") == dict(producer.expected)
            # Every derived message the output holds, read-committed, up to a marker
            # published after them: one per input, each from a distinct input.
            await Producer(appends, "marker").committed(OUTPUT, "end")
            derived = await read_committed(env.client, OUTPUT, until_text="marker-1")
            texts = [e.message.text for e in derived[:-1]]
            assert len(texts) == BEFORE + DURING == len(set(texts))
