"""`gazette.quorum.Replica/Status`: a broker's view of quorum journals, for `gazctl journals
list` (and operators), beside the replication RPC and outside Gazette's protocol messages (a
Go client never calls it; no Gazette message gains a field).

One unary call, JSON both ways (`etcdctl`-readable, like the term register): the request names
at most `status_journals_max` journals; the answer holds, per journal:

- from the broker's keyspace mirror, the term register (`<root>/quorum/<journal>`): the term,
  the leader it names ("" while electing), the ensemble and `previous` (while a change is not
  settled), with the endpoints of the members these name, from their BrokerSpecs (a member
  outside the journal's route, kept for the register, is found so). Every broker answers the
  same at one revision, member or not.
- from the broker's own node of the journal, if it has one: whether this member is *lost* (back
  from a lost disk, not caught up: no vote), whether its coordinator found the election
  *blocked* (ElectionBlocked: too many members lost their disk; only an operator can unblock
  it), whether the node is *kept* only because the term register names this member, the
  journal not being assigned here (journals.py), and why the node *failed*, if it stopped
  (its log could not be written: the broker starts it again after a back-off), or why there is
  no node (its log could not be opened: "log not opened: ..."), and why its last request to
  the term register failed (an election that cannot finish: etcd out of space or
  unreachable). Only a member knows these, so
  a client asks every member (gazctl asks the route's and the register's).

Sans-IO codec and view here; `status_handler` serves it, `fetch_status` calls it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import grpc
import grpc.aio

from broker.keyspace.keyspace import KeySpace
from broker.protocol.validate import ValidationError, validate_journal_name
from broker.quorum.coordinator import ElectionBlocked
from broker.quorum_shell.node import QuorumNode
from broker.quorum_shell.term_record import QuorumTerm
from broker.quorum_shell.wire import SERVICE
from broker.topology import Decoded, JournalItem, lookup_item, lookup_member, quorum_term_key

STATUS_METHOD: Final = f"/{SERVICE}/Status"
STATUS_FORMAT: Final = 1
# Journals per Status request: a listing of more is asked in several requests.
status_journals_max: Final = 512
# One answer at most (an ensemble is at most 5 names): far above status_journals_max entries.
status_bytes_max: Final = 4 << 20


class StatusDecodeError(ValueError):
    """A Status request or answer that is not valid JSON of the known format."""


@dataclass(frozen=True, slots=True)
class Blocked:
    """A coordinator's blocked election (ElectionBlocked), as answered."""

    term: int
    lost: tuple[str, ...]  # members back from a lost disk, not caught up (no vote)
    voters_needed: int


@dataclass(frozen=True, slots=True)
class JournalStatus:
    journal: str
    term: int  # the term register's (0: no term claimed yet)
    leader: str  # the leader the register names ("" while electing)
    ensemble: tuple[str, ...]
    member: str = ""  # this broker's member name, if it runs a node (or failed to open its log)
    lost: bool = False  # this member is back from a lost disk and not caught up
    blocked: Blocked | None = None  # this member's coordinator found the election blocked
    # The node runs only because the term register names this member, the journal not being
    # assigned to this broker (QuorumNode.kept_unassigned).
    kept: bool = False
    # Why this member's node stopped ("" while it runs): its log could not be written (a full
    # disk: the broker starts it again after a back-off), or an impossible message; or why it
    # has none ("log not opened: ...").
    failed: str = ""
    # Why this member's last request to the term register failed ("" if it succeeded): an
    # election that does not finish says why (etcd out of space or unreachable).
    register_error: str = ""
    previous: tuple[str, ...] = ()  # the register's, while an ensemble change is not settled
    # (member, endpoint) of the members the register names, as their BrokerSpecs announce
    # them (those not announced are left out).
    endpoints: tuple[tuple[str, str], ...] = ()


