"""RocksDBStore: a shard's state in a RocksDB database whose directory is recorded into the
shard's recovery log (docs/architecture.md: Invariants; Dependencies).

Gazette records a RocksDB store through an Env hook that sees every file operation as RocksDB
makes it. Python has no such hook, so this store records the database directory by *diffing*
it against what the log already holds, once per commit, at a point where the commit's writes
are complete on disk.

Transactions. The application stages writes with `put` / `delete` and reads with `get`, which
sees the transaction's own staged writes, then those of commits started but not yet applied
(a pipelined transaction must see its predecessor's writes), then the database. `db` (a raw-mode
`rocksdict.Rdict`, bytes keys and values) is there for iteration and other reads of the
*applied* state only: it does not show staged or pending writes, and the application must never
write through it — a direct write would reach the log with whichever commit records the WAL
next, not atomically with its own transaction. The key `CHECKPOINT_KEY` is reserved.

Commit. `start_commit` turns the staged writes and the checkpoint (under `CHECKPOINT_KEY`) into
one WriteBatch, so that user state and checkpoint are applied atomically; the CommitPipeline
applies it after `wait_for` and every earlier commit (`_apply`):

1. `db.write(batch)` and `flush_wal`: the batch is now in the WAL file (one checksummed record).
   No memtable flush: the WAL tail *is* the commit, so a commit records about as many bytes as
   it wrote. Memtable flushes and compactions happen in RocksDB's background threads as usual;
   their files are recorded by whichever commit comes next.
2. Snapshot the directory (rocksdb_snapshot.py, in the store's thread): every recordable
   file's state, and each one that differs from what the log holds opened, pinning its inode
   with its size, visited in RocksDB's dependency order and checked unchanged at the end, so
   that the snapshot is a state RocksDB recovers from as after `kill -9`, although background
   jobs run on. A scan that sees a MANIFEST edit, or a file vanish, starts over (at most
   `SNAPSHOT_ATTEMPTS_MAX` times).
3. Record the differences through the Recorder, in `FileKind` order — SSTs/blobs, WALs,
   MANIFESTs, other small files, CURRENT — and deletions last. Append-only files (SSTs, blobs,
   WALs, MANIFESTs: written sequentially, never rewritten in place; WAL recycling is turned off)
   are recorded as a create plus their bytes, then only their new tail at its offset. Files
   RocksDB replaces wholesale (CURRENT, OPTIONS-*, IDENTITY, rocksdict's config; RocksDB writes
   them to a temporary name and renames) are recorded whenever their inode, size or mtime
   changed, as a recorded temporary file `<name>.gazette-tmp` renamed over the name: the three
   ops of a rename land in one append, so the log never holds a truncated CURRENT. Content is
   read in chunks of `READ_CHUNK_BYTES` (`PREFETCH_BYTES_MAX` of it in the snapshot's thread
   hop, which covers a typical commit's WAL tail). The order makes every prefix of a commit's
   ops — what a commit that fails half-way leaves in the log — a directory RocksDB recovers the
   previous commit from: new SSTs unnamed by the recorded MANIFEST are ignored, a torn WAL or
   MANIFEST tail is dropped (point-in-time WAL recovery; RocksDB syncs neither per write, so it
   tolerates torn tails by design), and obsolete files are unlinked only after the state that
   obsoletes them is recorded.
4. `recorder.flush()`: the commit resolves once every op is durable in the log.

Not recorded: LOCK, the info log (LOG, LOG.old.*; bounded by `INFO_LOG_FILES_MAX` files of
`INFO_LOG_BYTES_MAX`), RocksDB's `*.dbtmp` temporaries, and dot-files (the player's staging).

Restore. As for JSONFileStore: in a shard the runner plays the log and hands it off before
`Application.new_store`, which builds the store with `RocksDBStore.recorded(recorder)`;
standalone, `restore_checkpoint` plays the log into the (emptied) directory and hands off
itself. Either way the directory then holds exactly the recorded files, byte for byte;
`restore_checkpoint` notes their state (the baseline of the first diff), opens the database
there (RocksDB replays the WAL tails) and reads `CHECKPOINT_KEY` (absent: the empty
Checkpoint). A directory without CURRENT holds no database: files a first commit that failed
half-way recorded are removed before RocksDB creates one. Whatever the open rewrites locally
(a new MANIFEST, the replayed memtable flushed to an SST, old WALs deleted) is recorded by the
first commit. Once restored, the previous
primary's recorder is fenced, so its commits fail with FencedError.

A failed commit may leave its batch applied locally but not recorded: the store then refuses
further commits, and the shard restores a new instance (as it does after any failed commit).

Local I/O errors. rocksdict raises RocksDB's failures as plain `Exception`s carrying RocksDB's
status text; those of status IOError (a full disk, a failed one), and OSErrors of the store's
own file work, are raised as `StoreIOError`, naming the directory and its free space: RocksDB
often reports a full disk as "Writer has previous error", its background flush having met the
ENOSPC, so the free space is what tells the reader why. The shard retries them (transient).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import stat
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final, TypeVar

import rocksdict

from broker.client.route_cache import JournalClient
from broker.protocol.recorded_op_pb2 import FSMHints
from gazette_consumer.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from gazette_consumer.recoverylog.recorder import Recorder, RecorderFencedError
from gazette_consumer.stores.base import (
    COMMITS_IN_FLIGHT_MAX,
    OpFuture,
    ShardContext,
    StoreError,
    StoreIOError,
    StoreStateError,
    free_bytes,
)
from gazette_consumer.stores.recorded import RecordedStore
from gazette_consumer.stores.rocksdb_snapshot import (
    PREFETCH_BYTES_MAX,
    SNAPSHOT_ATTEMPTS_MAX,
    TEMP_SUFFIX,
    Change,
    FileState,
    Snapshot,
    SnapshotError,
    pread_exactly,
    recordable,
    scan_directory,
)

__all__ = [
    "CHECKPOINT_KEY",
    "PREFETCH_BYTES_MAX",
    "READ_CHUNK_BYTES",
    "SNAPSHOT_ATTEMPTS_MAX",
    "TEMP_SUFFIX",
    "RocksDBStore",
    "SnapshotError",
]

CHECKPOINT_KEY: Final = b"\x00gazette-consumer/checkpoint"
"""Reserved key holding the encoded checkpoint, written in each commit's WriteBatch."""

