"""BlockSpoolFile and BlockPool: a property test against a bytearray model over a shared pool of
tiny blocks (so recycled blocks with stale bytes are exercised), the pool's bounds, ENOSPC,
use after close, argument errors; and `gazette serve --spool-memory` end to end."""

from __future__ import annotations

import array
import errno
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from broker import metrics
from broker.fragment.spool_blocks import BlockPool, BlockSpoolFile
from broker.fragment.spool_file import BytesLike
from tests.broker.serve_testkit import gazette_serve, persisted_gzip_content

# --- Property: any interleaving of operations on files sharing a pool matches a model -------------

# Tiny blocks and a small free list: most writes cross a block boundary, and most blocks a file
# takes have been used (and dirtied) by another file before.
BLOCK_BYTES = 8
FREE_BLOCKS_MAX = 4
# Small enough that generated offsets and lengths run into it now and then.
BYTES_MAX = 64
SLOTS = 3  # Files open at once on the shared pool.


@dataclass
class Slot:
    file: BlockSpoolFile
    model: bytearray


def _as(kind: str, data: bytes) -> BytesLike:
    """`data` in each of the shapes a caller may hand over."""
    if kind == "bytes":
        return data
    if kind == "bytearray":
        return bytearray(data)
    if kind == "memoryview":
        return memoryview(data)
    # A slice of a larger buffer: the view starts and ends inside it.
    return memoryview(b"\xee" + data + b"\xee")[1 : 1 + len(data)]


slot_ids = st.integers(0, SLOTS - 1)
# Mostly within the first blocks (so files shrink, and write over what they hold), now and
# then anywhere up to past bytes_max.
offsets = st.one_of(st.integers(0, 3 * BLOCK_BYTES), st.integers(0, BYTES_MAX + 8))
# Non-zero bytes only, so that a stale byte is never mistaken for a zero-filled gap.
payloads = st.binary(max_size=3 * BLOCK_BYTES).map(lambda b: bytes(x | 1 for x in b))
ops = st.one_of(
    st.tuples(st.just("open"), slot_ids),
    st.tuples(st.just("close"), slot_ids),
    st.tuples(
        st.just("write"),
        slot_ids,
        offsets,
        payloads,
        st.sampled_from(["bytes", "bytearray", "memoryview", "slice"]),
    ),
    st.tuples(st.just("truncate"), slot_ids, offsets),
    st.tuples(st.just("read"), slot_ids, st.integers(0, 3 * BLOCK_BYTES), offsets),
)

# Stale bytes through each door: a gap after a write into a recycled block, a truncate that
# grows into one, and a shrink-then-grow within a file's own last block.
STALE_GAP = [
    ("write", 0, 0, b"\xff" * 24, "bytes"),
    ("close", 0),
    ("write", 1, 20, b"\x01", "bytes"),
]
STALE_GROW = [("write", 0, 0, b"\xff" * 24, "bytes"), ("close", 0), ("truncate", 1, 20)]
STALE_OWN = [("write", 0, 0, b"\xff" * 8, "bytes"), ("truncate", 0, 2), ("truncate", 0, 8)]
# Blocks a shrinking file gives back must be its no longer: another file takes them next.
GIVEN_BACK = [
    ("write", 0, 0, b"\xff" * 24, "bytes"),
    ("truncate", 0, 0),
    ("write", 1, 0, b"\x01" * 24, "bytes"),
    ("write", 0, 0, b"\x03" * 24, "bytes"),
]


@settings(max_examples=500)
@given(st.lists(ops, max_size=40))
@example(STALE_GAP)
@example(STALE_GROW)
@example(STALE_OWN)
@example(GIVEN_BACK)
def test_block_spool_files_behave_like_a_bytearray(steps: list[tuple[Any, ...]]) -> None:
    pool = BlockPool(block_bytes=BLOCK_BYTES, free_blocks_max=FREE_BLOCKS_MAX)
    slots: list[Slot | None] = [None] * SLOTS

    def opened(i: int) -> Slot:
        slot = slots[i]
        if slot is None:
            slot = slots[i] = Slot(BlockSpoolFile(pool, bytes_max=BYTES_MAX), bytearray())
        return slot

    for step in steps:
        op, i = step[0], step[1]
        if op == "open":  # Replace the slot's file with a new one (its blocks go to the pool).
            old = slots[i]
            if old is not None:
                old.file.close()
            slots[i] = None
            opened(i)
        elif op == "close":
            old = slots[i]
            if old is not None:
                old.file.close()
                slots[i] = None
        elif op == "write":
            _, _, offset, data, kind = step
            slot = opened(i)
            end = offset + len(data)
            if end > BYTES_MAX:
                with pytest.raises(OSError) as caught:
                    slot.file.pwrite(_as(kind, data), offset)
                assert caught.value.errno == errno.ENOSPC
            else:
                slot.file.pwrite(_as(kind, data), offset)
                if offset > len(slot.model):
                    slot.model.extend(bytes(offset - len(slot.model)))
                slot.model[offset:end] = data
        elif op == "truncate":
            length = step[2]
            slot = opened(i)
            if length > BYTES_MAX:
                with pytest.raises(OSError) as caught:
                    slot.file.truncate(length)
                assert caught.value.errno == errno.ENOSPC
            elif length < len(slot.model):
                slot.file.truncate(length)
                del slot.model[length:]
            else:
                slot.file.truncate(length)
                slot.model.extend(bytes(length - len(slot.model)))
        else:
            _, _, length, offset = step
            slot = opened(i)
            assert slot.file.pread(length, offset) == bytes(slot.model[offset : offset + length])
        # Every open file, not just the one touched: files sharing the pool must not share bytes.
        for each in slots:
            if each is not None:
                assert each.file.size() == len(each.model)
                assert each.file.pread(BYTES_MAX + 1, 0) == bytes(each.model)
        assert pool.free_blocks <= FREE_BLOCKS_MAX