def journal_status(
    ks: KeySpace[Decoded],
    root: str,
    journal: str,
    node: QuorumNode | None,
    *,
    open_error: Exception | None = None,
    member: str = "",
) -> JournalStatus:
    """The status of `journal` from the mirror and this broker's `node` of it (None: none).
    Without a node because its log could not be opened (`open_error`: a full disk, a corrupt
    file), this broker (`member`) reports itself failed, saying why: else the journal would
    look whole while one of its members takes no part."""
    entry = ks.get(quorum_term_key(root, journal))
    term = entry.decoded if entry is not None else None
    item = lookup_item(ks, root, journal)
    revision = item.kv.create_revision if item is not None else 0
    if isinstance(item.decoded if item else None, JournalItem) and isinstance(term, QuorumTerm):
        stale = bool(term.journal_revision) and term.journal_revision != revision
        record = term.record
        # The register of an earlier journal of this name: its term goes on, no leader.
        status = JournalStatus(
            journal,
            record.term,
            "" if stale else record.leader,
            record.ensemble,
            previous=record.previous,
            endpoints=_endpoints(ks, root, (*record.ensemble, *record.previous)),
        )
    else:
        status = JournalStatus(journal, 0, "", ())
    if node is None:
        if open_error is None or not member:
            return status
        why = f"log not opened: {type(open_error).__name__}: {open_error}"
        return replace(status, member=member, failed=why)
    blocked = node.election_blocked
    return replace(
        status,
        member=node.name,
        lost=node.member.lost_state,
        blocked=None if blocked is None else _blocked(blocked),
        kept=node.kept_unassigned,
        failed="" if node.failure is None else f"{type(node.failure).__name__}: {node.failure}",
        register_error=_why(node.register_error),
    )


def _why(err: Exception | None) -> str:
    return "" if err is None else f"{type(err).__name__}: {err}"


def _endpoints(
    ks: KeySpace[Decoded], root: str, members: Sequence[str]
) -> tuple[tuple[str, str], ...]:
    out = []
    for name in sorted(set(members)):
        zone, _, suffix = name.partition("#")
        member = lookup_member(ks, root, zone, suffix)
        if member is not None and member.spec.process_spec.endpoint:
            out.append((name, member.spec.process_spec.endpoint))
    return tuple(out)


def _blocked(b: ElectionBlocked) -> Blocked:
    return Blocked(b.term, tuple(b.non_voters), b.voters_needed)


# --- Codec --------------------------------------------------------------------------------


def encode_request(journals: Sequence[str]) -> bytes:
    return json.dumps({"format": STATUS_FORMAT, "journals": list(journals)}).encode()


def decode_request(raw: bytes) -> list[str]:
    """The journals a request names; raises StatusDecodeError or ValidationError."""
    doc = _json(raw, "request")
    journals = doc.get("journals")
    if not isinstance(journals, list) or not all(isinstance(j, str) for j in journals):
        raise StatusDecodeError("quorum status request: journals must be a list of names")
    if len(journals) > status_journals_max:
        raise StatusDecodeError(
            f"quorum status request: at most {status_journals_max} journals"
            f" (status_journals_max; got {len(journals)})"
        )
    for index, journal in enumerate(journals):
        try:
            validate_journal_name(journal)
        except ValidationError as err:
            raise StatusDecodeError(f"quorum status request: journals[{index}]: {err}") from err
    return journals


def encode_response(statuses: Sequence[JournalStatus]) -> bytes:
    docs = []
    for s in statuses:
        doc: dict[str, Any] = {
            "journal": s.journal,
            "term": s.term,
            "leader": s.leader,
            "ensemble": list(s.ensemble),
        }
        # Left out when empty: answers as before these fields existed.
        if s.previous:
            doc["previous"] = list(s.previous)
        if s.endpoints:
            doc["endpoints"] = dict(s.endpoints)
        if s.member:
            doc["member"] = s.member
            doc["lost"] = s.lost
            if s.kept:  # left out otherwise: answers as before this field existed
                doc["kept"] = True
            if s.failed:  # likewise
                doc["failed"] = s.failed
            if s.register_error:  # likewise
                doc["register_error"] = s.register_error
        if s.blocked is not None:
            b = s.blocked
            doc["blocked"] = {
                "term": b.term,
                "lost": list(b.lost),
                "voters_needed": b.voters_needed,
            }
        docs.append(doc)
    return json.dumps({"format": STATUS_FORMAT, "journals": docs}).encode()


