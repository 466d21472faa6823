"""What a broker keeps on its disk, beside the member logs, to know whether its disk is new.

A quorum member that lost its disk (a new disk, a deleted `--data-dir`) must not vote until a
leader caught it up (Rules.may_vote): its empty log says nothing of what it acknowledged
before. A new log file alone does not tell a lost disk from a member joining a fresh journal,
so the broker keeps two small files, both written durably (temporary file, fsync, rename,
fsync of the directory) whatever `--fsync` says, since they are written rarely and decide
whether a member votes:

- `<data-dir>/quorum.incarnation`: a random id written at the broker's first start. A lost
  disk loses it; the next start writes a new one. Members record the incarnation they joined
  a journal with in the keyspace (member_registry.py), so "this broker joined, but with another
  disk" is visible after the disk is gone.
- `<data-dir>/quorum/<journal>/mark`, beside the member's log, while the member is not a full
  voter: `joining` (written before a new log file is created, until the broker has looked the
  member up in the keyspace and recorded it) or `lost` (the member lost its disk and is not
  caught up yet: removed once `Member.voter` latches, after the log that made it a voter is in
  its file). A restart before catching up therefore stays a non-voter, though its log file is
  no longer new.
- `<data-dir>/quorum/<journal>/journal`: the identity of the journal these files belong to,
  the create revision of its spec key (written before a new log file is created). A journal
  deleted and re-created under the same name has another: the earlier journal's files are
  moved aside (`retire_member_files`, to `<data-dir>/quorum-retired/<journal>@<revision>/`)
  and the member starts fresh. Moved, not removed: a revision can also change without the
  journal being re-created (etcd's keys copied into a new cluster get new revisions), and
  then the retired log holds committed entries not yet in the fragment store, which an
  operator can move back. Nothing removes them: an operator does, once the journal's content
  is known to be persisted (`gazctl journals fragments`).

Only these named files are ever touched: a member directory may also hold the directories of
journals whose names extend this one's (`a/b` under `a`).
"""

from __future__ import annotations

import enum
import os
import secrets
from pathlib import Path
from typing import Final

from broker.durable_file import replace_durably
from broker.fragment.spool_named import fsync_dir
from broker.quorum.log_codec import HEADER

INCARNATION_FILE_NAME: Final = "quorum.incarnation"
MARK_FILE_NAME: Final = "mark"
JOURNAL_FILE_NAME: Final = "journal"
# Every file a member directory may hold (log_file.py's log and its rewrite's temporary too).
MEMBER_FILE_NAMES: Final = ("log", "log.tmp", MARK_FILE_NAME, MARK_FILE_NAME + ".tmp")
# An incarnation is 16 hex digits; a file holding anything else is not ours.
_INCARNATION_HEX_DIGITS: Final = 16


class MemberDirError(OSError):
    """A file of the member directory holds something this broker never writes (named)."""


class Mark(enum.Enum):
    JOINING = "joining"
    LOST = "lost"


def _write_durably(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_durably(path, data)


def load_incarnation(data_dir: str | Path) -> str:
    """This broker's incarnation under `data_dir`, written there first if absent."""
    path = Path(data_dir) / INCARNATION_FILE_NAME
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        incarnation = secrets.token_hex(_INCARNATION_HEX_DIGITS // 2)
        _write_durably(path, incarnation.encode() + b"\n")
        return incarnation
    if len(text) != _INCARNATION_HEX_DIGITS or any(c not in "0123456789abcdef" for c in text):
        raise MemberDirError(f"{path}: not an incarnation id ({text[:40]!r})")
    return text


def log_is_new(log_path: Path) -> bool:
    """Whether a member log file holds nothing the member ever acted on: absent, or shorter
    than its header (written and synced before any record, so a member that answered anything
    had at least that)."""
    try:
        return log_path.stat().st_size < len(HEADER)
    except FileNotFoundError:
        return True


def read_mark(member_dir: Path) -> Mark | None:
    path = member_dir / MARK_FILE_NAME
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    try:
        return Mark(text)
    except ValueError:
        raise MemberDirError(f"{path}: not a member mark ({text[:40]!r})") from None


def write_mark(member_dir: Path, mark: Mark) -> None:
    _write_durably(member_dir / MARK_FILE_NAME, mark.value.encode() + b"\n")


def clear_mark(member_dir: Path) -> None:
    try:
        (member_dir / MARK_FILE_NAME).unlink()
    except FileNotFoundError:
        return
    fsync_dir(member_dir)


def read_journal_revision(member_dir: Path) -> int | None:
    """The journal identity the member files were written for (None: not recorded)."""
    path = member_dir / JOURNAL_FILE_NAME
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    if not text.isdigit():
        raise MemberDirError(f"{path}: not a journal revision ({text[:40]!r})")
    return int(text)


def write_journal_revision(member_dir: Path, revision: int) -> None:
    _write_durably(member_dir / JOURNAL_FILE_NAME, f"{revision}\n".encode())


RETIRED_DIR_NAME: Final = "quorum-retired"


def retired_dir(data_dir: str | Path, journal: str, revision: int) -> Path:
    """Where the member files of `journal`'s earlier incarnation (created at `revision`) go."""
    return Path(data_dir) / RETIRED_DIR_NAME / f"{journal}@{revision}"


def retire_member_files(member_dir: Path, to: Path) -> list[str]:
    """Move the member files of an earlier journal into `to` (its identity file last, so that
    a crash midway moves the rest on the next start); the names moved. A file already in `to`
    (a crash midway, then the same move again) is replaced."""
    to.mkdir(parents=True, exist_ok=True)
    moved = []
    for name in (*MEMBER_FILE_NAMES, JOURNAL_FILE_NAME):
        try:
            os.replace(member_dir / name, to / name)
        except FileNotFoundError:
            continue
        moved.append(name)
    fsync_dir(to)
    fsync_dir(member_dir)
    return moved
