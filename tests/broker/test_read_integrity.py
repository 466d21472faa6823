"""No corrupt byte is served as data: a real in-process broker persists three fragments of a
journal to a file:// store, then the middle fragment's file is damaged (other content of the
same length, truncated, emptied, deleted). Reads of it through gRPC (Reader, RetryReader,
blocking or not), the HTTP gateway and gazctl fail with DATA_LOSS naming the journal, the
fragment and the store, after exactly the first fragment's bytes; never as a short read."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from broker_testkit import Cluster, journal_spec, replica_of, wait_until

from broker.cli import gazctl
from broker.client.appender import append
from broker.client.reader import DataLossError, Reader
from broker.client.retry_reader import RetryReader
from broker.client.route_cache import JournalClient
from broker.fragment import naming
from broker.fragment.index import FragmentIndex
from broker.fragment.stores.registry import new_registry
from broker.http_gateway import HttpGateway
from broker.metrics import value_of
from broker.protocol import protocol_pb2 as pb
from broker.server import Broker

J = "integrity/journal"
STORE = "file:///fragments/"
# Each append is longer than the spec's fragment length, so the next one rolls the fragment:
# [0, 1542) and [1542, 3084) are persisted, [3084, 4626) stays in the spool.
FRAGMENT_LENGTH = 1024
PIECES = [bytes([ord("a") + i]) * 1541 + b"\n" for i in range(3)]
WAIT_S = 20.0
DAMAGES = ["corrupt", "truncated", "empty", "deleted"]


@dataclass
class Env:
    cluster: Cluster
    broker: Broker
    client: JournalClient
    root: Path
    codec: int

    @property
    def index(self) -> FragmentIndex:
        return replica_of(self.broker, J).index

    def middle(self) -> pb.Fragment:
        fragment = self.index.query(len(PIECES[0])).fragment
        assert fragment is not None and fragment.backing_store == STORE
        return fragment

    def path_of(self, fragment: pb.Fragment) -> Path:
        return self.root / "fragments" / naming.content_path(fragment)

    def damage(self, how: str) -> pb.Fragment:
        """Damage the middle fragment's file; return the fragment."""
        fragment = self.middle()
        path = self.path_of(fragment)
        stored = path.read_bytes()
        if how == "corrupt":  # Valid content of the same length, other bytes.
            other = PIECES[1].replace(b"b" * 10, b"B" * 10, 1)
            path.write_bytes(gzip.compress(other) if self.codec == pb.GZIP else other)
            if self.codec == pb.NONE:
                assert len(path.read_bytes()) == len(stored)
        elif how == "truncated":
            path.write_bytes(stored[: len(stored) // 2])
        elif how == "empty":
            path.write_bytes(b"")
        else:
            path.unlink()
        return fragment


@pytest.fixture(params=[pb.NONE, pb.GZIP], ids=["NONE", "GZIP"])
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Env]:
    (tmp_path / "fragments").mkdir()
    cluster = Cluster(stores=new_registry(file_root=tmp_path))
    client: JournalClient | None = None
    try:
        broker = await cluster.start_broker("zone-a", "broker-a")
        spec = journal_spec(J, length=FRAGMENT_LENGTH, codec=request.param, stores=[STORE])
        await cluster.create(spec, [broker])
        client = JournalClient(broker.endpoint)
        for piece in PIECES:
            await append(client, pb.AppendRequest(journal=J), piece)
        e = Env(cluster, broker, client, tmp_path, request.param)
        # The persister's uploads reach the index: no event to await but the index itself.
        await wait_until(lambda: e.index.query(len(PIECES[0])).file is None, WAIT_S)
        await wait_until(lambda: e.index.query(0).file is None, WAIT_S)
        yield e
    finally:
        if client is not None:
            await client.close()
        await cluster.close()


def assert_names_the_fragment(err: BaseException, fragment: pb.Fragment) -> None:
    text = str(err)
    assert J in text and naming.content_name(fragment) in text and STORE in text, text


async def read_until_error(reader: RetryReader | Reader) -> tuple[bytes, BaseException]:
    got = b""
    try:
        async with asyncio.timeout(WAIT_S):
            while True:
                chunk = await reader.read_chunk()
                if not chunk.content:
                    raise AssertionError(f"the read ended at {chunk.offset} without an error")
                assert chunk.offset == len(got)
                got += chunk.content
    except (DataLossError, AssertionError) as err:
        return got, err


@pytest.mark.parametrize("how", DAMAGES)
async def test_grpc_reads_fail_with_data_loss_after_the_good_fragment(env: Env, how: str) -> None:
    failed = value_of("gazette_read_data_loss_total", {"failure": _failure_of(how, env)})
    fragment = env.damage(how)

    reader = RetryReader(env.client, pb.ReadRequest(journal=J, offset=0))
    got, err = await read_until_error(reader)
    await reader.close()
    assert isinstance(err, DataLossError), err
    assert_names_the_fragment(err, fragment)
    # Small fragments are verified whole before their first byte is sent: not one byte of the
    # damaged fragment was served.
    assert got == PIECES[0]

    # A blocking read fails too, rather than waiting at the damaged range.
    blocking = Reader(env.client, pb.ReadRequest(journal=J, offset=len(PIECES[0]), block=True))
    with pytest.raises(DataLossError) as caught:
        async with asyncio.timeout(WAIT_S):
            await blocking.read_chunk()
    assert "DATA_LOSS" in str(caught.value)
    assert value_of("gazette_read_data_loss_total", {"failure": _failure_of(how, env)}) > failed


def _failure_of(how: str, env: Env) -> str:
    """The failure label the broker counts for a damage, before any index refresh."""
    if how == "corrupt":
        return "sha1_mismatch"
    if how == "truncated":
        return "short" if env.codec == pb.NONE else "undecodable"
    return {"empty": "empty", "deleted": "missing"}[how]


@pytest.mark.parametrize("how", ["empty", "deleted"])
async def test_after_a_listing_the_lost_range_is_data_loss_not_a_gap(env: Env, how: str) -> None:
    fragment = env.damage(how)
    # The refresher lists the store (every second): the fragment is no longer listed.
    await wait_until(lambda: bool(env.index.lost_fragments()), WAIT_S)
    (lost,) = env.index.lost_fragments()
    assert (lost.begin, lost.end) == (fragment.begin, fragment.end)

    for block in (False, True):
        reader = Reader(env.client, pb.ReadRequest(journal=J, offset=fragment.begin, block=block))
        with pytest.raises(DataLossError) as caught:
            async with asyncio.timeout(WAIT_S):
                await reader.read_chunk()
        assert_names_the_fragment(caught.value, fragment)
    reader_from_zero = RetryReader(env.client, pb.ReadRequest(journal=J, offset=0))
    got, err = await read_until_error(reader_from_zero)
    await reader_from_zero.close()
    assert isinstance(err, DataLossError) and got == PIECES[0]


@pytest.mark.parametrize("how", ["corrupt", "deleted"])
async def test_http_gateway_answers_data_loss(env: Env, how: str) -> None:
    fragment = env.damage(how)
    gateway = HttpGateway(JournalClient(env.broker.endpoint))
    port = await gateway.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/{J}"
            async with session.get(url, params={"offset": str(fragment.begin)}) as resp:
                body = await resp.text()
            assert resp.status == 500 and body.startswith("DATA_LOSS: "), (resp.status, body)
            assert naming.content_name(fragment) in body and STORE in body
            # From the start: the good fragment's bytes, then the body is cut, never ended as
            # if the journal ended there.
            async with session.get(url, params={"offset": "0"}) as resp:
                assert resp.status == 206
                got = b""
                with pytest.raises(aiohttp.ClientPayloadError):
                    async for data in resp.content.iter_any():
                        got += data
            assert got == PIECES[0]
    finally:
        await gateway.stop()


@pytest.mark.parametrize("how", ["corrupt", "empty"])
async def test_gazctl_read_exits_3_with_one_line(
    env: Env, how: str, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    fragment = env.damage(how)
    args = gazctl.parse_args(["--broker", env.broker.endpoint, "journals", "read", "-j", J])
    assert await gazctl.run(args) == gazctl.EXIT_DATA_LOSS
    out, err = capsysbinary.readouterr()
    assert out == PIECES[0]
    line = err.decode()
    assert line.startswith("gazctl: data loss: ") and line.count("\n") == 1, line
    assert naming.content_name(fragment) in line and STORE in line


async def test_a_store_outage_is_waited_out_not_read_as_an_empty_journal(env: Env) -> None:
    # The store's directory goes away (an unmounted volume): reads wait for it (UNAVAILABLE,
    # retried), and never answer an empty journal, a gap, or DATA_LOSS.
    fragments = env.root / "fragments"
    fragments.rename(env.root / "unmounted")
    reader = RetryReader(env.client, pb.ReadRequest(journal=J, offset=0, block=False))

    async def read_all() -> bytes:
        got = b""
        while len(got) < sum(map(len, PIECES)):
            chunk = await reader.read_chunk()
            assert chunk.content, f"the read ended at {chunk.offset}"
            assert chunk.offset == len(got)
            got += chunk.content
        return got

    task = asyncio.create_task(read_all())
    try:
        # The reader is retrying (its attempts fail while the store is gone).
        await wait_until(lambda: reader.restarts >= 2, WAIT_S)
        assert not task.done()
        (env.root / "unmounted").rename(fragments)
        async with asyncio.timeout(WAIT_S):
            assert await task == b"".join(PIECES)
    finally:
        task.cancel()
        await reader.close()
