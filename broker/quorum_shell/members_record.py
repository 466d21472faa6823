"""`<root>/quorum-members/<journal>`: which members joined a quorum journal, with which broker
disk (member_registry.py says why). Sans-IO: the value's codec and the key.

The value is JSON, versioned (`etcdctl get` shows it): the journal's identity, the create
revision of its spec key (a journal deleted and re-created under the same name has another, so
its record of the earlier journal counts as empty), and, per member name (`zone#suffix`), the
incarnation (member_dir.py) of the disk it joined with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Final

MEMBERS_RECORD_FORMAT: Final = 1
QUORUM_MEMBERS: Final = "/quorum-members/"
# A record naming more members than this is malformed: over a journal's lifetime the ensemble
# changes (allocator moves), but never past a few dozen names.
members_recorded_max: Final = 64


class MembersRecordDecodeError(ValueError):
    """A `quorum-members` value that is not a valid, known-format record."""


def quorum_members_key(root: str, journal: str) -> str:
    return root + QUORUM_MEMBERS + journal


@dataclass(frozen=True, slots=True)
class MembersRecord:
    journal_revision: int  # the create revision of the journal's spec key
    members: dict[str, str] = field(default_factory=dict)  # name -> incarnation


def encode_members_record(record: MembersRecord) -> bytes:
    doc = {
        "format": MEMBERS_RECORD_FORMAT,
        "journal_revision": record.journal_revision,
        "members": dict(sorted(record.members.items())),
    }
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
    return MembersRecord(revision, dict(members))


@dataclass(frozen=True, slots=True)
class QuorumMembers:
    """`<root>/quorum-members/<journal>`, as the KeySpace decodes it."""

    journal: str
    record: MembersRecord
