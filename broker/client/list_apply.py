"""Journal specs and fragment listings: List, Apply and ListFragments from a client.

- `list_journals` reads one complete List snapshot (a broker streams large listings over
  several messages; they are joined here) and teaches the route cache each journal's route.
- `watch_journals` yields a new snapshot whenever the selected journals change.
- `get_journal` is the spec of one journal by name.
- `apply_journals` creates, updates and deletes specs in one etcd transaction. A change whose
  `expect_mod_revision` no longer matches makes the whole transaction fail with
  `EtcdTransactionFailedError` (re-list, then re-apply); -1 skips the comparison.
- `list_all_fragments` joins every page of a journal's ListFragments.

Non-OK statuses raise their typed errors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any, Final

import grpc.aio

from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import META_NAME
from broker.protocol.selector import parse_selector
from broker.protocol.status import JournalNotFoundError, raise_for_status
from broker.protocol.validate import ValidationError

# Pages of a fragment listing joined by `list_all_fragments` before it gives up: at the default
# page size, ten million fragments, far beyond any journal's.
fragment_pages_max: Final = 10_000
# List and Apply are short unary exchanges; they fail if the broker does not answer in time.
rpc_timeout_s_default: Final = 60.0


class ListProtocolError(ValidationError):
    """A broker's List stream breaks the List API's contract."""


def _selector(selector: pb.LabelSelector | str | None) -> pb.LabelSelector:
    if selector is None:
        return pb.LabelSelector()
    if isinstance(selector, str):
        return parse_selector(selector)
    return selector


async def _read_snapshot(call: Any, *, watch: bool) -> pb.ListResponse | None:
    """One complete snapshot of a List stream: a first message with status and header, then
    continuation messages of journals only. A unary listing ends with the stream; a watched
    one with an empty message. Returns None at the end of the stream."""
    first = await call.read()
    if first is grpc.aio.EOF:
        return None
    raise_for_status(first.status, "listing journals")
    snapshot = pb.ListResponse()
    snapshot.CopyFrom(first)
    while True:
        message = await call.read()
        if message is grpc.aio.EOF:
            if watch:
                raise ListProtocolError("watched listing ended inside a snapshot")
            return snapshot
        if not message.journals:
            if not watch:
                raise ListProtocolError("unexpected empty message in a unary listing")
            return snapshot
        snapshot.journals.extend(message.journals)


def _learn_routes(client: JournalClient, snapshot: pb.ListResponse) -> None:
    for journal in snapshot.journals:
        client.routes.update(journal.spec.name, journal.route)


async def list_journals(
    client: JournalClient,
    selector: pb.LabelSelector | str | None = None,
    *,
    timeout_s: float | None = rpc_timeout_s_default,
) -> pb.ListResponse:
    """The journals matching `selector` (a LabelSelector or its string form; None: all)."""
    request = pb.ListRequest(selector=_selector(selector))
    call = client.default_stub().List(request, timeout=timeout_s)
    try:
        snapshot = await _read_snapshot(call, watch=False)
    finally:
        call.cancel()
    if snapshot is None:
        raise ListProtocolError("listing ended without a response")
    _learn_routes(client, snapshot)
    return snapshot


async def watch_journals(
    client: JournalClient, selector: pb.LabelSelector | str | None = None
) -> AsyncIterator[pb.ListResponse]:
    """Snapshots of the journals matching `selector`: the current one, then one after each
    change. Ends when the broker closes the stream (resume with a new watch)."""
    request = pb.ListRequest(selector=_selector(selector), watch=True)
    call = client.default_stub().List(request)
    try:
        while (snapshot := await _read_snapshot(call, watch=True)) is not None:
            _learn_routes(client, snapshot)
            yield snapshot
    finally:
        call.cancel()


async def get_journal(
    client: JournalClient, name: str, *, timeout_s: float | None = rpc_timeout_s_default
) -> pb.JournalSpec:
    """The spec of journal `name`; JournalNotFoundError if there is none."""
    return (await get_journal_entry(client, name, timeout_s=timeout_s)).spec


async def get_journal_entry(
    client: JournalClient, name: str, *, timeout_s: float | None = rpc_timeout_s_default
) -> pb.ListResponse.Journal:
    """Journal `name` as List returns it (its spec, and its etcd create and mod revisions);
    JournalNotFoundError if there is none."""
    selector = pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name=META_NAME, value=name)]))
    snapshot = await list_journals(client, selector, timeout_s=timeout_s)
    for journal in snapshot.journals:
        if journal.spec.name == name:
            return journal
    raise JournalNotFoundError(f"journal {name!r} does not exist")


async def apply_journals(
    client: JournalClient,
    changes: pb.ApplyRequest | Iterable[pb.ApplyRequest.Change],
    *,
    timeout_s: float | None = rpc_timeout_s_default,
) -> pb.ApplyResponse:
    """Apply `changes` in one transaction; raise the typed error of a non-OK status."""
    if isinstance(changes, pb.ApplyRequest):
        request = changes
    else:
        request = pb.ApplyRequest(changes=list(changes))
    response: pb.ApplyResponse = await client.default_stub().Apply(request, timeout=timeout_s)
    raise_for_status(response.status, "applying journal changes")
    return response


def upsert(spec: pb.JournalSpec, expect_mod_revision: int = 0) -> pb.ApplyRequest.Change:
    """A change creating (expect_mod_revision 0) or updating `spec`."""
    return pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=expect_mod_revision)


def delete(name: str, expect_mod_revision: int = -1) -> pb.ApplyRequest.Change:
    """A change deleting journal `name` (-1: whatever its revision)."""
    return pb.ApplyRequest.Change(delete=name, expect_mod_revision=expect_mod_revision)


async def list_all_fragments(
    client: JournalClient,
    request: pb.FragmentsRequest,
    *,
    timeout_s: float | None = rpc_timeout_s_default,
    require_primary: bool = False,
) -> pb.FragmentsResponse:
    """Every fragment of the request's journal (and time range), joined across pages: from
    any member of its route, or its primary with `require_primary`."""
    page = pb.FragmentsRequest()
    page.CopyFrom(request)
    out: pb.FragmentsResponse | None = None
    for _ in range(fragment_pages_max):
        stub = client.stub_for(page.journal, require_primary=require_primary)
        response: pb.FragmentsResponse = await stub.ListFragments(page, timeout=timeout_s)
        if response.HasField("header"):
            client.update_route(page.journal, response.header)
        raise_for_status(response.status, f"listing fragments of {page.journal}")
        next_token = response.next_page_token
        if out is None:
            out = response
        else:
            out.fragments.extend(response.fragments)
        if next_token == 0:
            out.next_page_token = 0
            return out
        if next_token <= page.next_page_token:
            raise ListProtocolError(
                f"must advance past {page.next_page_token} (got {next_token})", "next_page_token"
            )
        page.next_page_token = next_token
    raise ListProtocolError(f"listing of {page.journal} exceeds {fragment_pages_max} pages")