def test_writes_of_wide_item_views_count_bytes() -> None:
    pool = BlockPool(block_bytes=3)
    file = BlockSpoolFile(pool)
    words = array.array("H", [0x0102, 0x0304, 0x0506])
    file.pwrite(memoryview(words), 1)
    assert file.pread(100, 0) == b"\x00" + words.tobytes()


# --- The pool -------------------------------------------------------------------------------------


def test_pool_keeps_at_most_free_blocks_max_and_counts_only_new_blocks() -> None:
    pool = BlockPool(block_bytes=8, free_blocks_max=2)
    first = BlockSpoolFile(pool)
    first.pwrite(b"x" * 40, 0)  # Five blocks, all new.
    assert (pool.created, pool.free_blocks) == (5, 0)
    first.close()
    assert pool.free_blocks == 2  # The other three went back to the allocator.

    second = BlockSpoolFile(pool)
    second.pwrite(b"y" * 16, 0)  # Two blocks: both re-used.
    assert (pool.created, pool.free_blocks) == (5, 0)
    second.pwrite(b"z", 16)  # A third: the pool is empty, so it is new.
    assert pool.created == 6
    assert second.pread(100, 0) == b"y" * 16 + b"z"

    second.truncate(9)  # Keeps two blocks, gives one back.
    assert pool.free_blocks == 1
    second.truncate(0)
    assert pool.free_blocks == 2  # At the bound (one of the three dropped).
    second.close()
    assert (pool.created, pool.free_blocks) == (6, 2)


def test_pool_with_no_free_list_keeps_nothing() -> None:
    pool = BlockPool(block_bytes=4, free_blocks_max=0)
    file = BlockSpoolFile(pool)
    file.pwrite(b"abcdefgh", 0)
    file.close()
    assert (pool.created, pool.free_blocks) == (2, 0)
    again = BlockSpoolFile(pool)
    again.pwrite(b"a", 0)
    assert pool.created == 3


def test_recycled_blocks_never_show_stale_bytes() -> None:
    pool = BlockPool(block_bytes=8, free_blocks_max=8)
    dirty = BlockSpoolFile(pool)
    dirty.pwrite(b"\xff" * 64, 0)
    dirty.close()
    file = BlockSpoolFile(pool)
    file.pwrite(b"a", 30)  # Gap [0, 30) in recycled blocks.
    file.truncate(50)  # Growth [31, 50) too.
    assert pool.created == 8  # Every block it holds is a recycled one.
    assert file.pread(100, 0) == bytes(30) + b"a" + bytes(19)


def test_closed_files_give_their_blocks_once() -> None:
    pool = BlockPool(block_bytes=8, free_blocks_max=8)
    file = BlockSpoolFile(pool)
    file.pwrite(b"x" * 20, 0)
    file.close()
    file.close()
    assert pool.free_blocks == 3


# --- Bounds, closed files, arguments --------------------------------------------------------------


def test_enospc_at_bytes_max_leaves_the_file_unchanged() -> None:
    pool = BlockPool(block_bytes=8)
    file = BlockSpoolFile(pool, bytes_max=20)
    file.pwrite(b"0123456789", 0)
    for refused in (
        lambda: file.pwrite(b"x" * 11, 10),
        lambda: file.pwrite(b"", 21),  # Even an empty write would zero-extend past the bound.
        lambda: file.truncate(21),
    ):
        with pytest.raises(OSError) as caught:
            refused()
        assert caught.value.errno == errno.ENOSPC
        assert (file.size(), file.pread(100, 0)) == (10, b"0123456789")
        assert pool.created == 2  # No blocks taken for the refused write.
    file.pwrite(b"x" * 10, 10)  # Exactly up to the bound is fine.
    assert file.size() == 20
    zero = BlockSpoolFile(pool, bytes_max=0)
    zero.pwrite(b"", 0)
    with pytest.raises(OSError, match="bytes_max is 0"):
        zero.pwrite(b"x", 0)


