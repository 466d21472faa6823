"""Source journals whose write head is behind the shard's checkpoint, found at a primary's start.

A shard's checkpoint records how far it read each source journal. That offset can be ahead of
the journal's write head only if the journal lost content the shard had read: it was deleted
and created again, its fragments were removed from the store while no broker held them, or
brokers without durable spools all went away. Resumed there, a shard waits for the head to
pass its checkpoint and reads on from the checkpoint, skipping everything appended in between:
new content hidden without an error (Gazette does exactly that). So before a primary reads, it
asks each source's head, and by default fails naming the journal, both offsets and what to do.
The ShardSpec label ``gazette.dev/checkpoint-ahead`` chooses otherwise:

- ``fail`` (the default): the shard FAILS with `CheckpointAheadError`; nothing is read or
  committed. An operator relabels the spec (below) and unassigns the shard
  (``gazctl shards unassign --failed``) to start it again.
- ``rewind``: the journal is read again from its start (its source's `min_offset`, else 0) and
  its producer states are forgotten (they describe the content that is gone); a warning names
  the journal. The checkpoint moves back with the first transaction that commits.
- ``wait``: Gazette's behaviour, with a warning: resume at the checkpoint.

Each journal found behind is counted in ``gazette_consumer_source_behind_checkpoint_total``
(labels ``journal``, ``policy``).

Telling lost content from a broker that has not caught up. The head of a non-blocking read
comes from the answering broker's fragment index, which, right after that broker started, may
not have listed its fragment store yet: the head is then too low (quorum journals' reads pass
their read barrier and are exact). So a head below the checkpoint is only a suspicion,
confirmed by the journal's fragment listing through its primary (ListFragments waits for the
index's first listing, broker/fragments_api.py) and a second read
(`broker.client.write_head.confirm_write_head`); while the listing cannot be had the check
fails transiently (UNAVAILABLE) and the shard retries. The common case, a head at or past the
checkpoint, costs one metadata-only read per source.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from prometheus_client import Counter

from broker.client.route_cache import JournalClient
from broker.client.write_head import confirm_write_head, probe_write_head
from broker.logging import get_logger
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels as gl
from gazette_consumer.shard_retry import Transience, classify

__all__ = [
    "BEHIND_TOTAL",
    "CheckpointAheadError",
    "SourceBehind",
    "checkpoint_ahead_policy",
    "find_recreated",
    "find_sources_behind",
    "resume_checkpoint",
]

_log = get_logger(__name__)
_T = TypeVar("_T")

# Source heads asked at once when a primary starts (a shard may read hundreds of journals).
head_probes_max: Final = 16
# Tries of one source's head on a transient error (shard_retry.classify), the first retry
# after `head_probe_retry_s`, doubling: about 1.5 s in all, then the shard's own retry.
head_probe_attempts_max: Final = 4
head_probe_retry_s: Final = 0.2

BEHIND_TOTAL: Final = Counter(
    "gazette_consumer_source_behind_checkpoint_total",
    "Source journals found at a primary's start with a write head below the shard's"
    " checkpoint (content the shard read is gone), by the policy applied",
    ["journal", "policy"],
)


@dataclass(frozen=True, slots=True)
class SourceBehind:
    """A source journal whose write head is below the offset the shard's checkpoint read
    through, or (`recreated`: the create revisions the checkpoint recorded and the journal's
    now, source_revisions.py) that was deleted and created again since, whatever its head."""

    journal: str
    checkpoint: int
    head: int
    recreated: tuple[int, int] | None = None

    def describe(self) -> str:
        if self.recreated is not None:
            was, now = self.recreated
            return (
                f"the checkpoint read source journal {self.journal!r} through offset"
                f" {self.checkpoint}, but the journal was deleted and created again since"
                f" (etcd create revision {was}, now {now}): if it holds new content, resuming"
                f" there would skip offsets [0, {self.checkpoint}) of it (rewind); if it was"
                " restored from its fragment store with the content the shard read (the"
                " shard resumes one by itself when its checkpoint's fingerprint of the bytes"
                " below the offset matches them; this one's does not, or it has none),"
                " resuming there is right (wait, and remove the label once the shard"
                " committed)"
            )
        return (
            f"the checkpoint read source journal {self.journal!r} through offset"
            f" {self.checkpoint}, but its write head is {self.head}: content the shard read is"
            " gone (the journal was deleted and created again, or lost fragments), and"
            f" resuming would skip offsets [{self.head}, {self.checkpoint}) of new content"
        )


class CheckpointAheadError(Exception):
    """The shard's checkpoint is ahead of a source journal's write head, or read a journal since
    created again (policy ``fail``)."""

    def __init__(self, behind: Sequence[SourceBehind]) -> None:
        self.behind = tuple(behind)
        more = f" (and {len(self.behind) - 1} more sources)" if len(self.behind) > 1 else ""
        super().__init__(
            f"{self.behind[0].describe()}{more}."
            f" Label the ShardSpec {gl.CHECKPOINT_AHEAD}={gl.CHECKPOINT_AHEAD_REWIND} to read"
            f" the journal again from its start, or ={gl.CHECKPOINT_AHEAD_WAIT} to resume at"
            " the checkpoint as Gazette does, then unassign the shard to start it again"
        )


def checkpoint_ahead_policy(spec: cpb.ShardSpec) -> str:
    """The spec's ``gazette.dev/checkpoint-ahead`` policy (validated with the spec)."""
    return gl.value_of(spec.labels, gl.CHECKPOINT_AHEAD) or gl.CHECKPOINT_AHEAD_FAIL


