"""A shard whose recovery log holds a corrupt frame fails, naming the log and the offset,
rather than staying in BACKFILL for ever (real in-process broker, examples/word_count)."""

from __future__ import annotations

from pathlib import Path

from broker.client.appender import append
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import protocol_pb2 as pb
from examples.word_count import WordCount
from gazette_consumer.message.protobuf_framing import encode_header
from gazette_consumer.recoverylog.ops import OP_BYTES_MAX
from gazette_consumer.shard_runner import ShardRunner
from tests.gazette_consumer.recovery_testkit import create_log, words_spec
from tests.gazette_consumer.shard_testkit import Notifier, broker_env

ROOT = "/test/recovery-log-corrupt"
Code = cpb.ReplicaStatus.Code


async def test_a_frame_claiming_1_mib_fails_the_shard_naming_log_and_offset(
    tmp_path: Path,
) -> None:
    async with broker_env() as env:
        source = await env.journal("in/words-corrupt-log")
        spec = words_spec("shard-corrupt-log", source)
        log = await create_log(env, spec)
        # Some history, then a frame header claiming 1 MiB, followed by a few bytes only.
        await append(env.client, pb.AppendRequest(journal=log), b"")
        lying = encode_header(OP_BYTES_MAX) + b"not a recorded op"
        await append(env.client, pb.AppendRequest(journal=log), lying)
        changed = Notifier()
        async with ShardRunner(WordCount(), env.client, root=ROOT, data_dir=tmp_path) as runner:
            handle = runner.start(spec, on_change=changed.notify)
            await changed.until(lambda: handle.status().code == Code.FAILED)
            error = handle.status().errors[0]
    assert "CorruptLogError" in error
    assert f"recovery log {log!r} at offset 0" in error
    assert "runs past the write head" in error
