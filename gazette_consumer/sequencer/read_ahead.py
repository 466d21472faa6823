"""The read-ahead of a `ReadCommittedIter` (read_iter.py): its source journals' offsets, and the
background readers that queue their chunks undecoded (the iterator's asyncio shell).

Chunks wait in a bounded `ReadChannel` as bytes and are decoded by the iterator only when their
messages are needed (read_pieces.DECODE_PIECE_BYTES says why): a `Chunk` carries its journal's
decoder, which consumed chunks of one journal reach in order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from broker.client.list_apply import get_journal
from broker.client.retry_reader import RetryReader, Verify
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import ValidationError, at, validate_journal_name
from gazette_consumer.message.framing import Framing
from gazette_consumer.sequencer.decode import ChunkDecoder, MessageTypeSource, new_chunk_decoder
from gazette_consumer.sequencer.read_channel import ReadChannel
from gazette_consumer.sequencer.types import OFFSET_MAX, SequencerCheckpoint

if TYPE_CHECKING:
    from broker.fragment.stores.registry import StoreRegistry


class Chunk:
    """A chunk of a source journal, read ahead and decoded only when the consumer takes it, by
    its journal's decoder (consumed chunks of one journal reach it in order)."""

    __slots__ = ("at", "content", "decoder", "journal", "offset")

    def __init__(self, journal: str, decoder: ChunkDecoder, content: bytes, offset: int) -> None:
        self.journal = journal
        self.decoder = decoder
        self.content = content
        self.offset = offset
        self.at = 0  # Index in `content` of the next piece to decode.


def source_offsets(
    sources: Mapping[str, int] | Sequence[tuple[str, int]],
    checkpoint: SequencerCheckpoint | None,
) -> dict[str, int]:
    """Validated start offsets of `sources`, resumed from `checkpoint` where it has one."""
    pairs = list(sources.items()) if isinstance(sources, Mapping) else list(sources)
    if not pairs:
        raise ValidationError("must name at least one journal", "sources")
    offsets: dict[str, int] = {}
    for journal, offset in pairs:
        with at("sources"):
            validate_journal_name(journal)
        if journal in offsets:
            raise ValidationError("duplicate journal", f"sources[{journal}]")
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= OFFSET_MAX:
            raise ValidationError(
                f"offset must be an int in [0, {OFFSET_MAX}] (got {offset!r})",
                f"sources[{journal}]",
            )
        offsets[journal] = offset
    if checkpoint is not None:
        for journal in offsets:
            offsets[journal] = checkpoint.read_through.get(journal, offsets[journal])
    return offsets


class ReadAhead:
    """One background reader per source journal (a blocking `RetryReader`, all in one
    TaskGroup), each queueing the chunks it reads, undecoded, into the shared `channel` (at most
    its size ahead, across all journals); a reader's error fails the channel. `specs` holds
    each journal's spec once its reader fetched it; `new_decoder` and `new_reader` make what a
    replay of one of them reads with."""

    def __init__(
        self,
        client: JournalClient,
        offsets: Mapping[str, int],
        channel: ReadChannel[Chunk],
        *,
        message_type: MessageTypeSource,
        framing: Framing | None,
        registry: StoreRegistry | None,
        message_bytes_max: int,
        verify_journal: Verify | None = None,
    ) -> None:
        self.channel = channel
        self._verify_journal = verify_journal
        self.specs: dict[str, pb.JournalSpec] = {}
        self._client = client
        self._offsets = offsets
        self._message_type = message_type
        self._framing = framing
        self._registry = registry
        self._message_bytes_max = message_bytes_max
        self._supervisor: asyncio.Task[None] | None = None

    @property
    def started(self) -> bool:
        return self._supervisor is not None

    def start(self) -> None:
        """Start the readers, if not yet (they run until `stop`)."""
        if self._supervisor is None:
            self._supervisor = asyncio.get_running_loop().create_task(self._supervise())

    async def stop(self) -> None:
        """Stop the readers, awaiting them. Idempotent."""
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor

    def new_decoder(self, spec: pb.JournalSpec, offset: int) -> ChunkDecoder:
        """A decoder of `spec`'s journal from `offset`, as the readers decode it."""
        return new_chunk_decoder(
            spec,
            offset,
            self._message_type,
            framing=self._framing,
            message_bytes_max=self._message_bytes_max,
        )

    def new_reader(self, request: pb.ReadRequest, *, verify: bool = False) -> RetryReader:
        """A reader of `request`, checked by `verify_journal` if `verify` (the read-ahead
        readers are; a replay reads below what they checked, and a check per replay would cost
        the read path a List RPC each)."""
        return RetryReader(
            self._client,
            request,
            registry=self._registry,
            verify=self._verify_journal if verify else None,
        )

    async def _supervise(self) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                for journal, offset in self._offsets.items():
                    group.create_task(self._read_journal(journal, offset))
        except Exception as err:  # Only a bug: readers report their own errors.
            self.channel.fail(err)

    async def _read_journal(self, journal: str, offset: int) -> None:
        request = pb.ReadRequest(journal=journal, offset=offset, block=True)
        reader = self.new_reader(request, verify=True)
        try:
            spec = self.specs[journal] = await get_journal(self._client, journal)
            decoder = self.new_decoder(spec, offset)
            while True:
                chunk = await reader.read_chunk()
                if not chunk.content:
                    return  # Only a bounded read ends; these never are.
                await self.channel.put(Chunk(journal, decoder, chunk.content, chunk.offset))
        except Exception as err:
            self.channel.fail(err)
        finally:
            await reader.close()
