"""`<root>/quorum-members/<journal>`: which members joined a quorum journal, with which broker
disk (member_registry.py says why). Sans-IO: the value's codec and the key.

The value is JSON, versioned (`etcdctl get` shows it): the journal's identity, the create
revision of its spec key (a journal deleted and re-created under the same name has another, so
its record of the earlier journal counts as empty), and, per member name (`zone#suffix`), the
incarnation (member_dir.py) of the disk it joined with.

Bounded: every replica move (ensemble change) brings a member the record did not name, so a
long-lived journal's record would outgrow `members_recorded_max`. A member recorded past it
first prunes the members the term register no longer names (neither its ensemble nor its
`previous`), and the record counts them in `pruned` (written only once non-zero: records of
journals that never pruned are byte for byte as before). Safe whatever is pruned, because a
record that pruned anything no longer vouches for an unrecorded member being new:
`member_registry.decide` then starts a member whose log is new and who is not recorded *lost*
(no vote until a leader caught it up), as for a member recorded with another disk. A pruned
member back with its log is unaffected (its log is its own). The ensemble filter only keeps
the record exact for the members that are likely to come back soon.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Final

MEMBERS_RECORD_FORMAT: Final = 1
QUORUM_MEMBERS: Final = "/quorum-members/"
# A record naming more members than this is malformed: over a journal's lifetime the ensemble
# changes (allocator moves), but never past a few dozen names.
members_recorded_max: Final = 64


class MembersRecordDecodeError(ValueError):
    """A `quorum-members` value that is not a valid, known-format record."""


class MembersRecordFullError(ValueError):
    """A member cannot be recorded: the members to keep alone exceed `members_recorded_max`."""


def quorum_members_key(root: str, journal: str) -> str:
    return root + QUORUM_MEMBERS + journal


@dataclass(frozen=True, slots=True)
class MembersRecord:
    journal_revision: int  # the create revision of the journal's spec key
    members: dict[str, str] = field(default_factory=dict)  # name -> incarnation
    # Members pruned over the record's lifetime (0: never; see the module docstring).
    pruned: int = 0


def with_member(
    record: MembersRecord, member: str, incarnation: str, keep: Collection[str]
) -> MembersRecord:
    """`record` with `member` recorded with `incarnation`. Past `members_recorded_max`, every
    member but `member` and those in `keep` (the term register's ensemble and `previous`) is
    pruned first, and counted in `pruned`. Raises MembersRecordFullError if that is not
    enough, changing nothing."""
    members = dict(record.members)
    members[member] = incarnation
    if len(members) <= members_recorded_max:
        return MembersRecord(record.journal_revision, members, record.pruned)
    kept = {name: inc for name, inc in members.items() if name == member or name in keep}
    if len(kept) > members_recorded_max:
        raise MembersRecordFullError(
            f"quorum members record: {len(kept)} members to keep exceed {members_recorded_max}"
        )
    return MembersRecord(record.journal_revision, kept, record.pruned + len(members) - len(kept))


def encode_members_record(record: MembersRecord) -> bytes:
    doc: dict[str, object] = {
        "format": MEMBERS_RECORD_FORMAT,
        "journal_revision": record.journal_revision,
        "members": dict(sorted(record.members.items())),
    }
    if record.pruned:
        doc["pruned"] = record.pruned
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def decode_members_record(value: bytes) -> MembersRecord:
    try:
        doc = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise MembersRecordDecodeError(f"quorum members record is not JSON: {err}") from err
    if not isinstance(doc, dict) or doc.get("format") != MEMBERS_RECORD_FORMAT:
        raise MembersRecordDecodeError(
            f"quorum members record format must be {MEMBERS_RECORD_FORMAT} (got {value[:64]!r})"
        )
    revision, members = doc.get("journal_revision"), doc.get("members")
    if not isinstance(revision, int) or isinstance(revision, bool) or revision < 0:
        raise MembersRecordDecodeError(
            f"quorum members record: journal_revision must be an integer >= 0 (got {revision!r})"
        )
    if (
        not isinstance(members, dict)
        or len(members) > members_recorded_max
        or not all(isinstance(k, str) and k and isinstance(v, str) for k, v in members.items())
    ):
        raise MembersRecordDecodeError(
            f"quorum members record: members must map at most {members_recorded_max} names to"
            f" incarnations (got {str(members)[:120]})"
        )
    pruned = doc.get("pruned", 0)
    if not isinstance(pruned, int) or isinstance(pruned, bool) or pruned < 0:
        raise MembersRecordDecodeError(
            f"quorum members record: pruned must be an integer >= 0 (got {pruned!r})"
        )
    return MembersRecord(revision, dict(members), pruned)


@dataclass(frozen=True, slots=True)
class QuorumMembers:
    """`<root>/quorum-members/<journal>`, as the KeySpace decodes it."""

    journal: str
    record: MembersRecord
