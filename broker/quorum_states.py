"""The quorum state of listed journals, as `gazctl journals list` and the HTTP gateway's
`/debug/journals` show it: for each quorum journal, the term, the leader, and whether the
election is blocked, with the lost members.

The term, leader and ensemble are the term register's, as the broker asked mirrors it. Whether
an election is blocked (too many members back from a lost disk to elect: only an operator can
unblock it, docs/design/quorum.md) is known only to the members' coordinators, so every
member broker of a listed quorum journal is asked too (`gazette.quorum.Replica/Status`,
quorum_shell/status.py), concurrently, each within `status_timeout_s`: the route's members,
and the members the register names outside the route (a node kept for the register, its
journal not assigned to its broker: listed under `kept`), at the endpoints the asked broker's
mirror has for them. A member that does not
answer is named under `unanswered` (its view is unknown: it may be down); the listing still
succeeds. A broker that does not serve Status at all (a Go broker) answers UNIMPLEMENTED: its
journals show no quorum state beyond the route.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Final

import grpc
import grpc.aio

from broker.client.route_cache import ChannelPool
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import is_quorum_journal
from broker.quorum_shell.status import JournalStatus, StatusDecodeError, fetch_status
from broker.topology import format_id

# Per Status call (one per member broker, concurrently).
status_timeout_s: Final = 5.0


async def quorum_states(
    channels: ChannelPool, endpoint: str, journals: Sequence[pb.ListResponse.Journal]
) -> dict[str, dict[str, Any]]:
    """The quorum state of each quorum journal in `journals`, by name (see the module
    docstring). `endpoint` is the broker the listing came from. Raises grpc.aio.AioRpcError or
    StatusDecodeError if that broker's answer fails."""
    quorum = [j for j in journals if is_quorum_journal(j.spec.labels)]
    if not quorum:
        return {}
    names = [j.spec.name for j in quorum]
    try:
        registers = await fetch_status(channels.get(endpoint), names, timeout_s=status_timeout_s)
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.UNIMPLEMENTED:
            return {}
        raise
    # Which journals to ask each member broker about (by endpoint), and its member name.
    asked: dict[str, list[str]] = {}
    member_of: dict[str, str] = {}
    for j in quorum:
        members = {
            format_id(m): ep for m, ep in zip(j.route.members, j.route.endpoints, strict=False)
        }
        register = registers.get(j.spec.name)
        if register is not None:  # the register's members outside the route
            for member, ep in register.endpoints:
                members.setdefault(member, ep)
        for member, ep in members.items():
            if ep:
                asked.setdefault(ep, []).append(j.spec.name)
                member_of[ep] = member
    endpoints = list(asked)
    answers = await asyncio.gather(
        *(
            fetch_status(channels.get(ep), asked[ep], timeout_s=status_timeout_s)
            for ep in endpoints
        ),
        return_exceptions=True,
    )
    views: dict[str, list[JournalStatus]] = {}
    unanswered: dict[str, list[str]] = {}
    for ep, answer in zip(endpoints, answers, strict=True):
        if isinstance(answer, grpc.aio.AioRpcError | StatusDecodeError):
            for name in asked[ep]:
                unanswered.setdefault(name, []).append(member_of[ep])
        elif isinstance(answer, BaseException):
            raise answer
        else:
            for name, status in answer.items():
                views.setdefault(name, []).append(status)
    return {
        j.spec.name: state_of(
            registers.get(j.spec.name),
            views.get(j.spec.name, []),
            unanswered.get(j.spec.name, []),
        )
        for j in quorum
    }


def state_of(
    register: JournalStatus | None, members: Sequence[JournalStatus], unanswered: Sequence[str]
) -> dict[str, Any]:
    """One journal's state: the register's term, leader and ensemble (and `previous` while a
    change is not settled); `election` is "leader" (one is appointed), "electing" (none yet)
    or "blocked" (a member's coordinator found too many members lost), with the blocked term,
    lost members and voters needed; `kept`: members whose node runs only for the register;
    `failed`: members whose node stopped, and why (started again after a back-off);
    `register_errors`: members whose last term register request failed, and why."""
    term = register.term if register is not None else 0
    leader = register.leader if register is not None else ""
    state: dict[str, Any] = {"term": term, "leader": leader}
    if register is not None and register.ensemble:
        state["ensemble"] = sorted(register.ensemble)
        if register.previous:
            state["previous"] = sorted(register.previous)
    # The newest blocked election any member reports; a leader appointed since ends it.
    blocked = max(
        (m.blocked for m in members if m.blocked is not None),
        key=lambda b: b.term,
        default=None,
    )
    lost = sorted({m.member for m in members if m.lost} | set(blocked.lost if blocked else ()))
    if leader:
        state["election"] = "leader"
    elif blocked is not None:
        state["election"] = "blocked"
        state["blocked"] = {
            "term": blocked.term,
            "lost": list(blocked.lost),
            "voters_needed": blocked.voters_needed,
        }
    else:
        state["election"] = "electing"
    if lost:
        state["lost"] = lost
    kept = sorted({m.member for m in members if m.kept})
    if kept:
        state["kept"] = kept
    failed = {m.member: m.failed for m in sorted(members, key=lambda m: m.member) if m.failed}
    if failed:
        state["failed"] = failed
    register_errors = {
        m.member: m.register_error
        for m in sorted(members, key=lambda m: m.member)
        if m.register_error
    }
    if register_errors:
        state["register_errors"] = register_errors
    if unanswered:
        state["unanswered"] = sorted(unanswered)
    return state