def decode_response(raw: bytes) -> dict[str, JournalStatus]:
    """The statuses of an answer, by journal; raises StatusDecodeError."""
    doc = _json(raw, "answer")
    out: dict[str, JournalStatus] = {}
    journals = doc.get("journals")
    if not isinstance(journals, list):
        raise StatusDecodeError("quorum status answer: journals must be a list")
    for d in journals:
        try:
            blocked = d.get("blocked")
            status = JournalStatus(
                journal=_typed(d["journal"], str),
                term=_typed(d["term"], int),
                leader=_typed(d["leader"], str),
                ensemble=tuple(_typed(m, str) for m in d["ensemble"]),
                member=_typed(d.get("member", ""), str),
                lost=_typed(d.get("lost", False), bool),
                kept=_typed(d.get("kept", False), bool),
                failed=_typed(d.get("failed", ""), str),
                register_error=_typed(d.get("register_error", ""), str),
                previous=tuple(_typed(m, str) for m in d.get("previous", ())),
                endpoints=tuple(
                    (_typed(m, str), _typed(e, str))
                    for m, e in sorted(_typed(d.get("endpoints", {}), dict).items())
                ),
                blocked=None
                if blocked is None
                else Blocked(
                    _typed(blocked["term"], int),
                    tuple(_typed(m, str) for m in blocked["lost"]),
                    _typed(blocked["voters_needed"], int),
                ),
            )
        except (KeyError, TypeError, AttributeError) as err:
            raise StatusDecodeError(f"quorum status answer: malformed entry {d!r:.120}") from err
        out[status.journal] = status
    return out


def _json(raw: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise StatusDecodeError(f"quorum status {what} is not JSON: {err}") from err
    if not isinstance(doc, dict) or doc.get("format") != STATUS_FORMAT:
        raise StatusDecodeError(f"quorum status {what}: format must be {STATUS_FORMAT}")
    return doc


def _typed(value: Any, kind: type) -> Any:
    # bool is an int in Python: an int field must not take one, nor a bool field an int.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"{value!r} is not a {kind.__name__}")
    return value


# --- Server and client --------------------------------------------------------------------


def status_handler(
    ks: KeySpace[Decoded],
    root: str,
    nodes: Mapping[str, QuorumNode],
    open_errors: Mapping[str, Exception] | None = None,
    member: str = "",
) -> grpc.GenericRpcHandler:
    """Serves Status from the mirror `ks` and this broker's (`member`'s) `nodes` and the
    errors of logs it could not open (`open_errors`), by journal. A malformed request is
    refused INVALID_ARGUMENT, naming what was wrong."""
    errors: Mapping[str, Exception] = open_errors if open_errors is not None else {}

    async def status(raw: bytes, context: Any) -> bytes:
        try:
            journals = decode_request(raw)
        except StatusDecodeError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            raise AssertionError("not reached") from err
        return encode_response(
            [
                journal_status(ks, root, j, nodes.get(j), open_error=errors.get(j), member=member)
                for j in journals
            ]
        )

    handler = grpc.unary_unary_rpc_method_handler(
        status, request_deserializer=None, response_serializer=None
    )
    return grpc.method_handlers_generic_handler(SERVICE, {"Status": handler})


async def fetch_status(
    channel: grpc.aio.Channel, journals: Sequence[str], *, timeout_s: float
) -> dict[str, JournalStatus]:
    """Ask the broker behind `channel` for the status of `journals` (in requests of at most
    `status_journals_max`). Raises grpc.aio.AioRpcError or StatusDecodeError."""
    call = channel.unary_unary(STATUS_METHOD, request_serializer=None, response_deserializer=None)
    out: dict[str, JournalStatus] = {}
    for start in range(0, len(journals), status_journals_max):
        part = journals[start : start + status_journals_max]
        raw = await call(encode_request(part), timeout=timeout_s)
        if len(raw) > status_bytes_max:
            raise StatusDecodeError(f"quorum status answer over {status_bytes_max} bytes")
        out.update(decode_response(raw))
    return out
