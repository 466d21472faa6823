"""What a read needs from the cluster, on the driver and on executors: a broker client and/or a
store registry for one call, the journals read (their labels, framing, fragments and heads),
and where each one's read starts and ends.

A read names a broker, a fragment store (option `store`), or both (read_options.py). With a
broker, journals are resolved by it (their specs: labels, content type), write heads are its,
and fragments are what its index lists (ListFragments, with signed URLs of the persisted ones).
With only a store, journals are named, their fragments are the store's listing, and a journal's
content ends where its last persisted fragment ends. With both, the store is listed and the
broker is asked for specs, heads, and the content not yet persisted.

Like journal_io.run_with_client, each call runs its own event loop with the clients opened
inside it and closed before it returns: nothing that crosses a process boundary holds one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from broker.client.route_cache import JournalClient
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from spark_integration.fragment_plan import JournalFragments, broker_fragments, store_fragments
from spark_integration.journal_io import GazetteJournalError, resolve_journal_entries, write_heads
from spark_integration.options import EARLIEST, LATEST, GazetteOptionError
from spark_integration.read_options import Position, ReadOptions
from spark_integration.sources import FragmentRef, JournalSource

if TYPE_CHECKING:
    from broker.fragment.stores.registry import StoreRegistry

T = TypeVar("T")

_READABLE = (gl.CONTENT_TYPE_JSON_LINES, gl.CONTENT_TYPE_CSV, gl.CONTENT_TYPE_PROTO_FIXED)


class ReadContext:
    """A broker client (if the read names a broker) and a store registry (if it names a
    store), for the duration of one call."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.client = JournalClient(opts.broker) if opts.broker else None
        self.registry: StoreRegistry | None = None
        if opts.store:
            # Imported only for reads from a store: it imports every store backend (boto3).
            from broker.fragment.stores.registry import new_registry

            self.registry = new_registry()

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        if self.registry is not None:
            await self.registry.close()

    def source(self, journal: str, fragments: Sequence[FragmentRef]) -> JournalSource:
        return JournalSource(
            journal,
            fragments,
            client=self.client,
            registry=self.registry,
            fail_on_data_loss=self.opts.fail_on_data_loss,
            gap_wait_s=max(1, self.opts.store_gap_grace_s),
        )


def run_in_context(opts: ReadOptions, work: Callable[[ReadContext], Awaitable[T]]) -> T:
    async def main() -> T:
        ctx = ReadContext(opts)
        try:
            return await work(ctx)
        finally:
            await ctx.close()

    return asyncio.run(main())


def iterate_in_context(
    opts: ReadOptions, work: Callable[[ReadContext], AsyncIterator[T]]
) -> Iterator[T]:
    """The items of the async iterator `work(ctx)`, as a plain iterator: each is awaited in this
    generator's own event loop, so a partition streams its rows instead of collecting them.
    Closing the generator (Spark stops reading) closes the iterator, the context and the loop."""
    loop = asyncio.new_event_loop()
    ctx: ReadContext | None = None
    items: AsyncIterator[T] | None = None
    try:
        ctx = ReadContext(opts)
        items = work(ctx)
        while True:
            try:
                item = loop.run_until_complete(anext(items))
            except StopAsyncIteration:
                return
            yield item
    finally:
        try:
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                loop.run_until_complete(aclose())
            if ctx is not None:
                loop.run_until_complete(ctx.close())
        finally:
            loop.close()


@dataclass(frozen=True)
class JournalInfo:
    """A journal read: its labels (None in store mode), framing, and fragments."""

    name: str
    labels: tuple[tuple[str, str], ...] | None
    content_type: str
    fragments: JournalFragments
    # Its etcd create revision (0 in store mode): another one means it was created again.
    create_revision: int = 0

    @property
    def head(self) -> int:
        return self.fragments.head


def _content_type(spec: pb.JournalSpec | None, name: str, opts: ReadOptions) -> str:
    label = gl.value_of(spec.labels, gl.CONTENT_TYPE) if spec is not None else ""
    wanted = opts.content_type
    if wanted and label and label != wanted:
        raise GazetteJournalError(
            f"journal {name!r}: content-type is {label!r}, not {wanted!r} (option contentType)"
        )
    content_type = wanted or label or (gl.CONTENT_TYPE_JSON_LINES if spec is None else "")
    if content_type not in _READABLE:
        raise GazetteJournalError(
            f"journal {name!r}: content-type is {content_type or 'not set'!r}; the gazette data"
            f" source reads {', '.join(_READABLE)} journals (or give option contentType)"
        )
    if content_type == gl.CONTENT_TYPE_PROTO_FIXED and not opts.protobuf_class:
        raise GazetteOptionError("protobufClass", f"is required to read {name} (protobuf)")
    return content_type


async def journal_infos(ctx: ReadContext, names: Sequence[str] | None = None) -> list[JournalInfo]:
    """The journals read (`names`, or those of the options), sorted by name."""
    opts = ctx.opts
    journals = tuple(names) if names is not None else opts.journals
    selector = "" if names is not None else opts.selector
    specs: dict[str, pb.JournalSpec | None]
    revisions: dict[str, int] = {}
    if ctx.client is not None:
        found = await resolve_journal_entries(ctx.client, journals, selector, check=False)
        specs = {entry.spec.name: entry.spec for entry in found}
        revisions = {entry.spec.name: entry.create_revision for entry in found}
        heads = await write_heads(ctx.client, list(specs))
    else:
        specs = dict.fromkeys(journals)
        heads = {}
    out = []
    for name in sorted(specs):
        spec = specs[name]
        content_type = _content_type(spec, name, opts)
        if ctx.registry is not None:
            fragments = await store_fragments(ctx.registry, opts.store, name)
            if name in heads:
                fragments = JournalFragments(name, fragments.fragments, heads[name])
        else:
            assert ctx.client is not None  # A broker or a store: read_options.py.
            fragments = await broker_fragments(ctx.client, name, heads[name])
        labels = None
        if spec is not None:
            labels = tuple((label.name, label.value) for label in spec.labels.labels)
        out.append(JournalInfo(name, labels, content_type, fragments, revisions.get(name, 0)))
    return out


def position_offset(position: Position, info: JournalInfo, *, default: int) -> int | None:
    """The offset of `position` in the journal, or None for a timestamp (offset_by_time.py
    finds it). `default` is for a journal the offsets do not name."""
    if isinstance(position, int):
        return None
    if isinstance(position, str):
        return info.fragments.begin if position == "earliest" else info.head
    assert isinstance(position, Mapping)
    offset = position.get(info.name, default)
    if offset == EARLIEST:
        return info.fragments.begin
    if offset == LATEST:
        return info.head
    return offset
