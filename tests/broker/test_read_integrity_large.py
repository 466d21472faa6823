"""A stored fragment longer than 1 MiB, damaged in its middle, serves no byte through a broker:
its SHA1 can only be checked at its end, so the broker verifies it whole before streaming it
(broker/read_staging.py): from a staged scratch copy, or with no room for one, in a first pass
over the file. Read through gRPC and through the HTTP gateway, the journal yields the good
fragment before it, then DATA_LOSS naming the damaged one; never the damaged bytes."""

from __future__ import annotations

import asyncio
import gzip
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from broker_testkit import Cluster, journal_spec, replica_of, wait_until

from broker.client.appender import append
from broker.client.reader import DataLossError
from broker.client.retry_reader import RetryReader
from broker.client.route_cache import JournalClient
from broker.fragment import naming
from broker.fragment.stores.registry import new_registry
from broker.http_gateway import HttpGateway
from broker.metrics import value_of
from broker.protocol import protocol_pb2 as pb
from broker.server import Broker
from tests.small_disk import small_disk

J = "integrity/large"
STORE = "file:///fragments/"
MiB = 1 << 20
# Each append is longer than the spec's fragment length, so the next one rolls the fragment:
# [0, 1.5 MiB) and [1.5 MiB, 3 MiB) are persisted, the third stays in the spool.
FRAGMENT_LENGTH = MiB
PIECES = [(bytes([ord("a") + i]) * 1023 + b"\n") * (3 * MiB // 2048) for i in range(3)]
WAIT_S = 30.0


@dataclass
class Env:
    cluster: Cluster
    broker: Broker
    client: JournalClient
    root: Path
    codec: int

    def middle(self) -> pb.Fragment:
        fragment = replica_of(self.broker, J).index.query(len(PIECES[0])).fragment
        assert fragment is not None and fragment.backing_store == STORE
        assert fragment.end - fragment.begin > MiB
        return fragment

    def damage_middle(self) -> pb.Fragment:
        """Change one byte half-way through the middle fragment's content: valid framing and
        codec, the fragment's length, other content."""
        fragment = self.middle()
        content = bytearray(PIECES[1])
        content[len(content) // 2] = ord("B")
        path = self.root / "fragments" / naming.content_path(fragment)
        path.write_bytes(gzip.compress(bytes(content)) if self.codec == pb.GZIP else content)
        return fragment


async def start(tmp_path: Path, codec: int, **broker_config: object) -> Env:
    (tmp_path / "fragments").mkdir()
    cluster = Cluster(stores=new_registry(file_root=tmp_path))
    broker = await cluster.start_broker("zone-a", "broker-a", **broker_config)
    spec = journal_spec(J, length=FRAGMENT_LENGTH, codec=codec, stores=[STORE])
    await cluster.create(spec, [broker])
    client = JournalClient(broker.endpoint)
    for piece in PIECES:
        await append(client, pb.AppendRequest(journal=J), piece)
    env = Env(cluster, broker, client, tmp_path, codec)
    index = replica_of(broker, J).index
    # The persister's uploads reach the index: no event to await but the index itself.
    await wait_until(lambda: index.query(len(PIECES[0])).file is None, WAIT_S)
    await wait_until(lambda: index.query(0).file is None, WAIT_S)
    return env


@pytest.fixture(params=[pb.NONE, pb.GZIP], ids=["NONE", "GZIP"])
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Env]:
    e = await start(tmp_path, request.param)
    try:
        yield e
    finally:
        await e.client.close()
        await e.cluster.close()


async def read_until_error(client: JournalClient) -> tuple[bytes, BaseException | None]:
    reader = RetryReader(client, pb.ReadRequest(journal=J, offset=0, block=False))
    got = b""
    try:
        async with asyncio.timeout(WAIT_S):
            while len(got) < sum(map(len, PIECES)):
                chunk = await reader.read_chunk()
                assert chunk.content, f"the read ended at {chunk.offset} without an error"
                assert chunk.offset == len(got)
                got += chunk.content
        return got, None
    except DataLossError as err:
        return got, err
    finally:
        await reader.close()


def verified(how: str) -> float:
    return value_of("gazette_read_verified_whole_fragments_total", {"how": how})


async def test_an_intact_large_fragment_is_staged_and_read_whole(env: Env) -> None:
    staged = verified("staged")
    got, err = await read_until_error(env.client)
    assert err is None and got == b"".join(PIECES)
    # Both persisted fragments are longer than 1 MiB (the third is read from the spool).
    assert verified("staged") == staged + 2
    assert value_of("gazette_read_staged_bytes") == 0


async def test_grpc_read_serves_no_byte_of_a_large_damaged_fragment(env: Env) -> None:
    fragment = env.damage_middle()
    got, err = await read_until_error(env.client)
    assert isinstance(err, DataLossError), err
    text = str(err)
    assert naming.content_name(fragment) in text and STORE in text and "SHA1" in text, text
    assert "delivered" not in text, text
    # Exactly the good fragment before it: not one byte of the damaged one.
    assert got == PIECES[0]
    assert value_of("gazette_read_staged_bytes") == 0


async def test_http_gateway_serves_no_byte_of_a_large_damaged_fragment(env: Env) -> None:
    fragment = env.damage_middle()
    gateway = HttpGateway(JournalClient(env.broker.endpoint))
    port = await gateway.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/{J}"
            async with session.get(url, params={"offset": str(fragment.begin)}) as resp:
                body = await resp.text()
            assert resp.status == 500 and body.startswith("DATA_LOSS: "), (resp.status, body[:200])
            assert naming.content_name(fragment) in body
            async with session.get(url, params={"offset": "0"}) as resp:
                assert resp.status == 206
                got = b""
                with pytest.raises(aiohttp.ClientPayloadError):
                    async for data in resp.content.iter_any():
                        got += data
            assert got == PIECES[0]
    finally:
        await gateway.stop()


@pytest.mark.parametrize("codec", [pb.NONE, pb.GZIP], ids=["NONE", "GZIP"])
async def test_with_no_room_to_stage_a_first_pass_verifies(tmp_path: Path, codec: int) -> None:
    # stage_bytes_max=0: no room for any copy (as when other reads hold it all).
    env = await start(tmp_path, codec, stage_bytes_max=0)
    try:
        first_passes, staged = verified("first_pass"), verified("staged")
        got, err = await read_until_error(env.client)
        assert err is None and got == b"".join(PIECES)
        assert verified("first_pass") == first_passes + 2 and verified("staged") == staged

        fragment = env.damage_middle()
        got, err = await read_until_error(env.client)
        assert isinstance(err, DataLossError), err
        assert naming.content_name(fragment) in str(err) and "delivered" not in str(err)
        assert got == PIECES[0]
    finally:
        await env.client.close()
        await env.cluster.close()


async def test_a_broker_with_a_data_directory_stages_in_its_scratch(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    env = await start(tmp_path, pb.NONE, data_dir=str(data), memory_spools=False)
    try:
        # Its scratch directory made unusable (a file in its place): a read of a stored
        # fragment cannot stage it there, so it reads the stored file twice instead (verified
        # first), and gets the journal whole; so the copies go there.
        scratch = data / "spool-scratch"
        assert scratch.is_dir()
        scratch.rename(data / "moved-away")
        scratch.write_bytes(b"")
        first_passes, staged = verified("first_pass"), verified("staged")
        got, err = await read_until_error(env.client)
        assert err is None and got == b"".join(PIECES)
        assert verified("first_pass") == first_passes + 2 and verified("staged") == staged

        scratch.unlink()
        (data / "moved-away").rename(scratch)
        staged = verified("staged")
        got, err = await read_until_error(env.client)
        assert err is None and got == b"".join(PIECES)
        assert verified("staged") == staged + 2
    finally:
        await env.client.close()
        await env.cluster.close()


def take_all_but(directory: Path, keep: int) -> Path:
    """A file taking all but `keep` bytes of the free space of `directory`'s file system."""
    st = os.statvfs(directory)
    filler = directory / "filler"
    filler.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - keep))
    return filler


async def test_no_copy_is_staged_where_it_would_leave_the_disk_too_full(tmp_path: Path) -> None:
    # The data directory (spools and scratch) on a disk of its own; the store elsewhere.
    with small_disk(tmp_path / "disk", 32 * MiB) as disk:
        env = await start(tmp_path, pb.NONE, data_dir=str(disk / "data"), memory_spools=False)
        try:
            # 6 MiB free of 32: a 1.5 MiB copy would leave 4.5, under a quarter (8): each
            # stored fragment is read twice instead, and the spools keep their room.
            filler = take_all_but(disk, 6 * MiB)
            first_passes, staged = verified("first_pass"), verified("staged")
            got, err = await read_until_error(env.client)
            assert err is None and got == b"".join(PIECES)
            assert verified("first_pass") == first_passes + 2 and verified("staged") == staged
            await append(env.client, pb.AppendRequest(journal=J), b"appends go on\n")

            filler.unlink()
            got, err = await read_until_error(env.client)
            assert err is None and got.startswith(b"".join(PIECES))
            # (The append rolled the third fragment: it may be stored, and staged, by now.)
            assert verified("staged") >= staged + 2
        finally:
            await env.client.close()
            await env.cluster.close()