READ_CHUNK_BYTES: Final = 1 << 20
"""Largest piece of a file read at once while recording it (the Recorder splits it further
into Write ops of at most its WRITE_CHUNK_BYTES_MAX)."""

INFO_LOG_FILES_MAX: Final = 2
INFO_LOG_BYTES_MAX: Final = 1 << 20
"""Bounds of RocksDB's info log (LOG, LOG.old.*), kept in the directory but never recorded."""

_T = TypeVar("_T")


class RocksDBStore(RecordedStore):
    """A Store over a RocksDB database in a recorded directory. See the module docstring, and
    RecordedStore for the arguments and what every recorded store does. `configure` tunes the
    database's Options (it must not move files out of the directory: no wal_dir or db_paths)."""

    def __init__(
        self,
        client: JournalClient,
        log: str,
        directory: str | os.PathLike[str],
        *,
        hints: FSMHints | None = None,
        author: int | None = None,
        configure: Callable[[rocksdict.Options], None] | None = None,
        commits_in_flight_max: int = COMMITS_IN_FLIGHT_MAX,
    ) -> None:
        super().__init__(
            client,
            log,
            directory,
            hints=hints,
            author=author,
            commits_in_flight_max=commits_in_flight_max,
        )
        self._configure = configure
        # One thread for every blocking call on the database and its files: they run in
        # submission order, and `destroy` closes the database only after the last of them.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rocksdb-store")
        self._db: rocksdict.Rdict | None = None
        self._staged: dict[bytes, bytes | None] = {}  # None: a deletion.
        # Writes of commits started but not yet applied to `db`, oldest first.
        self._pending: list[dict[bytes, bytes | None]] = []
        self._baseline: dict[str, FileState] = {}  # Recorded files, as last seen locally.

    @property
    def db(self) -> rocksdict.Rdict:
        """The database, for reads of the applied state (see the module docstring)."""
        if self._db is None:
            raise StoreStateError("db: restore_checkpoint must come first")
        return self._db

    # --- The application's transaction ---------------------------------------------------------

    def put(self, key: bytes, value: bytes) -> None:
        """Stage `key` = `value` in the current transaction."""
        self._staged[_user_key(key)] = bytes(value)

    def delete(self, key: bytes) -> None:
        """Stage the deletion of `key` in the current transaction."""
        self._staged[_user_key(key)] = None

    def get(self, key: bytes) -> bytes | None:
        """`key`'s value as the current transaction sees it: its own staged writes, then
        those of pending commits, then the database."""
        key = _user_key(key)
        for writes in (self._staged, *reversed(self._pending)):
            if key in writes:
                return writes[key]
        value = self.db.get(key)
        assert value is None or isinstance(value, bytes)
        return value

    # --- Store ---------------------------------------------------------------------------------

    async def restore_checkpoint(self, shard: ShardContext) -> Checkpoint:
        """Play the recovery log into the directory (unless the shard did), take the log over
        (fencing the previous primary), open the database and return its checkpoint."""
        recorded = _recorded_names(await self._take_over(shard))
        try:
            self._baseline, self._db, data = await self._blocking(self._open, recorded)
        except Exception as err:
            io_error = self._io_error("opening the database", err)
            if io_error is None:
                raise
            raise io_error from err
        if data is None:
            return Checkpoint()
        try:
            return decode_checkpoint(data)
        except ValueError as err:
            raise StoreError(
                f"restore_checkpoint: {CHECKPOINT_KEY!r} in {self.directory} is not a checkpoint"
            ) from err

    async def start_commit(
        self, shard: ShardContext, checkpoint: Checkpoint, wait_for: Sequence[Awaitable[object]]
    ) -> OpFuture:
        self._check_commit(shard)
        if self._db is None:
            raise StoreStateError("start_commit: restore_checkpoint must come first")
        # Taken now: later writes belong to the next transaction.
        writes, self._staged = self._staged, {}
        batch = rocksdict.WriteBatch(raw_mode=True)
        for key, value in writes.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        batch.put(CHECKPOINT_KEY, encode_checkpoint(checkpoint))
        self._pending.append(writes)
        return self._pipeline.submit(
            wait_for,
            apply=functools.partial(self._apply, batch, writes),
            abort=functools.partial(self._abort, writes),
        )

    async def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        self._staged, self._pending = {}, []
        await self._pipeline.close()
        db, self._db = self._db, None
        try:
            if db is not None:
                # Queued behind any blocking call a cancelled commit left running.
                await asyncio.get_running_loop().run_in_executor(self._executor, db.close)
        finally:
            self._executor.shutdown(wait=False)

    # --- Commit --------------------------------------------------------------------------------

    async def _apply(self, batch: rocksdict.WriteBatch, writes: dict[bytes, bytes | None]) -> None:
        recorder = self._recorder
        assert recorder is not None
        snapshot: Snapshot | None = None
        try:
            recorded = _recorded_names(recorder)
            snapshot = await _owned(self._blocking(self._write_and_snapshot, batch, recorded))
            self._forget_pending(writes)
            for change in sorted(snapshot.changes, key=lambda c: c.kind):
                await self._record(recorder, change)
            live = set(snapshot.states)
            for name in sorted(_recorded_names(recorder) - live):
                await recorder.unlink(name)
            await recorder.flush()
            self._baseline = snapshot.states
        except RecorderFencedError as err:
            raise self._fenced(err) from err
        except BaseException as err:
            self._failed = err
            io_error = self._io_error("committing", err) if isinstance(err, Exception) else None
            if io_error is None:
                raise
            raise io_error from err
        finally:
            self._forget_pending(writes)
            if snapshot is not None:
                snapshot.close()

    async def _abort(self, writes: dict[bytes, bytes | None]) -> None:
        self._forget_pending(writes)  # Never applied: the batch is dropped.

    def _forget_pending(self, writes: dict[bytes, bytes | None]) -> None:
        for index, pending in enumerate(self._pending):
            if pending is writes:
                del self._pending[index]
                return

    async def _record(self, recorder: Recorder, change: Change) -> None:
        name = change.name
        if change.mode == "append":
            fnode = recorder.fsm.links["/" + name]
        else:
            # New or replaced: a replaced file goes through a temporary name, so that no
            # prefix of the log holds it truncated (see the module docstring).
            target = name if change.mode == "create" else name + TEMP_SUFFIX
            fnode = await recorder.create(target)
        if change.prefetched is not None:
            if change.prefetched:
                await recorder.write_at(fnode, change.prefetched, change.start)
        else:
            offset = change.start
            while offset < change.size:
                length = min(READ_CHUNK_BYTES, change.size - offset)
                data = await self._blocking(pread_exactly, change, offset, length)
                await recorder.write_at(fnode, data, offset)
                offset += length
        if change.mode == "replace":
            await recorder.rename(name + TEMP_SUFFIX, name)

    def _io_error(self, doing: str, err: Exception) -> StoreIOError | None:
        """`err` as a StoreIOError if it is a local I/O failure (see the module docstring), else
        None."""
        if not (isinstance(err, OSError) or _is_rocksdb_io_error(err)):
            return None
        free = free_bytes(self.directory)
        room = "unknown" if free is None else f"{free:,} bytes"
        return StoreIOError(
            f"RocksDBStore at {self.directory}: {doing}: {err} (free on its file system: {room})"
        )

    # --- Blocking work (in the store's thread) -------------------------------------------------

    async def _blocking(self, fn: Callable[..., _T], *args: object) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def _options(self) -> rocksdict.Options:
        options = rocksdict.Options(raw_mode=True)
        if self._configure is not None:
            self._configure(options)
        # What the recording relies on, whatever `configure` set.
        options.create_if_missing(True)
        options.set_recycle_log_file_num(0)  # A recycled WAL is rewritten in place.
        options.set_wal_recovery_mode(rocksdict.DBRecoveryMode.point_in_time())
        options.set_keep_log_file_num(INFO_LOG_FILES_MAX)
        options.set_max_log_file_size(INFO_LOG_BYTES_MAX)
        return options

    def _open(
        self, recorded: set[str]
    ) -> tuple[dict[str, FileState], rocksdict.Rdict, bytes | None]:
        # Temporaries of a commit that failed before its rename are dropped (the next commit
        # records their unlink), then the baseline is taken before RocksDB touches anything.
        for name in recorded:
            if name.endswith(TEMP_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.directory / name)
        if not (self.directory / "CURRENT").exists():
            # No database yet: files are what a first commit that failed before recording
            # CURRENT left (RocksDB refuses to create a database over a WAL). Drop them too.
            for name in os.listdir(self.directory):
                if recordable(name) and (self.directory / name).is_file():
                    os.unlink(self.directory / name)
        baseline: dict[str, FileState] = {}
        for name in recorded:
            try:
                st = os.stat(self.directory / name)
            except FileNotFoundError:
                continue  # Recorded but absent: the next commit records its unlink.
            if stat.S_ISREG(st.st_mode):
                baseline[name] = FileState.of(st)
        db = rocksdict.Rdict(str(self.directory), self._options())
        try:
            data = db.get(CHECKPOINT_KEY)
        except BaseException as err:
            try:
                db.close()
            except Exception as close_err:  # Often "previous error": never instead of get's.
                err.add_note(f"then closing the database failed too: {close_err!r}")
            raise
        assert data is None or isinstance(data, bytes)
        return baseline, db, data

    def _write_and_snapshot(self, batch: rocksdict.WriteBatch, recorded: set[str]) -> Snapshot:
        db = self._db
        assert db is not None
        db.write(batch, rocksdict.WriteOptions())  # Default options: the WAL is on.
        db.flush_wal(False)  # The batch's WAL record is in the file (no fsync: the log is
        # what makes it durable).
        for _attempt in range(SNAPSHOT_ATTEMPTS_MAX):
            snapshot = scan_directory(self.directory, self._baseline, recorded)
            if snapshot is not None:
                return snapshot
        raise SnapshotError(
            f"{self.directory}: files kept vanishing during {SNAPSHOT_ATTEMPTS_MAX} snapshots"
        )


async def _owned(snapshotting: Awaitable[Snapshot]) -> Snapshot:
    """The snapshot; if the commit is cancelled meanwhile (a destroy), the thread still
    finishes it, and its files are closed then."""
    future = asyncio.ensure_future(snapshotting)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(_close_snapshot)
        raise


def _close_snapshot(future: asyncio.Future[Snapshot]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()


def _recorded_names(recorder: Recorder) -> set[str]:
    """Names of the files the log holds at the top of the directory."""
    return {path[1:] for path in recorder.fsm.links if "/" not in path[1:]}


def _is_rocksdb_io_error(err: BaseException) -> bool:
    """Whether `err` is RocksDB's Status IOError as rocksdict raises it: a plain Exception whose
    text starts with the status name (rocksdict has no error types of its own)."""
    return type(err) is Exception and str(err).startswith("IO error")


def _user_key(key: bytes) -> bytes:
    key = bytes(key)
    if key == CHECKPOINT_KEY:
        raise ValueError(f"key {CHECKPOINT_KEY!r} is reserved for the store's checkpoint")
    return key
