"""Transactions open at a batch read's origin, carried to its later partitions.

A read-committed batch read from an offset S (its origin) skips, whole, every transaction that
began before S (range_start.py: the first partition learns them from the `lookbackBytes`
before S). A later partition, starting at L > S, learns what is open at L from the look-back
before L instead, which says nothing about S once L lies more than `lookbackBytes` after S: a
transaction begun before S and still open at L would look as if it began inside the read (at
the first of its messages in that look-back, or in the partition), and its messages there
would be delivered when its ACK commits it, although the first partition skipped the rest.

So the driver, planning such a read, takes the origin's look-back once (`open_at_origin`): the
producers with a transaction open at S (usually none, and then nothing more is read), and for
each, where that transaction is resolved: the first message at or after S that ends it (an ACK,
or a message outside transactions with a newer clock, as the Sequencer takes them), found by a
content-less scan that stops as soon as all are found (at the read's end at most). Every later
partition starting before that offset marks the producer, in the checkpoint its look-back gives
(`at_start`), as pending since before S: its ACK then skips the transaction whole in that
partition too, as in the first. What remains unknowable is the origin's own bound: a
transaction with no message in the `lookbackBytes` before S looks, from S on, exactly like one
that begins at S (the journal holds nothing else to tell them apart), and is read from S.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gazette_consumer.sequencer.types import (
    FLAG_ACK_TXN,
    FLAG_CONTINUE_TXN,
    JournalProducer,
    ProducerState,
    SequencerCheckpoint,
)
from spark_integration.range_decode import DecoderFactory, decoded, json_decoder, scan_decoder_of
from spark_integration.range_start import start_checkpoint
from spark_integration.sources import JournalSource


@dataclass(frozen=True)
class OpenAtOrigin:
    """A producer's transaction open at the read's origin: its state there (`last_ack`, and
    `begin`, before the origin), and `resolved_at`, the offset of the message that ends it
    (the read's end if none does within the read)."""

    producer: bytes
    last_ack: int
    begin: int
    resolved_at: int


async def open_at_origin(
    source: JournalSource,
    origin: int,
    end: int,
    *,
    lookback: int,
    ring_size: int,
    floor: int,
    new_decoder: DecoderFactory = json_decoder,
    csv: bool = False,
) -> tuple[OpenAtOrigin, ...]:
    """The transactions open at `origin` (see the module docstring), in producer order."""
    journal = source.journal
    checkpoint = await start_checkpoint(
        source,
        origin,
        lookback=lookback,
        ring_size=ring_size,
        floor=floor,
        new_decoder=new_decoder,
        csv=csv,
    )
    pending = {
        int.from_bytes(jp.producer, "big"): (jp.producer, state)
        for jp, state in checkpoint.producers.items()
        if jp.journal == journal and state.begin >= 0
    }
    if not pending:
        return ()
    keys = np.array(sorted(pending), np.uint64)  # Sorted: searched below.
    last_acks = np.array([pending[int(k)][1].last_ack for k in keys], np.uint64)
    resolved: dict[int, int] = {}
    batches = decoded(source, origin, end, scan_decoder_of(new_decoder))
    try:
        async for batch in batches:
            where = np.searchsorted(keys, batch.producers)
            known = (where < len(keys)) & (
                keys[np.minimum(where, len(keys) - 1)] == batch.producers
            )
            # An ACK ends the transaction (committed, or rolled back); a message outside
            # transactions does when its clock is newer than the producer's last ACK.
            ends = known & (batch.flags != FLAG_CONTINUE_TXN)
            ends &= (batch.flags == FLAG_ACK_TXN) | (
                batch.clocks > last_acks[np.minimum(where, len(keys) - 1)]
            )
            for i in np.flatnonzero(ends):
                resolved.setdefault(int(batch.producers[i]), int(batch.begins[i]))
            if len(resolved) == len(pending):
                break
    finally:
        await batches.aclose()
    return tuple(
        OpenAtOrigin(producer, state.last_ack, state.begin, resolved.get(key, end))
        for key, (producer, state) in sorted(pending.items())
    )


def at_start(
    checkpoint: SequencerCheckpoint, journal: str, start: int, open_txns: Sequence[OpenAtOrigin]
) -> SequencerCheckpoint:
    """`checkpoint` (a later partition's, at `start`) with every transaction open at the origin
    and not yet ended at `start` marked as begun before the origin."""
    still_open = [t for t in open_txns if t.resolved_at >= start]
    if not still_open:
        return checkpoint
    producers = dict(checkpoint.producers)
    for txn in still_open:
        producers[JournalProducer(journal, txn.producer)] = ProducerState(txn.last_ack, txn.begin)
    return SequencerCheckpoint(read_through=dict(checkpoint.read_through), producers=producers)
