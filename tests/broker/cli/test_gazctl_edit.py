"""``gazctl journals edit`` and ``gazctl shards edit`` against an in-process broker and consumer
member, with a scripted $EDITOR program (editor_testkit.py): edits are applied on save, empty or
unchanged files cancel, refused edits reopen the editor with the error, and the revisions listed
fence the apply against a concurrent change."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker import client
from broker.cli import gazctl
from broker.protocol import protocol_pb2 as pb
from tests.broker.broker_testkit import Cluster, journal_spec
from tests.broker.cli.editor_testkit import Empty, Fail, Keep, Replace, Run, ScriptedEditor
from tests.gazette_consumer.consumer_testkit import Group, Node, shard_spec

pytestmark = pytest.mark.usefixtures("no_editor_env")


REPO_ROOT = str(Path(__file__).resolve().parents[3])


@pytest.fixture
def no_editor_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GAZ_EDITOR", raising=False)
    monkeypatch.delenv("EDITOR", raising=False)
    # Edit files go to the test's directory, where a test can tell whether one was kept.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def edit_files(directory: Path) -> list[str]:
    return sorted(p.read_text() for p in directory.glob("gazctl-*-edit-*"))


@pytest.fixture
async def broker(cluster: Cluster) -> str:
    b = await cluster.start_broker("zone-a", "broker-a")
    for name in ("edit/one", "edit/two", "other/three"):
        await cluster.create(journal_spec(name), [b])
    return b.endpoint


async def run(*argv: str) -> int:
    return await gazctl.run(gazctl.parse_args(list(argv)))


async def specs(endpoint: str, selector: str = "") -> dict[str, pb.JournalSpec]:
    c = client.JournalClient(endpoint)
    try:
        listing = await client.list_journals(c, selector or None)
    finally:
        await c.channels.close()
    return {j.spec.name: j.spec for j in listing.journals}


def use(monkeypatch: pytest.MonkeyPatch, editor: ScriptedEditor) -> None:
    monkeypatch.setenv("EDITOR", editor.command)


async def test_journals_edit_applies_the_saved_specs(
    broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    before = await specs(broker)
    editor = ScriptedEditor(tmp_path, [Replace("length: 1048576", "length: 2097152")])
    use(monkeypatch, editor)
    assert await run("--broker", broker, "journals", "edit", "-l", "prefix=edit/") == 0
    assert edit_files(tmp_path) == []  # Applied: the file is removed.
    out = capsys.readouterr().out
    assert [line.split()[:2] for line in out.splitlines()] == [
        ["NAME", "ACTION"],
        ["edit/one", "upsert"],
        ["edit/two", "upsert"],
    ]
    # The editor saw a journal space of the selected journals only, with their revisions.
    (seen,) = editor.seen
    assert seen.startswith("# ") and "name: edit/\n" in seen
    assert "other/three" not in seen and seen.count("revision: ") == 2
    after = await specs(broker)
    assert after["edit/one"].fragment.length == 2 << 20  # The first was edited...
    assert after["edit/two"] == before["edit/two"]  # ...the other applied unchanged.
    assert after["other/three"] == before["other/three"]


async def test_gaz_editor_takes_precedence(
    broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    editor = ScriptedEditor(tmp_path, [Replace("replication: 1", "replication: 1\n  flags: 4")])
    monkeypatch.setenv("GAZ_EDITOR", editor.command)
    monkeypatch.setenv("EDITOR", "false")
    assert await run("--broker", broker, "journals", "edit", "-l", "name=edit/one") == 0
    assert (await specs(broker))["edit/one"].flags == pb.JournalSpec.O_RDWR


@pytest.mark.parametrize(("step", "reason"), [(Empty(), "empty file"), (Keep(), "nothing changed")])
async def test_empty_or_unchanged_file_cancels(
    broker: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    step: object,
    reason: str,
) -> None:
    before = await specs(broker)
    use(monkeypatch, ScriptedEditor(tmp_path, [step]))
    assert await run("--broker", broker, "journals", "edit", "-l", "prefix=edit/") == 0
    out, err = capsys.readouterr()
    assert out == "" and err == f"gazctl: cancelled; {reason}\n"
    assert await specs(broker) == before
    assert edit_files(tmp_path) == []


async def test_refused_edits_reopen_the_editor_with_the_error(
    broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    editor = ScriptedEditor(
        tmp_path,
        [
            Replace("replication: 1", "replication: many"),  # Refused: not an integer.
            Replace("replication: many", "replication: 3"),  # Fixed on the second opening.
        ],
    )
    use(monkeypatch, editor)
    assert await run("--broker", broker, "journals", "edit", "-l", "name=edit/one") == 0
    first, second = editor.seen
    assert "# Error:" not in first
    assert "# Error:" in second and "replication" in second
    assert "replication: many" in second  # The user's text, not the listing, is reopened.
    assert "edit refused, reopening the editor" in capsys.readouterr().err
    assert (await specs(broker))["edit/one"].replication == 3


async def test_a_concurrent_change_fences_the_apply(
    broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # While the user edits, another operator changes the journal: the edit, made on the old
    # revision, is refused; reopened, the user gives up, and the other change stands.
    concurrent = tmp_path / "concurrent.yaml"
    concurrent.write_text(
        "name: edit/one\nreplication: 2\nfragment: {length: 1048576, compression_codec: NONE,"
        " refresh_interval: 1s}\n"
    )
    apply = [sys.executable, "-m", "broker.cli.gazctl", "--broker", broker, "journals", "apply"]
    editor = ScriptedEditor(
        tmp_path,
        [
            Run([*apply, "-f", str(concurrent)], Replace("replication: 1", "replication: 3")),
            Keep(),
        ],
    )
    use(monkeypatch, editor)
    monkeypatch.setenv("PYTHONPATH", REPO_ROOT)
    assert await run("--broker", broker, "journals", "edit", "-l", "name=edit/one") == 1
    err = capsys.readouterr().err
    assert "ETCD_TRANSACTION_FAILED" in editor.seen[1]
    last = err.strip().splitlines()[-1]
    assert last.startswith("gazctl: cancelled with no change to the refused edits")
    (saved,) = edit_files(tmp_path)
    assert last.endswith(".yaml") and "replication: 3" in saved  # The user's edits are kept.
    assert (await specs(broker))["edit/one"].replication == 2


async def test_failed_editor_or_no_match_is_an_error(
    broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    before = await specs(broker)
    use(monkeypatch, ScriptedEditor(tmp_path, [Fail(3)]))
    assert await run("--broker", broker, "journals", "edit", "-l", "name=edit/one") == 1
    err = capsys.readouterr().err
    assert "exited with status 3; nothing applied" in err and err.count("\n") == 1

    assert await run("--broker", broker, "journals", "edit", "-l", "name=nope") == 1
    assert "no journals match selector 'name=nope'" in capsys.readouterr().err
    assert await run("--broker", broker, "journals", "edit", "-l", "name in (") == 2
    assert await specs(broker) == before


# --- shards edit ------------------------------------------------------------------------------


@pytest.fixture
async def member() -> AsyncIterator[Node]:
    group = await Group.open()
    try:
        node = await group.join("zone-a", "consumer-a")
        for shard in ("edit-000", "edit-001"):
            await group.put_shard(shard_spec(shard, sources=("in/words",)))
        yield node
    finally:
        await group.close()


async def shard_specs(node: Node) -> dict[str, object]:
    from gazette_consumer.shard_client import ShardClient

    async with ShardClient(node.member.endpoint) as shards:
        listing = await shards.list_shards()
    return {s.spec.id: s.spec for s in listing.shards}


async def test_shards_edit_applies_then_fences(
    member: Node,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    endpoint = member.member.endpoint
    editor = ScriptedEditor(
        tmp_path,
        [
            Replace("id: edit-001", "id: edit-001\n  hot_standbys: 1"),
            Replace("revision: ", "revision: 9"),  # A revision not yet reached: refused...
            Empty(),  # ...and the user cancels.
        ],
    )
    use(monkeypatch, editor)
    argv = ["shards", "--consumer", endpoint, "edit", "-l", "id=edit-001"]
    assert await run(*argv) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split()[:2] == ["edit-001", "upsert"]
    got = await shard_specs(member)
    assert got["edit-001"].hot_standbys == 1  # type: ignore[attr-defined]
    assert got["edit-000"].hot_standbys == 0  # type: ignore[attr-defined]

    assert await run(*argv) == 0  # Cancelled by the empty file, after the refusal.
    assert "# Error: ETCD_TRANSACTION_FAILED: applying shard changes" in editor.seen[2]
    assert await shard_specs(member) == got
