"""Broker access for the data source: resolving journals, write heads, one event loop per call.

Spark calls a data source from plain synchronous Python, in driver-side workers and executor
workers that are separate processes. Each call that needs the broker runs its own event loop
(`run_with_client`), with a `JournalClient` opened inside it and closed before it returns: no
channel outlives the call, and nothing that crosses a process boundary holds one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Final, TypeVar

from broker.client.list_apply import get_journal, get_journal_entry, list_journals
from broker.client.reader import Reader
from broker.client.route_cache import JournalClient
from broker.client.write_head import probe_write_head
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from broker.protocol.selector import parse_selector
from broker.protocol.status import JournalNotFoundError
from spark_integration.options import journals_max

T = TypeVar("T")

# A wait for an append watches at most this many journals (one blocking Read RPC each, on one
# channel); an append to any other is seen when the wait's bound expires and the caller looks again.
append_wait_journals_max: Final = 256


class GazetteJournalError(LookupError):
    """A journal the data source was asked to use does not exist or cannot be used."""


def run_with_client(broker: str, work: Callable[[JournalClient], Awaitable[T]]) -> T:
    """Run `work(client)` in a new event loop with a client of `broker`, closed afterwards."""

    async def main() -> T:
        client = JournalClient(broker)
        try:
            return await work(client)
        finally:
            await client.close()

    return asyncio.run(main())


def check_json_lines(spec: pb.JournalSpec) -> None:
    content_type = labels.value_of(spec.labels, labels.CONTENT_TYPE)
    if content_type != labels.CONTENT_TYPE_JSON_LINES:
        raise GazetteJournalError(
            f"journal {spec.name!r}: content-type is {content_type or 'not set'!r}; the gazette"
            f" data source reads and writes {labels.CONTENT_TYPE_JSON_LINES} journals only"
        )


async def resolve_journals(
    client: JournalClient,
    names: tuple[str, ...],
    selector: str,
    *,
    check: bool = True,
    missing_ok: Collection[str] = (),
) -> list[pb.JournalSpec]:
    """The specs of the named journals, or of those `selector` matches (sorted by name). Every
    one must exist, but those of `missing_ok`, left out when they do not (and hold JSON lines,
    if `check`)."""
    entries = await resolve_journal_entries(
        client, names, selector, check=check, missing_ok=missing_ok
    )
    return [entry.spec for entry in entries]


async def resolve_journal_entries(
    client: JournalClient,
    names: tuple[str, ...],
    selector: str,
    *,
    check: bool = True,
    missing_ok: Collection[str] = (),
) -> list[pb.ListResponse.Journal]:
    """`resolve_journals`, as List returns them: with their etcd create revisions (which tell a
    journal deleted and created again from the one it was)."""
    entries: list[pb.ListResponse.Journal] = []
    if selector:
        listing = await list_journals(client, parse_selector(selector))
        entries = sorted(listing.journals, key=lambda j: j.spec.name)
    for name in names:
        try:
            entries.append(await get_journal_entry(client, name))
        except JournalNotFoundError:
            if name in missing_ok:
                continue
            raise GazetteJournalError(f"journal {name!r} does not exist") from None
    if len(entries) > journals_max:
        raise GazetteJournalError(
            f"selector {selector!r} matches {len(entries)} journals, more than {journals_max}"
        )
    if check:
        for entry in entries:
            check_json_lines(entry.spec)
    return entries


async def journal_exists(client: JournalClient, name: str) -> bool:
    """Whether journal `name` exists (has a spec)."""
    try:
        await get_journal(client, name)
    except JournalNotFoundError:
        return False
    return True


async def write_head(client: JournalClient, journal: str) -> int:
    """The journal's write head: the offset its next append will land at."""
    try:
        return await probe_write_head(client, journal)
    except JournalNotFoundError:
        raise GazetteJournalError(f"journal {journal!r} does not exist") from None


async def write_heads(client: JournalClient, journals: list[str]) -> dict[str, int]:
    heads = await asyncio.gather(*(write_head(client, j) for j in journals))
    return dict(zip(journals, heads, strict=True))


async def wait_for_append(
    client: JournalClient, heads: Mapping[str, int], timeout_s: float
) -> bool:
    """Wait until content is committed at the write head of any of `heads`' journals, or for
    `timeout_s`. True if a wait ended before the bound.

    Each journal gets one blocking, metadata-only Read at its head: the broker answers it once
    a fragment covers that offset, i.e. once an append commits there (at once if one already
    has, so an append racing the caller's look at the heads is not missed), and sends nothing
    meanwhile. A read that ends for another reason (the journal was deleted, the broker went
    away) ends the wait too: the caller looks at its journals again, and meets the error there.
    The reads are cancelled before this returns."""
    watched = sorted(heads.items())[:append_wait_journals_max]
    if not watched or timeout_s <= 0:
        return False
    readers = [
        Reader(client, pb.ReadRequest(journal=j, offset=h, block=True, metadata_only=True))
        for j, h in watched
    ]
    tasks = [asyncio.create_task(r.read_chunk()) for r in readers]
    try:
        done, _ = await asyncio.wait(tasks, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        # Cancelling a read cancels its RPC (Reader.read_chunk closes itself on any exception);
        # gathering retrieves what the reads raised, which the caller's next look reports.
        await asyncio.gather(*tasks, return_exceptions=True)
        for r in readers:
            await r.close()
    return bool(done)