async def find_sources_behind(
    client: JournalClient, offsets: Mapping[str, int]
) -> list[SourceBehind]:
    """The journals of `offsets` (journal -> the checkpoint's read-through offset) whose write
    head is below it, confirmed as the module docstring says, in journal order."""
    gate = asyncio.Semaphore(head_probes_max)

    async def head_of(journal: str, checkpoint: int) -> int:
        head = await probe_write_head(client, journal)
        if head >= checkpoint:
            return head
        return await confirm_write_head(client, journal, head)

    async def behind(journal: str, checkpoint: int) -> SourceBehind | None:
        async with gate:
            head = await _retrying(lambda: head_of(journal, checkpoint))
            return SourceBehind(journal, checkpoint, head) if head < checkpoint else None

    asked = sorted((j, offset) for j, offset in offsets.items() if offset > 0)
    tasks = [asyncio.ensure_future(behind(j, offset)) for j, offset in asked]
    try:
        found = await asyncio.gather(*tasks)
    finally:
        for task in tasks:  # One failed (or the shard stops): the others are not waited on.
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
    return [b for b in found if b is not None]


async def _retrying(ask: Callable[[], Awaitable[_T]]) -> _T:
    """`ask()`, asked again on a transient error (shard_retry.classify) up to
    `head_probe_attempts_max` times in all, with a doubling back-off: a broker restarting, a
    stale route, rather than restart the shard (its recovery played again) at once."""
    delay_s = head_probe_retry_s
    for attempt in range(1, head_probe_attempts_max + 1):
        try:
            return await ask()
        except Exception as err:
            if attempt == head_probe_attempts_max or classify(err) is not Transience.TRANSIENT:
                raise
            await asyncio.sleep(delay_s)  # A back-off, not a synchronisation.
            delay_s *= 2
    raise AssertionError("unreachable: the last attempt returns or raises")


def find_recreated(
    offsets: Mapping[str, int],
    recorded: Mapping[str, int],
    current: Mapping[str, int],
    behind: Sequence[SourceBehind],
) -> list[SourceBehind]:
    """`behind`, with the journals of `offsets` (journal -> the checkpoint's read-through
    offset) created again since the checkpoint recorded their create revision (`recorded`;
    `current` holds the revisions now), in journal order. A revision of 0 (brokers before
    Gazette filled the field) is unknown, never a change.

    Each is handled as content lost, whatever its head. (A journal restored over the content
    the shard read is taken out before, by its fingerprint: source_revisions.restored_sources;
    what remains here is new content, or a checkpoint without a fingerprint, so the policy
    decides, and its message names both cases: ``wait`` resumes a restored journal.)"""
    found = {b.journal: b for b in behind}
    for journal, offset in sorted(offsets.items()):
        was, now = recorded.get(journal, 0), current.get(journal, 0)
        if offset <= 0 or was <= 0 or now <= 0 or was == now:
            continue
        head = found[journal].head if journal in found else -1
        found[journal] = SourceBehind(journal, offset, head, (was, now))
    return [found[j] for j in sorted(found)]


def resume_checkpoint(
    shard: str, policy: str, behind: Sequence[SourceBehind], checkpoint: cpb.Checkpoint
) -> cpb.Checkpoint:
    """The checkpoint to resume from given the sources found `behind` and the spec's `policy`:
    `checkpoint` itself (``wait``, or nothing behind), a copy reading those journals from
    offset 0 without their producer states (``rewind``); raises CheckpointAheadError
    (``fail``)."""
    if not behind:
        return checkpoint
    for b in behind:
        BEHIND_TOTAL.labels(b.journal, policy).inc()
        _log.warning(
            "source journal lost what the shard's checkpoint read",
            shard=shard,
            journal=b.journal,
            checkpoint=b.checkpoint,
            head=b.head,
            recreated=b.recreated,
            policy=policy,
        )
    if policy == gl.CHECKPOINT_AHEAD_FAIL:
        raise CheckpointAheadError(behind)
    if policy == gl.CHECKPOINT_AHEAD_WAIT:
        return checkpoint
    rewound = cpb.Checkpoint()
    rewound.CopyFrom(checkpoint)
    for b in behind:
        source = rewound.sources[b.journal]
        source.read_through = 0
        del source.producers[:]
    return rewound
