"""gazctl journals suspend and gazctl journals store-health (Gazette's commands and flags), and
reset-head of suspended journals, against in-process brokers running the allocator."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.cli import gazctl
from broker.client.appender import append
from broker.client.route_cache import JournalClient
from broker.fragment.stores.registry import new_registry
from broker.protocol import protocol_pb2 as pb
from broker.testing.cluster_state import journals_ready, wait_until
from tests.broker.broker_testkit import ROOT, Cluster, journal_spec
from tests.broker.test_broker_handoff import allocating, mirror
from tests.broker.test_broker_suspend import spec_of

STORE = "file:///frags/"
wait_s = 20.0


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


async def test_store_health(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    broker = await cluster.start_broker("zone-a", "broker-a")
    at = ("--broker", broker.endpoint, "journals")

    assert await run(*at, "store-health", STORE) == 0
    assert capsys.readouterr().out == f"Fragment store {STORE} is healthy\n"
    assert await run(*at, "store-health", "--check-delete-prefix", "recovery/", STORE) == 0
    assert await run(*at, "fragment-store-health", "--check-delete-prefix", "", STORE) == 0
    capsys.readouterr()

    # A directory that is not there (an unmounted volume): unhealthy, one line saying why.
    assert await run(*at, "store-health", "file:///missing/") == gazctl.EXIT_FAILED
    err = capsys.readouterr().err
    assert err.startswith("gazctl: FRAGMENT_STORE_UNHEALTHY: fragment store file:///missing/:")
    assert "health check PUT failed" in err and len(err.splitlines()) == 1

    # A bad prefix is refused by the broker, naming the field.
    assert await run(*at, "store-health", "--check-delete-prefix", "p", STORE) == gazctl.EXIT_FAILED
    err = capsys.readouterr().err
    assert "INVALID_ARGUMENT" in err and "check_delete_prefix: must end in '/'" in err


async def test_suspend(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    brokers = [await cluster.start_broker("zone-a", f"broker-{i}") for i in range(2)]
    written, unwritten = "suspend/written", "suspend/unwritten"
    async with allocating(brokers), mirror(cluster) as ks:
        for name in (written, unwritten):
            spec = journal_spec(name, replication=2, stores=[STORE])
            spec.labels.labels.add(name="app", value="test")
            await cluster.put_spec(spec)
        await wait_until(ks, journals_ready(ks, ROOT, [written, unwritten], 2), wait_s)
        c = JournalClient(brokers[0].endpoint)
        await append(c, pb.AppendRequest(journal=written), b"content")
        await c.close()
        at = ("--broker", brokers[0].endpoint, "journals", "suspend", "-l", "app=test")

        # Content not yet persisted stays served; the journal never written is suspended.
        assert await run(*at, "--format", "json") == 0
        out = capsys.readouterr().out
        assert f'"journal": "{written}",\n    "status": "not suspended"' in out
        assert f'"journal": "{unwritten}",\n    "status": "suspended"' in out
        assert spec_of(ks, written).suspend.level == pb.JournalSpec.Suspend.NONE
        assert spec_of(ks, unwritten).suspend.level == pb.JournalSpec.Suspend.FULL

        # --force suspends it anyway (PARTIAL: its content stays readable from one replica).
        # The FULL one is skipped, as Gazette's command skips it.
        assert await run(*at, "--force") == 0
        out = capsys.readouterr().out
        assert written in out and unwritten not in out and "suspended" in out
        assert spec_of(ks, written).suspend == pb.JournalSpec.Suspend(
            level=pb.JournalSpec.Suspend.PARTIAL, offset=7
        )

        # reset-head resumes neither (Gazette's SUSPEND_KEEP): the PARTIAL journal is reset
        # through its one replica, the FULL one (no replica) is skipped.
        reset = ("--broker", brokers[0].endpoint, "journals", "reset-head", "-l", "app=test")
        assert await run(*reset, "--format", "json") == 0
        out = capsys.readouterr().out
        assert f'"journal": "{written}",\n    "head": 7,\n    "outcome": "reset"' in out
        assert f'"journal": "{unwritten}",\n    "head": 0,\n    "outcome": "suspended"' in out
        assert spec_of(ks, written).suspend.level == pb.JournalSpec.Suspend.PARTIAL
        assert spec_of(ks, unwritten).suspend.level == pb.JournalSpec.Suspend.FULL

        assert (
            await run("--broker", brokers[0].endpoint, "journals", "suspend", "-l", "app=none") == 1
        )
        assert "no journals match selector 'app=none'" in capsys.readouterr().err


async def test_suspend_reports_quorum_journals_without_asking_them(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by review: a quorum journal's leader refuses suspension (not built), and its
    error failed the whole command, the records of the others unprinted. Quorum journals are
    reported as they are, and not asked."""
    brokers = [await cluster.start_broker("zone-a", f"broker-{i}") for i in range(2)]
    quorum, plain = "suspend/quorum", "suspend/plain"
    async with allocating(brokers), mirror(cluster) as ks:
        for name, labels in (
            (quorum, [("app", "mixed"), ("gazette.dev/replication-mode", "quorum")]),
            (plain, [("app", "mixed")]),
        ):
            spec = journal_spec(name, replication=2, stores=[STORE])
            for key, value in labels:
                spec.labels.labels.add(name=key, value=value)
            await cluster.put_spec(spec)
        await wait_until(ks, journals_ready(ks, ROOT, [plain], 2), wait_s)
        at = ("--broker", brokers[0].endpoint, "journals", "suspend", "-l", "app=mixed")
        assert await run(*at, "--format", "json") == 0
        out = capsys.readouterr().out
        assert f'"journal": "{quorum}",\n    "status": "not suspended (quorum)"' in out
        assert f'"journal": "{plain}",\n    "status": "suspended"' in out
        assert spec_of(ks, quorum).suspend.level == pb.JournalSpec.Suspend.NONE
