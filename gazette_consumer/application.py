"""The Application interface users implement, and the Shard context it is handed.

A consumer application subclasses `Application` and is run, shard by shard, by the shard
runner (`gazette_consumer.shard`). Each primary shard processes the read-committed messages of
its source journals in *pipelined transactions* (docs/architecture.md, Invariants,
`transaction.py`):

1. Once, when the shard becomes primary: `new_store(shard, recorder)` (`recorder` records into
   the shard's recovery log, if its spec has one); the runner then restores
   the store's checkpoint (fencing older instances), re-writes the checkpoint's ACK intents,
   and starts reading (from `new_message_source`, or the spec's sources with `new_message`
   choosing each journal's message type).
2. Per transaction, all on the shard's own task, one call at a time:
   `begin_txn` (just before the first message), `consume_message` for each message,
   `finalize_txn` once the transaction closes. The runner then commits the store with the
   checkpoint (`Store.start_commit`) and calls `finished_txn` with the commit's future.
3. The commit completes in the background. The *next* transaction's `begin_txn` and
   `consume_message` calls may run while it does (that overlap is the pipelining); its
   `finalize_txn` never does: a transaction closes only once the prior one committed and its
   ACK intents were written.

Consume and finalize never overlap each other, nor with another call of the same shard; calls
for different shards run concurrently (on one event loop), so per-shard state belongs on the
shard's store or in a dict keyed by `shard.fqn`, never in a plain attribute of the Application.

An application may also serve its own gRPC services from the consumer process
(`register_services`), e.g. queries of its shards' state, routed to each shard's primary: the
pattern of Gazette's word-count example (examples/word_count/queries.py).

Only unrecoverable errors should be raised: any exception from these methods fails the shard —
nothing of the current transaction commits, the error is logged with the shard's ID, and its
status becomes FAILED with the error. (A transient one — ConnectionError, TimeoutError, or a
broker's or etcd's unavailability, see `shard_retry.classify` — makes the shard start over from
its checkpoint after a back-off instead, a bounded number of times.) Other shards keep running.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from broker.protocol import consumer_pb2 as cpb
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.checkpoint import Checkpoint
from gazette_consumer.message.message import Envelope
from gazette_consumer.sequencer.types import SequencerCheckpoint
from gazette_consumer.shard_handle import ShardProgress
from gazette_consumer.stores.base import OpFuture, ShardContext, Store

if TYPE_CHECKING:
    import grpc.aio

    from broker.client.append_service import AppendService
    from broker.client.async_append import AsyncAppend
    from broker.client.route_cache import ChannelPool, JournalClient
    from gazette_consumer.message.publisher import Publisher
    from gazette_consumer.recoverylog.recorder import Recorder
    from gazette_consumer.resolver import Resolver

__all__ = ["Application", "MessageSource", "ServiceContext", "Shard"]


class Shard(ShardContext, Protocol):
    """What the Application is told about, and may use of, the shard it serves.

    `store` and `publisher` are the same objects passed to each call; they are here too so that
    helpers need only the shard. Appends made through `append_service` (raw, at-least-once
    bytes) are awaited before the transaction commits, as the Publisher's are.
    """

    @property
    def id(self) -> str:
        """The ShardSpec's ID."""
        ...

    @property
    def labels(self) -> Mapping[str, tuple[str, ...]]:
        """The ShardSpec's labels: name → values, in spec order."""
        ...

    @property
    def store(self) -> Store:
        """The store `Application.new_store` returned (raises before it did)."""
        ...

    @property
    def publisher(self) -> Publisher[AsyncAppend]:
        """The shard's Publisher: one ProducerID per primary assignment."""
        ...

    @property
    def append_service(self) -> AppendService:
        """The shard's AppendService, for raw appends that must land before the commit."""
        ...

    @property
    def journal_client(self) -> JournalClient:
        """The broker client the shard reads and appends through."""
        ...

    def progress(self) -> ShardProgress:
        """Offsets of the last *completed* transaction (committed and acknowledged)."""
        ...


class MessageSource(Protocol):
    """Where a shard's messages come from: by default a `ReadCommittedIter` over the spec's
    sources. An Application may supply its own (`Application.new_message_source`).

    The shard reads it from its own task only. `checkpoint()` must be consistent with the
    messages returned so far (a source rebuilt from it returns exactly the ones not returned);
    the shard takes it only once `try_next()` returned None and `in_sequence` is False, so that
    one upstream ACK's messages stay in one transaction.

    Optionally, a source may also offer `take_sequence(limit) -> list[Envelope]`: the next
    messages `try_next` would return (at most `limit`), only ones after each of which
    `in_sequence` stays True, leaving a sequence's last to `try_next`. The shard then takes an
    ACK's messages in batches (`ReadCommittedIter.take_sequence`; see txn_driver.py).
    """

    async def next(self) -> Envelope[Any]:
        """The next message, waiting as long as it takes. Cancellable without loss."""
        ...

    def try_next(self) -> Envelope[Any] | None:
        """The next message if one is ready without waiting, else None."""
        ...

    def checkpoint(self, horizon: int = 0) -> SequencerCheckpoint:
        """Read-through offsets and producer states as of the messages returned so far."""
        ...

    def has_pending(self, since: Mapping[str, int]) -> bool:
        """True if an upstream transaction begun at or after `since` awaits its ACK."""
        ...

    @property
    def in_sequence(self) -> bool:
        """True if more messages committed by the same upstream ACK as the one just returned
        follow: the transaction does not close (nor time out) in between."""
        ...

    async def close(self) -> None:
        """Stop reading and release resources. Idempotent."""
        ...


