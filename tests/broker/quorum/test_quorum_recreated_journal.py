"""A quorum journal deleted and re-created under the same name (docs/design/quorum.md,
Remaining 3) is another journal: its spec key's create revision differs. Its members must not
replay the earlier journal's log files, nor follow the earlier journal's term register or
member record: they start fresh, and the new journal's first append lands at offset 0."""

from __future__ import annotations

from pathlib import Path

from broker import metrics
from broker.keyspace.embedded import EmbeddedStore
from broker.quorum.register import TermRecord
from broker.quorum_shell.journals import open_member_log
from broker.quorum_shell.log_file import log_path
from broker.quorum_shell.member_dir import (
    JOURNAL_FILE_NAME,
    load_incarnation,
    read_journal_revision,
    retired_dir,
)
from broker.quorum_shell.member_registry import MemberRegistry
from broker.quorum_shell.term_register import KeyspaceTermRegister
from tests.broker.quorum.quorum_nodes_testkit import (
    JOURNAL_REVISION,
    NAMES,
    ROOT,
    Cluster,
    J,
    append_all,
)

RECREATED_REVISION = JOURNAL_REVISION + 100


async def test_a_recreated_journal_starts_fresh(quorum_nodes: Cluster) -> None:
    c = quorum_nodes
    for name in NAMES:
        await c.start(name)
    old = bytearray()
    await append_all(c, "old", 3, old)
    old_term = max(n.node.member.term for n in c.live.values())
    for name in NAMES:
        await c.kill(name)
    removed_before = metrics.value_of(
        "gazette_quorum_log_opened_total", {"outcome": "earlier_journal"}
    )
    # The journal is deleted and created again: the same name, another spec key revision.
    c.journal_revision = RECREATED_REVISION
    for name in NAMES:
        await c.start(name)
    new = bytearray()
    await append_all(c, "new", 2, new)  # the first lands at offset 0
    for live in c.live.values():
        node = live.node
        assert node.join_decision is not None and not node.join_decision.lost
        await c.until(lambda n=node: n.commit_offset == len(new), "every member commits")
        assert node.read_committed() == bytes(new)
        assert node.member.term > old_term  # terms never go back, whatever the journal
        assert read_journal_revision(c.member_dir(node.name)) == RECREATED_REVISION
        # The earlier journal's log is kept aside, whole: a revision that changed without
        # the journal being re-created (etcd's keys copied) must not lose committed entries.
        aside = retired_dir(c.data_dir(node.name), J, JOURNAL_REVISION)
        assert read_journal_revision(aside) == JOURNAL_REVISION
        assert (aside / "log").stat().st_size > 0
    assert metrics.value_of(
        "gazette_quorum_log_opened_total", {"outcome": "earlier_journal"}
    ) == removed_before + len(NAMES)


async def test_the_earlier_journals_register_is_read_as_no_leader(tmp_path: Path) -> None:
    store = EmbeddedStore()
    backend = store.connect()
    old = KeyspaceTermRegister(backend, ROOT, J, NAMES, JOURNAL_REVISION)
    written = await old.compare_and_swap(0, TermRecord(4, "m0!coordinator", NAMES, "m0"))
    assert written.ok
    assert (await old.read()).record.leader == "m0"
    route = ("m1", "m2", "m3")
    new = KeyspaceTermRegister(backend, ROOT, J, route, RECREATED_REVISION)
    read = await new.read()
    assert read.record == TermRecord(4, "", route) and read.revision == written.current.revision
    claimed = await new.compare_and_swap(read.revision, TermRecord(5, "m1!coordinator", route))
    assert claimed.ok and (await new.read()).record == TermRecord(5, "m1!coordinator", route)
    # A record written before journal identities existed is taken as the current journal's.
    unscoped = KeyspaceTermRegister(backend, ROOT, "other", NAMES)
    await unscoped.compare_and_swap(0, TermRecord(2, "m0!coordinator", NAMES, "m0"))
    scoped = KeyspaceTermRegister(backend, ROOT, "other", NAMES, RECREATED_REVISION)
    assert (await scoped.read()).record.leader == "m0"
    await backend.close()


async def test_the_earlier_journals_members_are_forgotten(tmp_path: Path) -> None:
    store = EmbeddedStore()
    backend = store.connect()
    data_dir = str(tmp_path / "b")
    incarnation = load_incarnation(data_dir)
    old = MemberRegistry(backend, ROOT, J, JOURNAL_REVISION)
    log_file, joiner = open_member_log(data_dir, J, "m0", incarnation, old)
    assert not (await joiner.join()).lost
    log_file.close()
    assert (await old.read())[0].members == {"m0": incarnation}
    new = MemberRegistry(backend, ROOT, J, RECREATED_REVISION)
    assert (await new.read())[0].members == {}
    # The same disk loses its log: for the earlier journal it would be lost; for the new one,
    # which it never joined, it joins fresh.
    log_path(data_dir, J).unlink()
    (log_path(data_dir, J).parent / JOURNAL_FILE_NAME).unlink()
    log_file, joiner = open_member_log(data_dir, J, "m0", incarnation, new)
    assert not (await joiner.join()).lost
    log_file.close()
    await backend.close()


def test_only_the_member_files_are_removed(tmp_path: Path) -> None:
    """A journal `a/b` keeps its directory inside `a`'s: re-creating `a` removes `a`'s files
    only."""
    store = EmbeddedStore()
    backend = store.connect()
    data_dir = str(tmp_path / "b")
    incarnation = load_incarnation(data_dir)
    for journal in ("a", "a/b"):
        registry = MemberRegistry(backend, ROOT, journal, JOURNAL_REVISION)
        log_file, _ = open_member_log(data_dir, journal, "m0", incarnation, registry)
        log_file.close()
    registry = MemberRegistry(backend, ROOT, "a", RECREATED_REVISION)
    log_file, joiner = open_member_log(data_dir, "a", "m0", incarnation, registry)
    log_file.close()
    assert joiner.log_new
    assert log_path(data_dir, "a/b").exists()
    assert read_journal_revision(log_path(data_dir, "a/b").parent) == JOURNAL_REVISION
