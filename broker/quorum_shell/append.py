"""Journal.Append for quorum journals: the Gazette client's RPC, unchanged, served by the
journal's quorum node (journals.py).

The leader collects the append's content (every message up to the empty commit marker, then
the end of the stream) into one entry, appends it, and answers once a majority holds it in the
leader's term: status OK, the committed fragment [begin, end) with the SHA1 of its content, and
a header whose route names the leader as primary. Any other broker (a follower, a member whose
node has not heard of the leader yet, a broker outside the route) proxies the append to the
leader, named by its node or else by the term register (leader_route.py), as an all-replicas
replica proxies to the primary (`proxy`, append_api.py: bounded retries while the leader
cannot be reached); with `do_not_proxy`, or for a request another broker proxied here, it
answers NOT_JOURNAL_PRIMARY_BROKER with the route naming the leader, which a Gazette client
follows (NO_JOURNAL_PRIMARY_BROKER while no leader is known). While no leader is known (an
election), the append first waits up to `quorum_leader_wait_s` for one. A stream that ends
without the commit marker appends nothing.

As every Gazette append: content for a journal whose flags do not allow writes is answered
NOT_ALLOWED; an append naming an `offset` where it would not land WRONG_APPEND_OFFSET; one
whose fragment stores hold content beyond the log's head INDEX_HAS_GREATER_OFFSET
(append_offset.py); each with nothing appended. Requests to suspend the journal are refused
(FAILED_PRECONDITION: not built for quorum journals).

Registers (registers.py): the leader checks `check_registers` against the journal's registers
as of its log's head and the entry carries the registers its `union_registers` /
`subtract_registers` leave. A failed check is answered REGISTER_MISMATCH with the registers it
failed against, once they are committed (UNAVAILABLE, outcome unknown, if the leader steps
down first: a new leader may have truncated them); a committed append is answered with the
registers after it. As in all-replicas mode, a register update needs content
(INVALID_ARGUMENT, nothing appended).
Committed content reaches the spool through each member's applier (apply.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from broker.append_rules import may_write
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import ValidationError
from broker.quorum.errors import (
    EmptyRegisterUpdateError,
    LogFullError,
    NotLeaderError,
    PendingAppendsFullError,
    ProtocolError,
)
from broker.quorum_shell.append_offset import AppendOffsetError, StoreAheadOfLogError
from broker.quorum_shell.journals import IndexNotListedError, QuorumJournals
from broker.quorum_shell.node import AppendOutcomeUnknownError, LogWriteError
from broker.quorum_shell.registers import label_set_of, register_check, register_update
from broker.request_stream import read_to_end
from broker.topology import make_header, same_id

# How long an append waits for an election to name a leader before it is answered
# NO_JOURNAL_PRIMARY_BROKER: a coordinator replaces a silent leader within about 2.5 s.
quorum_leader_wait_s = 5.0

# Suspension controls that ask to suspend the journal (append_suspend.py): not built for
# quorum journals. SUSPEND_RESUME, SUSPEND_NO_RESUME and SUSPEND_KEEP leave an unsuspended
# journal as it is, so plain appends and reset-head go through.
_SUSPENSIONS = frozenset((pb.AppendRequest.SUSPEND_IF_FLUSHED, pb.AppendRequest.SUSPEND_NOW))

# One quorum append is one entry, carried whole in one Replicate message (wire.py's envelope
# bound holds it in base64): larger appends are refused RESOURCE_EXHAUSTED.
quorum_append_bytes_max = 2 << 20


# Forwards the append to the broker `header.process_id` names, with `header`, and relays its
# answer (append_api.proxy_append, with its bounded retries).
ProxyAppend = Callable[[pb.Header], Awaitable[pb.AppendResponse]]


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, detail: str) -> None:
    await context.abort(code, f"append (quorum): {detail}")
    raise AssertionError("not reached")  # context.abort raises.


async def quorum_append(
    journals: QuorumJournals,
    local_id: pb.ProcessSpec.ID,
    etcd: pb.Header.Etcd,
    first: pb.AppendRequest,
    spec: pb.JournalSpec,
    stream: AsyncIterator[Any],
    context: grpc.aio.ServicerContext,
    *,
    told: pb.Route | None = None,
    proxy: ProxyAppend | None = None,
) -> pb.AppendResponse:
    """Serve `first` + `stream` (see the module docstring). `told` is the route the mirror
    tells clients (leader_route.py), for a broker without a node or whose node knows no
    leader; `proxy` forwards the append to the broker its header names (None: redirect)."""
    journal = first.journal
    node = journals.nodes.get(journal)
    route = journals.leader_route(journal)
    if node is not None and route is not None and route.primary < 0:
        # An election is running (a new journal, or its leader was lost): wait for it rather
        # than answer NO_JOURNAL_PRIMARY_BROKER, which clients do not retry.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(quorum_leader_wait_s):
                await node.leader_known.wait()
        route = journals.leader_route(journal) or route
    if node is not None and not node.is_leader and node.leader_name == node.name:
        # This member was appointed (its coordinator, or the register, names it) but has not
        # taken over yet (BecomeLeader in flight): wait for it rather than send the client
        # back here, bounded as the election wait.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(quorum_leader_wait_s):
                while not node.is_leader and node.leader_name == node.name:
                    node.progress.clear()
                    await node.progress.wait()
        route = journals.leader_route(journal) or route
    if node is None or route is None or not node.is_leader:
        return await _not_leader(local_id, etcd, first, stream, context, route, told, proxy)
    header = make_header(local_id, route, etcd)

    content = bytearray()
    committed = False
    async for msg in stream:
        chunk = msg.content  # An AppendRequest, or a ContentChunk (a view of the wire).
        if committed:
            await _abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, "content after the commit marker"
            )
        if not chunk:
            committed = True
            continue
        if len(content) + len(chunk) > quorum_append_bytes_max:
            await _abort(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"journal {journal!r}: an append of more than {quorum_append_bytes_max} bytes"
                " (quorum_append_bytes_max)",
            )
        content += chunk
    if not committed:
        await _abort(
            context,
            grpc.StatusCode.INVALID_ARGUMENT,
            "the stream ended without the empty commit chunk: nothing appended",
        )
    if content and not may_write(spec):
        return pb.AppendResponse(status=pb.NOT_ALLOWED, header=header)
    if first.suspend in _SUSPENSIONS:
        await _abort(
            context,
            grpc.StatusCode.FAILED_PRECONDITION,
            f"journal {journal!r}: quorum journals are not suspended (not built yet): nothing"
            " changed",
        )
    try:
        fragment, registers = await journals.append(
            journal,
            bytes(content),
            spec.fragment.compression_codec,
            register_check(first),
            register_update(first),
            first.offset,
        )
    except NotLeaderError:
        return pb.AppendResponse(status=pb.NOT_JOURNAL_PRIMARY_BROKER, header=header)
    except AppendOffsetError as err:
        return pb.AppendResponse(status=err.status, header=header)  # type: ignore[arg-type]
    except StoreAheadOfLogError as err:
        await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(err))
        raise AssertionError("not reached") from err
    except IndexNotListedError as err:
        await _abort(context, grpc.StatusCode.UNAVAILABLE, str(err))
        raise AssertionError("not reached") from err
    except (EmptyRegisterUpdateError, ValidationError) as err:
        await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(err))
        raise AssertionError("not reached") from err
    except (LogFullError, PendingAppendsFullError) as err:
        await _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
        raise AssertionError("not reached") from err
    except AppendOutcomeUnknownError as err:
        await _abort(context, grpc.StatusCode.UNAVAILABLE, f"outcome unknown: {err}")
        raise AssertionError("not reached") from err
    except (LogWriteError, ProtocolError) as err:
        # This member stopped (its log could not be written, say its disk is full): it
        # leads no more, and appended nothing. The others elect a leader; clients retry.
        await _abort(
            context,
            grpc.StatusCode.UNAVAILABLE,
            f"journal {journal!r}: the quorum member on this broker failed ({err}); nothing"
            " appended: the journal's other members elect a new leader",
        )
        raise AssertionError("not reached") from err
    if fragment is None:
        return pb.AppendResponse(
            status=pb.REGISTER_MISMATCH, header=header, registers=label_set_of(registers)
        )
    return pb.AppendResponse(
        status=pb.OK, header=header, commit=fragment, registers=label_set_of(registers)
    )


async def _not_leader(
    local_id: pb.ProcessSpec.ID,
    etcd: pb.Header.Etcd,
    first: pb.AppendRequest,
    stream: AsyncIterator[Any],
    context: grpc.aio.ServicerContext,
    node_route: pb.Route | None,
    told: pb.Route | None,
    proxy: ProxyAppend | None,
) -> pb.AppendResponse:
    """An append reaching a broker that does not lead the journal: proxied to the leader, or
    answered with the route naming it (see the module docstring)."""
    journal = first.journal
    # This broker's node knows the leader first (its heartbeat); the route the mirror tells
    # clients (told: the register's leader, else the allocator's primary, which waits for the
    # election itself) serves a broker without a node, or a node that knows no leader yet.
    route = node_route
    if (route is None or route.primary < 0) and told is not None and told.primary >= 0:
        route = told
    if route is None:
        await read_to_end(stream)
        await _abort(
            context,
            grpc.StatusCode.UNAVAILABLE,
            f"journal {journal!r}: no quorum node on this broker and no leader known (not a"
            " member, or its route is not complete yet)",
        )
        raise AssertionError("not reached")
    # A request that came from a broker (it carries that broker's header) is never proxied
    # again: were two brokers to disagree on the leader, they would bounce it between them.
    # Nor is one to this broker (the register names it, its node does not lead yet).
    leader = route.members[route.primary] if route.primary >= 0 else None
    if leader is not None and proxy is not None and not first.do_not_proxy:
        if not first.HasField("header") and not same_id(leader, local_id):
            return await proxy(make_header(leader, route, etcd))
    await read_to_end(stream)
    status = pb.NOT_JOURNAL_PRIMARY_BROKER if route.primary >= 0 else pb.NO_JOURNAL_PRIMARY_BROKER
    return pb.AppendResponse(status=status, header=make_header(local_id, route, etcd))
