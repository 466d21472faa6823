"""Word counts in a JSON document recorded into each shard's recovery log (JSONFileStore).

Input: JSON lines ``{"text": "..."}`` in the shard's source journals, published by Gazette
Publishers. Each shard counts the words (whitespace-separated, lower-cased) of the texts it
reads, exactly once, in its store's state: ``{"counts": {word: n}}``.

The shard's spec must name a recovery log (``recovery_log_prefix``; the journal
``<prefix>/<shard id>`` must exist: operators create it, as in Gazette) and should name a
``hint_prefix`` (e.g. ``/gazette/hints``) so that a new primary skips obsolete history. Give
it ``hot_standbys: 1`` for a standby that tails the log and takes over at once.

Counts of a transaction are staged in the document as messages are consumed; the shard commits
the document with its checkpoint (the store records the new file into the recovery log), so a
restarted or promoted replica continues from exactly the committed counts.

Every consumer process also serves queries of the committed counts of any shard, routed to the
shard's primary (``queries.py``: ``query_counts(endpoint, shard, words)``).

    gazette-consumer serve --app examples.word_count:WordCount ...
"""

from __future__ import annotations

from typing import Any

import grpc.aio

from broker.client.async_append import AsyncAppend
from broker.protocol import protocol_pb2 as pb
from examples.word_count.queries import CountsService
from gazette_consumer.application import Application, ServiceContext, Shard
from gazette_consumer.message import JSONMessage
from gazette_consumer.message.message import Envelope
from gazette_consumer.message.publisher import Publisher
from gazette_consumer.recoverylog.recorder import Recorder
from gazette_consumer.stores.base import Store
from gazette_consumer.stores.jsonfile import JSONFileStore

__all__ = ["Text", "WordCount", "counts_of"]


class Text(JSONMessage, kw_only=True):
    """An input message: a text whose words are counted."""

    text: str = ""


class WordCountError(ValueError):
    """The shard cannot run the word count (its spec has no recovery log)."""


class WordCount(Application):
    """The word-counting application (see the module docstring)."""

    def __init__(self) -> None:
        # The store of each shard whose primary (or standby) runs here, for queries: the
        # shards of a process share this one instance.
        self._stores: dict[str, JSONFileStore] = {}

    async def new_store(self, shard: Shard, recorder: Recorder | None) -> Store:
        if recorder is None:
            raise WordCountError(
                f"shard {shard.id}: the word count keeps its state in a recovery log; "
                "set the shard's recovery_log_prefix"
            )
        store = self._stores[shard.id] = JSONFileStore.recorded(recorder)
        return store

    def store_of(self, shard: str) -> JSONFileStore:
        """The store of ``shard``'s latest assignment to this process (KeyError if none)."""
        return self._stores[shard]

    def register_services(self, server: grpc.aio.Server, context: ServiceContext) -> None:
        CountsService(self, context).register(server)

    def new_message(self, journal_spec: pb.JournalSpec) -> type[Any]:
        return Text

    async def consume_message(
        self, shard: Shard, store: Store, envelope: Envelope[Any], publisher: Publisher[AsyncAppend]
    ) -> None:
        message: Text = envelope.message
        counts = _json(store).state.setdefault("counts", {})
        for word in message.text.lower().split():
            counts[word] = counts.get(word, 0) + 1

    async def finalize_txn(
        self, shard: Shard, store: Store, publisher: Publisher[AsyncAppend]
    ) -> None:
        return None  # Everything is staged in the document already.


def counts_of(store: JSONFileStore) -> dict[str, int]:
    """The word counts a store holds (committed, or staged by the open transaction)."""
    return dict(store.state.get("counts", {}))


def _json(store: Store) -> JSONFileStore:
    if not isinstance(store, JSONFileStore):
        raise TypeError(f"the word count needs a JSONFileStore (got {type(store).__name__})")
    return store
