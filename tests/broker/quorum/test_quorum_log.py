"""ReplicaLog: what a member keeps across restarts, and the checks on changing it."""

from __future__ import annotations

import pytest

from broker.quorum.entry import Entry, EntryId, LogBase
from broker.quorum.errors import LogContiguityError, TruncateBelowCommitError
from broker.quorum.log import ReplicaLog
from tests.broker.quorum.quorum_testkit import make_log


def test_append_must_continue_the_log_and_a_refusal_changes_nothing() -> None:
    log = make_log([(1, b"ab"), (1, b"cd")])
    for bad in (
        Entry(1, 4, 4, 5, b"x"),  # skips index 3
        Entry(1, 3, 5, 6, b"x"),  # leaves a byte gap
        Entry(0, 3, 4, 5, b"x"),  # older term than the head
        Entry(1, 3, 4, 6, b"x"),  # length disagrees with [begin, end)
    ):
        with pytest.raises(LogContiguityError):
            log.append(bad)
    assert log.head == EntryId(1, 2) and log.head_end == 4


def test_reads_span_entries_and_ids_are_found_by_term() -> None:
    log = make_log([(1, b"ab"), (1, b"cde"), (2, b""), (2, b"f"), (4, b"")])
    assert log.read(1, 6) == b"bcdef"
    assert log.read(5, 5) == b""
    assert log.last_of_term(1) == EntryId(1, 2)
    assert log.last_of_term(2) == EntryId(2, 4)
    assert log.last_of_term(3) is None
    assert log.term_summary(1) == (EntryId(1, 2), EntryId(2, 4), EntryId(4, 5))
    assert log.term_summary(4) == (EntryId(4, 5),)
    assert log.has(EntryId(2, 3)) and not log.has(EntryId(1, 3))
    assert log.index_covering(5) == 3 and log.index_covering(6) == 5  # barriers included
    with pytest.raises(IndexError):
        log.read(0, 7)


def test_truncation_never_drops_committed_entries() -> None:
    log = make_log([(1, b"ab"), (1, b"cd"), (2, b"ef")], commit=2)
    with pytest.raises(TruncateBelowCommitError):
        log.truncate_after(1)
    assert log.head == EntryId(2, 3)
    log.truncate_after(2)
    assert log.head == EntryId(1, 2) and log.synced_index == 2 and log.drops == 1


def test_crash_drops_only_what_was_never_synced() -> None:
    log = make_log([(1, b"ab")], commit=1)
    log.append(Entry(1, 2, 2, 4, b"cd"))
    assert log.synced_index == 1
    log.crash()
    assert log.head == EntryId(1, 1)


def test_commit_never_passes_the_synced_entries() -> None:
    log = make_log([(1, b"ab")])
    log.append(Entry(1, 2, 2, 4, b"cd"))
    assert log.set_commit(2) and log.commit_index == 1  # entry 2 is not durable here yet
    log.sync()
    assert log.set_commit(2) and log.commit_index == 2
    assert not log.set_commit(1) and log.commit_index == 2


def test_compaction_keeps_the_base_and_only_drops_committed_entries() -> None:
    log = make_log([(1, b"ab"), (1, b"cd"), (2, b"ef")], commit=2)
    with pytest.raises(TruncateBelowCommitError):
        log.compact_through(3)
    log.compact_through(2)
    assert log.base == LogBase(1, 2, 4)
    assert log.term_at(2) == 1 and log.term_at(1) is None
    assert log.holds_durably(EntryId(1, 1))  # compacted: in the snapshot store
    assert log.read(4, 6) == b"ef"
    with pytest.raises(IndexError):
        log.entries_after(1, 10, 100)


def test_reset_to_a_snapshot_refuses_to_go_below_the_commit() -> None:
    log = make_log([(1, b"ab"), (1, b"cd")], commit=2)
    with pytest.raises(TruncateBelowCommitError):
        log.reset_to(LogBase(1, 1, 2))
    log.reset_to(LogBase(3, 9, 40))
    assert log.head == EntryId(3, 9) and log.head_end == 40 and log.entry_count == 0


def test_entries_after_bounds_count_and_bytes() -> None:
    log = make_log([(1, b"a" * 10), (1, b"b" * 10), (1, b"c" * 10)])
    assert [e.index for e in log.entries_after(0, 2, 100)] == [1, 2]
    assert [e.index for e in log.entries_after(0, 5, 15)] == [1]
    assert [e.index for e in log.entries_after(0, 5, 5)] == [1]  # one entry at least
    assert log.entries_after(3, 5, 100) == ()


def test_a_fresh_log_is_the_origin() -> None:
    log = ReplicaLog()
    assert log.head == EntryId(0, 0) and log.head_end == 0 and log.term_summary(0) == ()