@dataclass(frozen=True)
class ServiceContext:
    """What the consumer process lends an application's own gRPC services (`register_services`).

    `resolver` says which process serves a shard, and gives the local primary's handle when it
    is this one (waiting, boundedly, until it is ready): `resolver.resolve(shard, may_proxy=...,
    proxy_header=...)`; `resolver.shards_with_source(journal)` maps data to shards. `channels`
    reaches the other consumer processes, to proxy a request to a shard's primary elsewhere
    (with the resolution's header, which the peer checks, as Gazette's services do)."""

    resolver: Resolver
    channels: ChannelPool


class Application(abc.ABC):
    """A consumer application. See the module docstring for call order and concurrency."""

    @abc.abstractmethod
    async def new_store(self, shard: Shard, recorder: Recorder | None) -> Store:
        """A new, not yet restored, Store for `shard` (the runner restores it).

        `recorder` is None when the spec has no `recovery_log_prefix` (use a store that is
        fenced by other means, e.g. an SQLStore). Otherwise the runner has already played
        the shard's recovery log into `recorder.directory` and handed the log off to
        `recorder.author` (fencing any older primary); the store keeps its files in that
        directory and records every change to them through `recorder` (recoverylog/
        recorder.py), e.g. `JSONFileStore.recorded(recorder)`. The runner stores the
        recorder's hints after commits, so the next primary skips obsolete history.
        """

    @abc.abstractmethod
    def new_message(self, journal_spec: pb.JournalSpec) -> type[Any]:
        """The message type to decode `journal_spec`'s messages into (a Message class; the
        journal's content-type label picks the framing that decodes it)."""

    @abc.abstractmethod
    async def consume_message(
        self, shard: Shard, store: Store, envelope: Envelope[Any], publisher: Publisher[AsyncAppend]
    ) -> None:
        """Consume one read-committed message within the current transaction.

        Stage store changes in the store's current transaction, publish derived messages with
        `publisher.publish_uncommitted` (they commit, or roll back, with this transaction; or
        hold them and publish many at once with `publish_uncommitted_batch`, here or in
        `finalize_txn`: nobody reads them before the transaction's ACK), or keep in-memory
        aggregates to flush in `finalize_txn`. May run while the previous
        transaction's commit is still in flight (see the module docstring). Await every
        publish before returning: one that must wait for back-pressure appends only once
        awaited, and a commit over one never awaited fails the shard (UnfinishedPublishError)
        rather than lose its message.
        """

    @abc.abstractmethod
    async def finalize_txn(
        self, shard: Shard, store: Store, publisher: Publisher[AsyncAppend]
    ) -> None:
        """The transaction is closing: flush in-memory state into the store's transaction and
        publish (or start appending) everything still pending. No need to await the appends:
        the commit waits for them. Never overlaps a commit of this shard."""

    async def begin_txn(self, shard: Shard, store: Store) -> None:  # noqa: B027 -- optional hook.
        """A transaction begins: called just before its first `consume_message`. It may block
        (e.g. on a semaphore limiting how many shards aggregate at once). Optional."""

    def finished_txn(self, shard: Shard, store: Store, commit: OpFuture) -> None:  # noqa: B027
        """The transaction begun with `begin_txn` has started to commit (`commit` resolves
        when it is durable) or has failed (`commit` holds the error). Always paired with a
        `begin_txn`. Must not block. Optional."""

    def register_services(self, server: grpc.aio.Server, context: ServiceContext) -> None:  # noqa: B027
        """Register the application's own gRPC services on the consumer process's server, before
        it starts. They are served on the process's endpoint beside the Shard service, and like
        it answer UNAVAILABLE until the process is ready. Optional (the default adds none)."""

    def new_message_source(
        self, shard: Shard, store: Store, checkpoint: Checkpoint
    ) -> MessageSource | None:
        """A custom source of the shard's messages, resuming from `checkpoint`; None (the
        default) reads the spec's sources, each from max(checkpoint offset, min_offset)."""
        return None


def shard_labels(spec: cpb.ShardSpec) -> dict[str, tuple[str, ...]]:
    """A spec's labels as name → values (in spec order)."""
    out: dict[str, list[str]] = {}
    for label in spec.labels.labels:
        out.setdefault(label.name, []).append(label.value)
    return {name: tuple(values) for name, values in out.items()}
