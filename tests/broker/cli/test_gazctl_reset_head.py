"""gazctl journals reset-head: the explicit recovery from INDEX_HAS_GREATER_OFFSET.

The store holds fragments that the brokers now serving the journal never took part in
(written by brokers that are gone): appends are refused until reset-head confirms the
fragment index's end, after which they land exactly there, and nothing stored is overwritten.
On a journal that is consistent already, reset-head changes nothing."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker import client
from broker.cli import gazctl
from broker.fragment.naming import sum_from_digest
from broker.fragment.stores.registry import new_registry
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import OffsetNotYetAvailableError
from tests.broker.broker_testkit import Cluster, journal_spec, replica_of

J = "reset/journal"
STORE = "file:///frags/"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    (tmp_path / "frags").mkdir()
    c = Cluster(stores=new_registry(file_root=tmp_path))
    try:
        yield c
    finally:
        await c.close()


async def run(*argv: str) -> int:
    return await gazctl.run(gazctl.parse_args(list(argv)))


async def read_all(endpoint: str, journal: str) -> bytes:
    c = client.JournalClient(endpoint)
    reader = client.RetryReader(c, pb.ReadRequest(journal=journal, offset=0, block=False))
    out = b""
    try:
        with contextlib.suppress(OffsetNotYetAvailableError):
            while chunk := await reader.read():
                out += chunk
    finally:
        await reader.close()
        await c.channels.close()
    return out


def stored(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted((root / J).rglob("*"))
        if p.is_file()
    }


async def test_reset_head_lets_appends_continue_at_the_index_end(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Brokers that are gone persisted [0, 100) and [100, 250), one under a path postfix.
    assert cluster.stores is not None
    earlier = b"a" * 100 + b"b" * 150
    for begin, end, postfix in [(0, 100, ""), (100, 250, "date=2019-11-19")]:
        content = earlier[begin:end]
        fragment = pb.Fragment(
            journal=J,
            begin=begin,
            end=end,
            sum=sum_from_digest(hashlib.sha1(content).digest()),
            compression_codec=pb.NONE,
            path_postfix=postfix,
        )
        await cluster.stores.get(STORE).put(fragment, content)
    before = stored(tmp_path / "frags")
    assert len(before) == 2

    brokers = [await cluster.start_broker(f"zone-{z}", f"broker-{z}") for z in "ab"]
    await cluster.create(journal_spec(J, replication=2, stores=[STORE]), brokers)
    for b in brokers:
        await replica_of(b, J).index.wait_first_refresh(5.0)

    # The brokers refuse to write offsets they cannot prove are unwritten.
    assert (await cluster.append(brokers[0], J, [b"lost?"])).status == pb.INDEX_HAS_GREATER_OFFSET
    assert (await cluster.append(brokers[1], J, [b"lost?"])).status == pb.INDEX_HAS_GREATER_OFFSET

    argv = ["--broker", brokers[1].endpoint, "journals", "reset-head", "-l", f"name={J}"]
    assert await run(*argv) == 0
    out, err = capsys.readouterr()
    assert [line.split() for line in out.splitlines()] == [
        ["JOURNAL", "HEAD", "OUTCOME"],
        [J, "250", "reset"],
    ]
    assert err == f"{J}: reset at offset 250\n"

    resp = await cluster.append(brokers[0], J, [b"resumed"])
    assert (resp.status, resp.commit.begin, resp.commit.end) == (pb.OK, 250, 257)
    resp = await cluster.append(brokers[1], J, [b"!"])
    assert (resp.status, resp.commit.begin) == (pb.OK, 257)
    assert await read_all(brokers[1].endpoint, J) == earlier + b"resumed!"

    # Running it again on the now consistent journal is harmless.
    assert await run(*argv) == 0
    assert capsys.readouterr().err == f"{J}: reset at offset 258\n"
    resp = await cluster.append(brokers[0], J, [b"more"])
    assert (resp.status, resp.commit.begin) == (pb.OK, 258)

    # Once the brokers persist what they hold, the earlier files are untouched and every new
    # file begins at or after offset 250.
    for b in list(cluster.brokers):
        await cluster.stop_broker(b)
    after = stored(tmp_path / "frags")
    assert {k: v for k, v in after.items() if k in before} == before
    new = [k for k in after if k not in before]
    assert new and all(int(k.rsplit("/", 1)[1].split("-")[0], 16) >= 250 for k in new)
    assert b"".join(after[k] for k in sorted(new)) == b"resumed!more"


async def test_reset_head_on_a_consistent_or_empty_journal_changes_nothing(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    b = await cluster.start_broker("zone-a", "broker-a")
    for name in ("reset/written", "reset/empty"):
        await cluster.create(journal_spec(name), [b])
    assert (await cluster.append(b, "reset/written", [b"hello"])).status == pb.OK

    assert await run("--broker", b.endpoint, "journals", "reset-head", "-l", "prefix=reset/") == 0
    out, err = capsys.readouterr()
    assert sorted(line.split() for line in out.splitlines()[1:]) == [
        ["reset/empty", "0", "empty"],
        ["reset/written", "5", "reset"],
    ]
    assert "reset/written: reset at offset 5\n" in err
    resp = await cluster.append(b, "reset/written", [b" world"])
    assert (resp.status, resp.commit.begin) == (pb.OK, 5)
    assert await read_all(b.endpoint, "reset/written") == b"hello world"


async def test_reset_head_refuses_bad_or_empty_selectors(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    b = await cluster.start_broker("zone-a", "broker-a")
    with pytest.raises(SystemExit):  # argparse: -l is required.
        gazctl.parse_args(["journals", "reset-head"])
    capsys.readouterr()
    assert await run("--broker", b.endpoint, "journals", "reset-head", "-l", "x in (") == (
        gazctl.EXIT_BAD_INPUT
    )
    assert capsys.readouterr().err.startswith("gazctl: expected")
    assert await run("--broker", b.endpoint, "journals", "reset-head", "-l", "name=a/b") == (
        gazctl.EXIT_FAILED
    )
    assert "JOURNAL_NOT_FOUND: no journals match selector 'name=a/b'" in capsys.readouterr().err
