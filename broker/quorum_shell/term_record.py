"""The term register's value in the keyspace: the wire form of a `TermRecord`, and the
compare-and-swap transaction that writes it. Sans-IO: `term_register.py` runs it on a backend.

The record lives at `<root>/quorum/<journal>` (`topology.quorum_term_key`), beside the
journal's spec and assignments. Its revision, as the core sees it (`Versioned.revision`), is
the key's etcd mod revision; an absent key is revision 0 holding the initial record (term 0,
the journal's route as the ensemble), so the first claim is a CAS on "mod revision 0", which
etcd (and the embedded keyspace) evaluate as "the key does not exist".

The value is JSON, versioned, so that `etcdctl get` shows it; it is small and written once
per term.

Journal identity. A record also names the journal it belongs to: `journal_revision`, the create
revision of the journal's spec key (absent in records written before it existed: taken as the
current journal's). A journal deleted and re-created under the same name has another spec key
revision, so the earlier journal's record, still in the keyspace, is read as a record of no
leader, at its term and revision, with the route as the ensemble: the next claim goes on from
its term (terms never go back) with the new journal's members, who start from fresh logs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeGuard

from broker.keyspace.backend import (
    Compare,
    CompareResult,
    CompareTarget,
    KeyValue,
    Op,
    OpGet,
    OpPut,
    TxnResponse,
)
from broker.quorum.register import CasResult, TermRecord, Versioned

TERM_RECORD_FORMAT = 1
# A record naming more members than this is malformed: the protocol caps replication at 5, and
# replacing a member of five adds the new one before removing the old (Rules.next_ensemble).
ENSEMBLE_MEMBERS_MAX = 6


class TermRecordDecodeError(ValueError):
    """A term register value that is not a valid, known-format TermRecord."""


@dataclass(frozen=True, slots=True)
class QuorumTerm:
    """`<root>/quorum/<journal>`: the journal's term register, as the KeySpace decodes it."""

    journal: str
    record: TermRecord
    journal_revision: int = 0  # the journal identity the record names (0: none)


def encode_term_record(record: TermRecord, journal_revision: int = 0) -> bytes:
    """The value of `record`; `journal_revision` (0: none) is the identity of the journal it
    belongs to (see the module docstring)."""
    doc: dict[str, object] = {
        "format": TERM_RECORD_FORMAT,
        "term": record.term,
        "owner": record.owner,
        "ensemble": list(record.ensemble),
        "leader": record.leader,
    }
    if journal_revision:
        doc["journal_revision"] = journal_revision
    if record.previous:  # left out when settled: such records are as before ensemble changes
        doc["previous"] = list(record.previous)
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def record_journal_revision(value: bytes) -> int:
    """The journal identity a (valid) record names; 0 if it names none."""
    revision = json.loads(value).get("journal_revision", 0)
    if not isinstance(revision, int) or isinstance(revision, bool) or revision < 0:
        raise TermRecordDecodeError(
            f"term record: journal_revision must be an integer >= 0 (got {revision!r})"
        )
    return revision


def decode_term_record(value: bytes) -> TermRecord:
    try:
        doc = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TermRecordDecodeError(f"term record is not JSON: {err}") from err
    if not isinstance(doc, dict) or doc.get("format") != TERM_RECORD_FORMAT:
        raise TermRecordDecodeError(
            f"term record format must be {TERM_RECORD_FORMAT} (got {value[:64]!r})"
        )
    term, owner, ensemble, leader = (doc.get(k) for k in ("term", "owner", "ensemble", "leader"))
    if not isinstance(term, int) or isinstance(term, bool) or term < 0:
        raise TermRecordDecodeError(f"term record: term must be an integer >= 0 (got {term!r})")
    if not isinstance(owner, str) or not isinstance(leader, str):
        raise TermRecordDecodeError("term record: owner and leader must be strings")
    if not _is_ensemble(ensemble):
        raise TermRecordDecodeError(
            f"term record: ensemble must be 1..{ENSEMBLE_MEMBERS_MAX} distinct member names"
            f" (got {ensemble!r})"
        )
    if leader and leader not in ensemble:
        raise TermRecordDecodeError(f"term record: leader {leader!r} is not in the ensemble")
    previous = doc.get("previous", [])
    if previous != [] and not _is_ensemble(previous):
        raise TermRecordDecodeError(
            f"term record: previous must be 1..{ENSEMBLE_MEMBERS_MAX} distinct member names"
            f" (got {previous!r})"
        )
    return TermRecord(term, owner, tuple(ensemble), leader, tuple(previous))


def _is_ensemble(value: object) -> TypeGuard[list[str]]:
    return (
        isinstance(value, list)
        and 1 <= len(value) <= ENSEMBLE_MEMBERS_MAX
        and all(isinstance(m, str) and m for m in value)
        and len(set(value)) == len(value)
    )


def initial_record(ensemble: Sequence[str]) -> Versioned:
    """The register of a journal no coordinator has written: term 0, revision 0."""
    return Versioned(TermRecord(0, "", tuple(ensemble)), 0)


def versioned_of(
    kvs: Sequence[KeyValue], ensemble: Sequence[str], journal_revision: int = 0
) -> Versioned:
    """The register as read: the key's record at its mod revision, or the initial record. A
    record of another journal than `journal_revision` (0: do not check) is read as no leader
    at its term, with `ensemble` (see the module docstring)."""
    if not kvs:
        return initial_record(ensemble)
    kv = kvs[0]
    record = decode_term_record(kv.value)
    if journal_revision:
        recorded = record_journal_revision(kv.value)
        if recorded and recorded != journal_revision:
            record = TermRecord(record.term, "", tuple(ensemble))
    return Versioned(record, kv.mod_revision)


def cas_txn(
    key: bytes, expect_revision: int, record: TermRecord, journal_revision: int = 0
) -> tuple[list[Compare], list[Op], list[Op]]:
    """Compares, success and failure ops of one CAS: put `record` if the key's mod revision is
    still `expect_revision` (0: the key is absent); read the key back either way, so that the
    answer carries the register after the attempt."""
    compares = [Compare(key, CompareTarget.MOD, CompareResult.EQUAL, expect_revision)]
    put = OpPut(key, encode_term_record(record, journal_revision))
    return compares, [put, OpGet(key)], [OpGet(key)]


def cas_result(resp: TxnResponse, ensemble: Sequence[str], journal_revision: int = 0) -> CasResult:
    """Interpret the response of `cas_txn`'s transaction."""
    read = resp.results[-1]
    if not isinstance(read, tuple):
        raise TermRecordDecodeError(f"term register transaction answered {read!r}, not a read")
    return CasResult(resp.succeeded, versioned_of(read, ensemble, journal_revision))
