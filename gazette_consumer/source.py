"""Where a primary shard's messages come from: its sources, resumed from its checkpoint.

By default a shard reads its ShardSpec's source journals with a `ReadCommittedIter`, each from
its checkpoint offset raised to the source's `min_offset`, with the Sequencer resumed from the
checkpoint's producer states; `on_idle` is called when the reader consumed everything at hand
(see `ReadCommittedIter`), so that the shard reports read progress that delivered no message.
An Application may supply its own `MessageSource` instead (`Application.new_message_source`),
whose progress is reported only with its transactions.

Before the default reader starts, each source's write head is compared with the checkpoint:
a checkpoint ahead of a head means the journal lost content the shard had read, and the spec's
``gazette.dev/checkpoint-ahead`` policy decides (source_heads.py); so does a source whose etcd
create revision is no longer the one the checkpoint recorded: the journal was deleted and
created again (source_revisions.py). The reader checks that revision again when each of its
Read RPCs first answers with content, and before the next after one ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from broker.client.route_cache import JournalClient
from broker.logging import get_logger
from broker.protocol import labels as gl
from gazette_consumer.application import Application, MessageSource, Shard
from gazette_consumer.checkpoint import (
    Checkpoint,
    flatten_read_through,
    to_sequencer_checkpoint,
)
from gazette_consumer.message.message import Envelope
from gazette_consumer.sequencer.read_iter import ReadCommittedIter
from gazette_consumer.sequencer.types import SequencerCheckpoint
from gazette_consumer.shard_spec import read_channel_size, ring_size, start_checkpoint
from gazette_consumer.source_heads import (
    checkpoint_ahead_policy,
    find_recreated,
    find_sources_behind,
    resume_checkpoint,
)
from gazette_consumer.source_revisions import (
    SourceFingerprints,
    create_revisions_of,
    known_fingerprints,
    list_sources,
    restored_sources,
    tails_now,
    verify_source,
)
from gazette_consumer.stores.base import Store

__all__ = ["NoSource", "OpenedSource", "open_source"]

_log = get_logger(__name__)


# What an Application's own source must have (the MessageSource protocol, `in_sequence`
# besides), checked when new_message_source returns it: a value without them failed later,
# in the shard's cleanup, with an AttributeError naming neither (found by the bad-input audit).
SOURCE_METHODS: Final = ("next", "try_next", "checkpoint", "has_pending", "close")


@dataclass(frozen=True, slots=True)
class OpenedSource:
    """A primary's message source, and the checkpoint it resumes from: the store's, or the
    store's with sources found behind it rewound (source_heads.py)."""

    source: MessageSource
    checkpoint: Checkpoint
    # The sources' etcd create revisions, for the checkpoints the shard commits (empty for an
    # Application's own source: source_revisions.py).
    create_revisions: Mapping[str, int] = field(default_factory=dict)
    # Their fingerprints, for the same checkpoints (None for an Application's own source).
    fingerprints: SourceFingerprints | None = None


async def open_source(
    app: Application,
    shard: Shard,
    store: Store,
    checkpoint: Checkpoint,
    client: JournalClient,
    *,
    on_idle: Callable[[], None] | None = None,
) -> OpenedSource:
    """The Application's own source if it has one, else a reader of the spec's sources, once
    no source's write head is found behind the checkpoint (or the spec's policy for one that
    is has been applied: source_heads.py)."""
    custom = app.new_message_source(shard, store, checkpoint)
    if custom is not None:
        missing = [name for name in SOURCE_METHODS if not callable(getattr(custom, name, None))]
        missing += [] if hasattr(custom, "in_sequence") else ["in_sequence"]
        if missing:
            raise TypeError(
                f"Application.new_message_source returned {type(custom).__name__}, not a"
                f" MessageSource (it has no {', '.join(missing)})"
            )
        return OpenedSource(custom, checkpoint)
    stored = flatten_read_through(checkpoint)
    journals = [s.journal for s in shard.spec.sources]
    listed = await list_sources(client, journals)
    revisions = {j: listed[j].create_revision for j in journals}
    quorum = {
        j
        for j in journals
        if gl.value_of(listed[j].spec.labels, gl.REPLICATION_MODE) == gl.REPLICATION_MODE_QUORUM
    }
    recorded = create_revisions_of(checkpoint)
    # Journals the checkpoint read that are no longer sources keep what it recorded of them
    # (found by review: dropped at the next commit, a journal made a source again after it
    # was created again was resumed unchecked).
    stamped = {**{j: r for j, r in recorded.items() if j not in revisions}, **revisions}
    asked = {j: stored.get(j, 0) for j in journals}
    known = known_fingerprints(checkpoint)
    restored = await restored_sources(
        client, asked, recorded, revisions, {j: d for j, (_, d) in known.items()}, quorum
    )
    for journal in sorted(restored):
        # Its content below the checkpoint is what the shard read: resumed as Gazette does.
        _log.warning(
            "source journal was created again over the content the shard read: resuming",
            shard=shard.spec.id,
            journal=journal,
            checkpoint=asked[journal],
            create_revisions=(recorded[journal], revisions[journal]),
        )
    recorded = {**recorded, **{j: revisions[j] for j in restored}}
    behind = await find_sources_behind(client, asked)
    behind = find_recreated(asked, recorded, revisions, behind)
    policy = checkpoint_ahead_policy(shard.spec)
    checkpoint = resume_checkpoint(shard.spec.id, policy, behind, checkpoint)
    for b in behind:  # Their fingerprints describe content that is gone, or not known.
        known.pop(b.journal, None)
    offsets, resume = start_checkpoint(shard.spec, to_sequencer_checkpoint(checkpoint))
    if not offsets:
        return OpenedSource(NoSource(resume), checkpoint, stamped, SourceFingerprints(known, None))
    # The bytes below where each source resumes, if they are still those its fingerprint
    # describes: its reader holds them, so the next checkpoint has a fingerprint even if it
    # read less than a fingerprint's worth since.
    seeds = await tails_now(
        client,
        {j: known[j] for j in offsets if j in known and known[j][0] == offsets[j]},
        revisions,
    )

    async def verify(journal: str, at_least: int) -> None:
        await verify_source(client, journal, revisions[journal], at_least)

    reader = ReadCommittedIter(
        client,
        offsets,
        message_type=app.new_message,
        ring_size=ring_size(shard.spec),
        checkpoint=resume,
        read_channel_size=read_channel_size(shard.spec),
        on_idle=on_idle,
        verify_journal=verify,
    )
    for journal, (offset, content) in seeds.items():
        reader.seed_tail(journal, offset, content)
    return OpenedSource(reader, checkpoint, stamped, SourceFingerprints(known, reader.fingerprint))


class NoSource:
    """The source of a shard without source journals: it never yields a message (as in
    Gazette, such a shard serves, but never runs a transaction)."""

    def __init__(self, checkpoint: SequencerCheckpoint) -> None:
        self._checkpoint = checkpoint
        self._never = asyncio.Event()

    async def next(self) -> Envelope[Any]:
        await self._never.wait()
        raise AssertionError("unreachable: the event is never set")

    def try_next(self) -> Envelope[Any] | None:
        return None

    def checkpoint(self, horizon: int = 0) -> SequencerCheckpoint:
        return self._checkpoint

    def has_pending(self, since: Mapping[str, int]) -> bool:
        return False

    @property
    def in_sequence(self) -> bool:
        return False

    async def close(self) -> None:
        return None
