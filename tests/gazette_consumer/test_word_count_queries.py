"""An application's own gRPC services in the consumer processes (Application.register_services,
as ``gazette-consumer serve`` wires them): examples/word_count serves queries of its shards'
committed counts from every process, routed to each shard's primary, as Gazette's word-count
serves its n-gram counts. Two consumer processes (in-process members, real shards with
recovery logs, one embedded keyspace, a real broker)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from broker.client.append_service import AppendService
from broker.protocol.status import ShardNotFoundError
from examples.word_count import WordCount
from examples.word_count.queries import QUERY, query_counts
from gazette_consumer.member import ConsumerConfig, ConsumerMember
from gazette_consumer.runner import ShardRuntime, application_services, shard_factory
from gazette_consumer.shard_client import ShardClient, upsert
from tests.gazette_consumer.recovery_testkit import Texts, create_log, words_spec
from tests.gazette_consumer.shard_testkit import BrokerEnv, broker_env

ROOT = "/test/word-count-queries"


@contextlib.asynccontextmanager
async def consumer(env: BrokerEnv, suffix: str, data_dir: Path) -> AsyncIterator[ConsumerMember]:
    """One consumer process of WordCount, wired as ``gazette-consumer serve`` wires it."""
    app = WordCount()
    backend = env.cluster.store.connect()
    runtime = ShardRuntime(app, ROOT, env.broker.endpoint, backend, str(data_dir))
    try:
        async with shard_factory(runtime) as start_shard:
            holder: list[ConsumerMember] = []
            member = ConsumerMember(
                backend,
                ConsumerConfig(zone="zone-a", suffix=suffix, root=ROOT),
                start_shard,
                add_services=application_services(app, lambda: holder[0]),
            )
            holder.append(member)
            await member.start()
            try:
                yield member
            finally:
                await member.stop(graceful=False)
    finally:
        await backend.close()


async def test_every_process_answers_queries_of_every_shard(tmp_path: Path) -> None:
    async with broker_env() as env, AppendService(env.client) as appends:
        sources = {shard: await env.journal(f"in/{shard}") for shard in ("shard-a", "shard-b")}
        specs = {shard: words_spec(shard, source) for shard, source in sources.items()}
        for spec in specs.values():
            await create_log(env, spec)
        async with (
            consumer(env, "consumer-1", tmp_path / "c1") as one,
            consumer(env, "consumer-2", tmp_path / "c2") as two,
        ):
            async with ShardClient(one.endpoint) as shards:
                await shards.apply([upsert(spec) for spec in specs.values()])
                texts = {shard: Texts(appends) for shard in specs}
                await texts["shard-a"].send(sources["shard-a"], ["the quick fox", "The dog"])
                end_b = await texts["shard-b"].send(sources["shard-b"], ["a fox", "fox"])
                end_a = await texts["shard-a"].send(sources["shard-a"], ["fox"])
                # Committed (and acknowledged) through these offsets.
                await shards.stat("shard-a", {sources["shard-a"]: end_a})
                await shards.stat("shard-b", {sources["shard-b"]: end_b})

            words = ["fox", "the", "dog", "a", "absent"]
            for shard, sent in texts.items():
                expected = {w: sent.expected.get(w, 0) for w in words}
                # Whichever process is asked: the primary answers, or is asked by the other.
                for member in (one, two):
                    assert await query_counts(member.endpoint, shard, words) == expected
            assert await query_counts(two.endpoint, "shard-a", ["FOX"]) == {"fox": 2}

            with pytest.raises(ShardNotFoundError):
                await query_counts(one.endpoint, "shard-zz", ["fox"])
            async with grpc.aio.insecure_channel(one.endpoint.removeprefix("http://")) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await ch.unary_unary(QUERY)(b'{"shard": "shard-a", "words": "fox"}')
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "words: must be a list of strings" in (caught.value.details() or "")
