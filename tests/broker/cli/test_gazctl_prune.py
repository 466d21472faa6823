"""gazctl journals prune against an in-process broker and a file:// store: fragments past their
journal's retention are deleted from the store (or listed, with --dry-run), the fragment
holding the journal's head and unpersisted content never are, journals without retention keep
everything, the selector limits the journals touched, and brokers' indexes drop what was
pruned at their next store listing."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.cli import gazctl
from broker.cli.prune import plan_prune
from broker.fragment.naming import content_path, sum_from_digest
from broker.fragment.stores.registry import new_registry
from broker.protocol import protocol_pb2 as pb
from broker.server import Broker
from tests.broker.broker_testkit import Cluster, journal_spec, replica_of, wait_until

STORE = "file:///frags/"
DAY = 86400
NOW = time.time()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    (tmp_path / "frags").mkdir()
    c = Cluster(stores=new_registry(file_root=tmp_path))
    try:
        yield c
    finally:
        await c.close()


async def persist(
    cluster: Cluster,
    root: Path,
    journal: str,
    begin: int,
    end: int,
    age_s: float,
    postfix: str = "",
) -> Path:
    """A fragment file of [begin, end) written `age_s` ago (as an earlier broker would have),
    under an optional path postfix."""
    content = bytes([begin % 251]) * (end - begin)
    fragment = pb.Fragment(
        journal=journal,
        begin=begin,
        end=end,
        sum=sum_from_digest(hashlib.sha1(content).digest()),
        compression_codec=pb.NONE,
        path_postfix=postfix,
    )
    assert cluster.stores is not None
    await cluster.stores.get(STORE).put(fragment, content)
    path = root / "frags" / content_path(fragment)
    os.utime(path, (NOW - age_s, NOW - age_s))
    return path


def spec(name: str, retention_s: int) -> pb.JournalSpec:
    out = journal_spec(name, stores=[STORE])
    out.fragment.retention.CopyFrom(Duration(seconds=retention_s))
    return out


async def run(*argv: str) -> int:
    return await gazctl.run(gazctl.parse_args(list(argv)))


@pytest.fixture
async def journals(cluster: Cluster, tmp_path: Path) -> dict[str, list[Path]]:
    """Three journals under prune/ and one elsewhere, all served by one broker."""
    files = {
        "prune/old": [  # Retention one day: the first two go; the third holds the head.
            await persist(cluster, tmp_path, "prune/old", 0, 100, 10 * DAY),
            await persist(cluster, tmp_path, "prune/old", 100, 200, 5 * DAY, "date=2019-11-19"),
            await persist(cluster, tmp_path, "prune/old", 200, 300, 3 * DAY),
        ],
        "prune/young": [  # The first goes; the second is young (and the head).
            await persist(cluster, tmp_path, "prune/young", 0, 50, 10 * DAY),
            await persist(cluster, tmp_path, "prune/young", 50, 80, 3600),
        ],
        "prune/forever": [  # No retention: kept however old.
            await persist(cluster, tmp_path, "prune/forever", 0, 10, 100 * DAY),
            await persist(cluster, tmp_path, "prune/forever", 10, 20, 100 * DAY),
        ],
        "other/journal": [  # Not selected.
            await persist(cluster, tmp_path, "other/journal", 0, 10, 100 * DAY),
            await persist(cluster, tmp_path, "other/journal", 10, 20, 100 * DAY),
        ],
    }
    b = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False)
    for name, retention in [
        ("prune/old", DAY),
        ("prune/young", DAY),
        ("prune/forever", 0),
        ("other/journal", DAY),
    ]:
        await cluster.create(spec(name, retention), [b])
        await replica_of(b, name).index.wait_first_refresh(5.0)
    # Content no store holds yet is never pruned (it has no file).
    assert (await cluster.append(b, "prune/young", [b"local"], offset=80)).status == pb.OK
    return files


def table(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines()[1:]]


async def test_dry_run_lists_and_deletes_nothing(
    journals: dict[str, list[Path]],
    cluster: Cluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    b = cluster.brokers[0]
    argv = ["--broker", b.endpoint, "journals", "prune", "-l", "prefix=prune/", "--dry-run"]
    assert await run(*argv, "--file-root", str(tmp_path)) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0].split() == [
        c.upper() for c in ("journal", "begin", "end", "bytes", "age", "store", "path", "action")
    ]
    rows = table(out)
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("prune/old", "0", "100", "100"),
        ("prune/old", "100", "200", "100"),
        ("prune/young", "0", "50", "50"),
    ]
    assert {" ".join(r[-2:]) for r in rows} == {"would delete"}
    assert rows[0][4] == "10d0h"  # Its age.
    assert "prune/old: would delete 2 of 3 fragments (200 of 300 bytes; retention 1d0h)" in err
    assert "prune/forever: would delete 0 of 2 fragments (0 of 20 bytes; retention none)" in err
    assert "would delete 3 fragments (250 bytes) of 3 journals" in err
    assert all(p.exists() for paths in journals.values() for p in paths)


async def test_prune_deletes_aged_fragments_but_never_the_head(
    journals: dict[str, list[Path]],
    cluster: Cluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    b: Broker = cluster.brokers[0]
    argv = ["--broker", b.endpoint, "journals", "prune", "-l", "prefix=prune/", "--format", "json"]
    assert await run(*argv, "--file-root", str(tmp_path)) == 0
    out, _ = capsys.readouterr()
    assert '"action": "deleted"' in out and '"path": "prune/old/' in out
    kept = {name: [p.exists() for p in paths] for name, paths in journals.items()}
    assert kept == {
        "prune/old": [False, False, True],
        "prune/young": [False, True],
        "prune/forever": [True, True],
        "other/journal": [True, True],
    }

    # Brokers drop pruned fragments from their index at the next listing of the store.
    index = replica_of(b, "prune/old").index
    await wait_until(lambda: [f.begin for f in index.fragments()] == [200])
    # Pruning again finds nothing more to delete.
    assert await run(*argv[:-2], "--file-root", str(tmp_path)) == 0
    _, err = capsys.readouterr()
    assert "prune/old: deleted 0 of 1 fragments" in err


async def test_selector_errors(
    journals: dict[str, list[Path]], cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    b = cluster.brokers[0]
    assert (
        await run("--broker", b.endpoint, "journals", "prune", "-l", "a b ==")
        == gazctl.EXIT_BAD_INPUT
    )
    assert "expected" in capsys.readouterr().err
    assert (
        await run("--broker", b.endpoint, "journals", "prune", "-l", "name=no/such")
        == gazctl.EXIT_FAILED
    )
    err = capsys.readouterr().err
    assert err == "gazctl: JOURNAL_NOT_FOUND: no journals match selector 'name=no/such'\n"
    assert all(p.exists() for paths in journals.values() for p in paths)


def test_plan_keeps_head_local_and_young_fragments() -> None:
    s = spec("a/journal", DAY)

    def frag(begin: int, end: int, age: float, store: str = STORE) -> pb.Fragment:
        return pb.Fragment(
            journal="a/journal",
            begin=begin,
            end=end,
            backing_store=store,
            mod_time=int(NOW - age) if store else 0,
        )

    fragments = [
        frag(0, 10, 2 * DAY),
        frag(10, 20, DAY),
        frag(20, 30, DAY - 60),
        frag(30, 40, 9 * DAY),
        frag(40, 50, 0, store=""),
    ]
    plan = plan_prune(s, fragments, NOW)
    # Exactly a retention old counts as aged; [30, 40) is the last persisted one (the head).
    assert [(f.begin, f.end) for f in plan.aged] == [(0, 10), (10, 20)]
    assert (plan.bytes_aged, plan.bytes_total) == (20, 50)
    s.fragment.retention.CopyFrom(Duration(seconds=-1))
    assert plan_prune(s, fragments, NOW).aged == []
