"""The quorum member's durable log: the record codec (log_codec.py), replay equality
(log_change.py), and the file shell (quorum_shell/log_file.py): a torn tail is cut off, a
damaged record before intact ones is refused, the file is rewritten once it outgrows its log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker import metrics
from broker.quorum.entry import Entry, EntryId, LogBase
from broker.quorum.errors import LogFileCorruptError
from broker.quorum.log import ReplicaLog
from broker.quorum.log_change import (
    AlignedHeadSet,
    AlignedTermSet,
    CommitSet,
    CompactedThrough,
    EntryAppended,
    LedTermSet,
    LogChange,
    ResetTo,
    TermSet,
    TruncatedAfter,
)
from broker.quorum.log_codec import HEADER, decode_log, encode_change, encode_log
from broker.quorum.log_replay import durable_state, replay
from broker.quorum.rules import CORRECT_RULES
from broker.quorum.sim.nodes import MemberNode
from broker.quorum.sim.world import SimConfig, World
from broker.quorum_shell.log_file import QuorumLogFile, log_path


def _append(log: ReplicaLog, term: int, data: bytes) -> None:
    log.append(Entry(term, log.head_index + 1, log.head_end, log.head_end + len(data), data))


def recording_log() -> ReplicaLog:
    """A log taken through every kind of change, recording them."""
    log = ReplicaLog()
    log.changes = []
    log.term = 1
    log.led_term = 1
    _append(log, 1, b"")
    for i in range(6):
        _append(log, 1, b"entry-%d" % i)
    log.sync()
    log.set_commit(5)
    log.compact_through(3)
    log.term = 2
    log.aligned_head = EntryId(2, 9)
    log.aligned_term = 2
    log.truncate_after(5)
    _append(log, 2, b"")
    _append(log, 2, b"after truncation")
    log.sync()
    log.set_commit(7)
    return log


def test_every_change_round_trips_through_the_codec() -> None:
    changes: list[LogChange] = [
        TermSet(7),
        AlignedTermSet(6),
        AlignedHeadSet(EntryId(6, 1 << 33)),
        LedTermSet(5),
        CommitSet(1 << 40),
        EntryAppended(Entry(3, 9, 100, 105, b"hello")),
        EntryAppended(Entry(3, 10, 105, 105, b"")),
        TruncatedAfter(4),
        CompactedThrough(3),
        ResetTo(LogBase(2, 8, 99)),
    ]
    decoded = decode_log(encode_log(changes))
    assert decoded.changes == changes
    assert decoded.torn_bytes == 0


def test_replay_rebuilds_the_recorded_log() -> None:
    log = recording_log()
    assert log.changes is not None
    replayed = replay(decode_log(encode_log(log.changes)).changes)
    assert durable_state(replayed) == durable_state(log)
    assert replayed.base.index == 3 and replayed.head_index == 7
    assert replayed.synced_index == replayed.head_index
    # A missing record is a different log: the comparison can fail.
    dropped = [c for c in log.changes if c != CommitSet(7)]
    assert durable_state(replay(dropped)) != durable_state(log)
    no_head = [c for c in log.changes if not isinstance(c, AlignedHeadSet)]
    assert durable_state(replay(no_head)) != durable_state(log)


def test_a_reset_to_a_snapshot_replays() -> None:
    log = ReplicaLog()
    log.changes = []
    log.term = 3
    log.reset_to(LogBase(2, 40, 4096))
    log.set_commit(40)
    log.aligned_term = 3
    _append(log, 3, b"x")
    log.sync()
    assert durable_state(replay(log.changes)) == durable_state(log)


def _file_with(path: Path, log_to_write: ReplicaLog) -> bytes:
    assert log_to_write.changes is not None
    data = encode_log(log_to_write.changes)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def test_the_file_persists_and_replays(tmp_path: Path) -> None:
    path = log_path(tmp_path, "a/journal")
    assert path == tmp_path / "quorum" / "a" / "journal" / "log"
    first = QuorumLogFile(path)
    assert first.log.head_index == 0 and path.read_bytes() == HEADER
    first.log.term = 4
    _append(first.log, 4, b"")
    _append(first.log, 4, b"abc")
    first.log.sync()
    first.log.set_commit(2)
    first.persist()
    first.close()
    again = QuorumLogFile(path)
    assert (again.log.term, again.log.head_index, again.log.commit_index) == (4, 2, 2)
    assert again.log.read(0, 3) == b"abc"
    again.close()


@pytest.mark.parametrize("cut", [1, 5, 11, 12, 13, 20, -1])
def test_a_torn_tail_is_cut_off(tmp_path: Path, cut: int) -> None:
    path = log_path(tmp_path, "j")
    log = recording_log()
    data = _file_with(path, log)
    assert log.changes is not None
    last = encode_change(log.changes[-1])
    good = len(data) - len(last)
    torn = data[: good + (cut if cut > 0 else len(last) - 1)]
    path.write_bytes(torn)
    before = metrics.QUORUM_LOG_OPENED.labels("torn_tail")._value.get()
    opened = QuorumLogFile(path)
    assert metrics.QUORUM_LOG_OPENED.labels("torn_tail")._value.get() == before + 1
    assert durable_state(opened.log) == durable_state(replay(log.changes[:-1]))
    assert path.stat().st_size == good  # Cut at the last intact record.
    # The file goes on from there.
    opened.log.set_commit(7)
    opened.persist()
    opened.close()
    assert durable_state(QuorumLogFile(path).log) == durable_state(log)


def test_a_torn_last_record_with_a_full_length_of_zeros_is_a_torn_tail(tmp_path: Path) -> None:
    # A file system may extend the file before the data lands: zeros where the record was.
    path = log_path(tmp_path, "j")
    log = recording_log()
    data = _file_with(path, log)
    assert log.changes is not None
    last = len(encode_change(log.changes[-1]))
    path.write_bytes(data[:-last] + bytes(last))
    opened = QuorumLogFile(path)
    assert opened.log.commit_index == 5  # The last record (commit 7) is gone.
    opened.close()


def test_a_damaged_record_before_intact_ones_is_refused(tmp_path: Path) -> None:
    path = log_path(tmp_path, "j")
    log = recording_log()
    data = bytearray(_file_with(path, log))
    # Flip a byte in the content of the second entry (well before the end).
    at = bytes(data).index(b"entry-1")
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    before = metrics.QUORUM_LOG_OPENED.labels("corrupt")._value.get()
    with pytest.raises(LogFileCorruptError, match="damaged and an intact one follows"):
        QuorumLogFile(path)
    assert metrics.QUORUM_LOG_OPENED.labels("corrupt")._value.get() == before + 1
    assert path.read_bytes() == bytes(data)  # Nothing changed.


def test_a_damaged_length_before_intact_records_is_refused(tmp_path: Path) -> None:
    # A length pointing past the end must not pass for a torn tail while records follow.
    path = log_path(tmp_path, "j")
    log = recording_log()
    data = bytearray(_file_with(path, log))
    data[len(HEADER) + 4 : len(HEADER) + 8] = (1 << 25).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(LogFileCorruptError):
        QuorumLogFile(path)


def test_records_that_do_not_rebuild_a_log_are_refused(tmp_path: Path) -> None:
    path = log_path(tmp_path, "j")
    path.parent.mkdir(parents=True)
    # An entry that does not continue the empty log (index 2 first).
    path.write_bytes(encode_log([EntryAppended(Entry(1, 2, 0, 1, b"x"))]))
    with pytest.raises(LogFileCorruptError, match="do not rebuild a log"):
        QuorumLogFile(path)


def test_a_bad_header_is_refused(tmp_path: Path) -> None:
    path = log_path(tmp_path, "j")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"NOTALOG!" + encode_change(TermSet(1)))
    with pytest.raises(LogFileCorruptError, match="header"):
        QuorumLogFile(path)


def test_the_file_is_rewritten_as_the_log_compacts(tmp_path: Path) -> None:
    path = log_path(tmp_path, "j")
    file = QuorumLogFile(path, rewrite_slack_bytes=4096)
    log = file.log
    log.term = 1
    payload = b"p" * 1000
    sizes = []
    for _ in range(200):
        _append(log, 1, payload)
        log.sync()
        log.set_commit(log.head_index)
        if log.entry_count > 4:
            log.compact_through(log.head_index - 2)
        file.persist()
        sizes.append(file.size)
    assert file.rewrites > 0
    # Bounded: never far beyond twice what the log needs (3 entries) plus the slack.
    assert max(sizes) < 2 * (4 * 1100) + 4096 + 1100
    file.close()
    reopened = QuorumLogFile(path)
    assert durable_state(reopened.log) == durable_state(log)
    assert not path.with_name("log.tmp").exists()
    reopened.close()


def test_the_simulation_notices_a_replay_that_differs() -> None:
    world = World(1, SimConfig(), CORRECT_RULES, trace=False)
    node: MemberNode = world.members[0]
    node.log.term = 3
    node.log.led_term = 3
    assert node.log.changes is not None
    node._check_replay()  # Equal: passes, keeps the snapshot.
    node.log.changes.pop(0)  # The file lost a record (the term).
    with pytest.raises(AssertionError, match="replays to"):
        node._check_replay()


def test_a_file_never_written_past_its_header_opens_empty(tmp_path: Path) -> None:
    path = log_path(tmp_path, "j")
    path.parent.mkdir(parents=True)
    path.write_bytes(HEADER[:3])
    opened = QuorumLogFile(path)
    assert opened.log.term == 0 and path.read_bytes() == HEADER
    opened.close()
    assert os.path.getsize(path) == len(HEADER)
