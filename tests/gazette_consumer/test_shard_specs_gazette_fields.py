"""Fields of Gazette's current Shard protocol, over real gRPC and the embedded keyspace:
ListResponse.Shard.create_revision (the spec's etcd create revision) and
ApplyRequest.Change.primary_hints (hints stored with the upsert, in the JSON Gazette's consumers
read, where GetHints and a recovering primary find them)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from broker.protocol import consumer_pb2 as cpb
from broker.protocol import recorded_op_pb2 as rpb
from gazette_consumer.hints import HintStore
from gazette_consumer.shard_client import ShardClient, ShardRequestError, upsert
from tests.gazette_consumer.consumer_testkit import Group, Node, shard_spec

LOG = "logs/shard-a"
HINTS = rpb.FSMHints(
    log=LOG,
    live_nodes=[
        rpb.FnodeSegments(
            fnode=1,
            segments=[
                rpb.Segment(
                    author=0x1234,
                    first_seq_no=1,
                    first_offset=0,
                    first_checksum=0x89ABCDEF,
                    last_seq_no=3,
                    last_offset=100,
                )
            ],
        )
    ],
    properties=[rpb.Property(path="/IDENTITY", content="shard-a\n")],
)


def logged_spec(shard: str = "shard-a") -> cpb.ShardSpec:
    spec = shard_spec(shard)
    spec.recovery_log_prefix = "logs"
    spec.hint_prefix = "/gazette/hints"
    spec.hint_backups = 1
    return spec


@pytest.fixture
async def one() -> AsyncIterator[tuple[Group, Node, ShardClient]]:
    group = await Group.open()
    try:
        node = await group.join("zone-a", "consumer-a")
        async with ShardClient(node.member.endpoint) as client:
            yield group, node, client
    finally:
        await group.close()


async def test_list_reports_create_and_mod_revisions(
    one: tuple[Group, Node, ShardClient],
) -> None:
    _, _, client = one
    spec = shard_spec("shard-a")
    created = (await client.apply([upsert(spec)])).header.etcd.revision
    spec.hot_standbys = 1
    updated = (await client.apply([upsert(spec, created)])).header.etcd.revision
    [listed] = (await client.list_shards()).shards
    assert (listed.create_revision, listed.mod_revision) == (created, updated)
    assert created < updated


async def test_primary_hints_are_stored_with_the_upsert(
    one: tuple[Group, Node, ShardClient],
) -> None:
    group, _, client = one
    applied = await client.apply(
        [cpb.ApplyRequest.Change(upsert=logged_spec(), primary_hints=HINTS)]
    )

    # One transaction: the spec and its hints at the same revision.
    stored = await group.admin.range(b"/gazette/hints/shard-a.primary")
    (kv,) = stored.kvs
    assert kv.mod_revision == applied.header.etcd.revision
    # As Go's encoding/json writes the generated struct, which Gazette's consumers unmarshal.
    assert json.loads(kv.value) == {
        "log": LOG,
        "live_nodes": [
            {
                "fnode": 1,
                "segments": [
                    {
                        "author": 0x1234,
                        "first_seq_no": 1,
                        "first_checksum": 0x89ABCDEF,
                        "last_seq_no": 3,
                        "last_offset": 100,
                    }
                ],
            }
        ],
        "properties": [{"path": "/IDENTITY", "content": "shard-a\n"}],
    }
    # GetHints serves them; a recovering primary starts from them.
    hints = await client.get_hints("shard-a")
    assert hints.primary_hints.hints == HINTS
    assert await HintStore(group.admin).fetch(logged_spec()) == HINTS


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (
            cpb.ApplyRequest.Change(delete="shard-a", expect_mod_revision=-1, primary_hints=HINTS),
            r"changes\[0\]\.primary_hints: may be set only with an upsert, not a delete",
        ),
        (
            cpb.ApplyRequest.Change(upsert=shard_spec("shard-a"), primary_hints=HINTS),
            r"changes\[0\]\.primary_hints: the shard has no recovery log",
        ),
        (
            cpb.ApplyRequest.Change(
                upsert=logged_spec(), primary_hints=rpb.FSMHints(log="logs/other")
            ),
            r"changes\[0\]\.primary_hints\.log: must be hints of the shard's recovery log "
            r"'logs/shard-a' \(got 'logs/other'\)",
        ),
        (
            cpb.ApplyRequest.Change(
                upsert=logged_spec(),
                primary_hints=rpb.FSMHints(
                    log=LOG, live_nodes=[rpb.FnodeSegments(fnode=2, segments=[rpb.Segment()])]
                ),
            ),
            r"changes\[0\]\.primary_hints: live_nodes\[0\]: first segment must begin at fnode 2",
        ),
    ],
    ids=["with-delete", "no-recovery-log", "other-log", "unplayable"],
)
async def test_bad_hints_are_refused_and_nothing_is_written(
    one: tuple[Group, Node, ShardClient], change: cpb.ApplyRequest.Change, error: str
) -> None:
    group, _, client = one
    with pytest.raises(ShardRequestError, match=error):
        await client.apply([change])
    assert (await client.list_shards()).shards == []
    assert (await group.admin.range(b"/gazette/hints/", b"/gazette/hints0")).kvs == ()
    # A valid change still applies.
    await client.apply([upsert(logged_spec())])