def test_use_after_close_raises_and_close_is_idempotent() -> None:
    file = BlockSpoolFile(BlockPool(block_bytes=8))
    file.pwrite(b"content", 0)
    assert not file.closed
    file.close()
    file.close()
    assert file.closed
    for use in (
        lambda: file.pwrite(b"x", 0),
        lambda: file.pread(1, 0),
        file.size,
        lambda: file.truncate(0),
    ):
        with pytest.raises(ValueError, match="after close"):
            use()


def test_argument_errors() -> None:
    with pytest.raises(ValueError, match="block_bytes: must be >= 1"):
        BlockPool(block_bytes=0)
    with pytest.raises(ValueError, match="free_blocks_max: must be >= 0"):
        BlockPool(free_blocks_max=-1)
    pool = BlockPool(block_bytes=8)
    with pytest.raises(ValueError, match="bytes_max: must be >= 0"):
        BlockSpoolFile(pool, bytes_max=-1)
    file = BlockSpoolFile(pool)
    with pytest.raises(ValueError, match="offset: must be >= 0"):
        file.pwrite(b"x", -1)
    with pytest.raises(ValueError, match="must be >= 0"):
        file.pread(-1, 0)
    with pytest.raises(ValueError, match="must be >= 0"):
        file.pread(1, -1)
    with pytest.raises(ValueError, match="length: must be >= 0"):
        file.truncate(-1)
    assert (file.size(), pool.created) == (0, 0)


# --- `gazette serve --spool-memory` ---------------------------------------------------------------

# Upper bound on any one step; each takes well under a second.
step_timeout_s = 30


def _gazctl(broker: str, *args: str, stdin: bytes = b"") -> bytes:
    done = subprocess.run(
        [sys.executable, "-m", "broker.cli.gazctl", *args],
        input=stdin,
        capture_output=True,
        env=dict(os.environ, BROKER_ADDRESS=broker),
        timeout=step_timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout


def _open_paths_under(pid: int, directory: Path) -> list[str]:
    """Files (unlinked ones too) that process `pid` holds open under `directory`."""
    fds = Path(f"/proc/{pid}/fd")
    found = []
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:
            continue  # Closed since the listing.
        if target.startswith(str(directory) + os.sep):
            found.append(target)
    return found


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux /proc")
def test_serve_with_spool_memory_round_trip(tmp_path: Path) -> None:
    spools, root = tmp_path / "spools", tmp_path / "root"
    spools.mkdir()
    (root / "fragments").mkdir(parents=True)
    with gazette_serve(root, "--spool-dir", str(spools), "--spool-memory") as (port, proc):
        broker = f"127.0.0.1:{port}"
        space = tmp_path / "space.yaml"
        space.write_text(
            "name: mem/\nreplication: 1\n"
            "fragment: {length: 1048576, compression_codec: GZIP, refresh_interval: 30s,"
            " stores: ['file:///fragments/']}\n"
            "children: [{name: mem/words}]\n"
        )
        _gazctl(broker, "journals", "apply", "-f", str(space))
        # More than a block of a small pool would hold, with every byte value.
        big = bytes(range(256)) * 300
        appends = [b"hello\n", big, b"world\n"]
        for data in appends:
            _gazctl(broker, "journals", "append", "-j", "mem/words", stdin=data)
        expected = b"".join(appends)
        assert _gazctl(broker, "journals", "read", "-j", "mem/words") == expected
        # The open fragment lives in memory: no spool file (not even an unlinked one) is open.
        # (The embedded keyspace persists under the same directory, in its keyspace/.)
        keyspace = str(spools / "keyspace") + os.sep
        assert [p for p in _open_paths_under(proc.pid, spools) if not p.startswith(keyspace)] == []

        proc.send_signal(signal.SIGTERM)  # Persists the open fragment on the way out.
        assert proc.wait(timeout=step_timeout_s) == 0

    assert persisted_gzip_content(root / "fragments" / "mem" / "words") == expected


def test_blocks_taken_are_counted_by_source() -> None:
    def counted(source: str) -> float:
        return metrics.value_of("gazette_spool_blocks_total", {"source": source})

    pool = BlockPool(block_bytes=16, free_blocks_max=4)
    allocated, reused = counted("allocated"), counted("reused")
    first = BlockSpoolFile(pool)
    first.pwrite(b"x" * 40, 0)  # Three new blocks.
    first.close()
    second = BlockSpoolFile(pool)
    second.pwrite(b"y" * 40, 0)  # The same three, re-used.
    assert (counted("allocated") - allocated, counted("reused") - reused) == (3, 3)
