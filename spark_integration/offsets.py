"""Streaming offsets: per journal, the read-through offset, the origin, and producer states.

    {"journal/a": {"offset": 1234, "origin": 512, "producers": "AeJz...Q=="}}

An offset is a `SequencerCheckpoint` per journal: `offset` is where the next micro-batch reads
from, and `producers` the state of each producer the Sequencer remembers: the clock of its last
acknowledged message, and where its pending transaction began (if one is open). Restored into a
Sequencer, it de-duplicates messages across micro-batches and commits a transaction whose
messages straddle a micro-batch boundary (see stream_read.py). `origin` (omitted when 0) is
where the query started reading the journal: a transaction that began before it is never
delivered (range_read.py). `created` (omitted when unknown) is the journal's etcd create
revision when the query read it: a journal deleted and created again has another
(stream_read.py). `deselected` (omitted when false) marks the offset of a journal the
query no longer reads (out of its selection), kept so that the journal, read again, goes on
from it (stream_read.py). `isolation` marks offsets of read-uncommitted queries
(`check_isolation`).

Offsets are written to the query's checkpoint at every micro-batch, whole, so they are packed:
producers are sorted by clock and each is 6 bytes of ProducerID, the clock as a varint delta
from the previous one, and the begin offset + 1 as a varint; the whole is deflated and base64
encoded: about 16 bytes a producer (an entry of 3,000 producers is 50 KB, of 20,000 323 KB),
where the JSON objects this replaced took 62 (186 KB and 1.24 MB; measured with clocks spread
over 10 days: tests/spark_integration/test_spark_offsets_rows.py). Entries of that older form
are still read. The number of producers per journal is bounded
(`producers_max`); idle ones are pruned by the producer horizon before that.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gazette_consumer.sequencer.types import (
    InvalidCheckpointError,
    JournalProducer,
    ProducerState,
    SequencerCheckpoint,
)

# Producers remembered per journal in one offset (about 1.3 MB of offset at the bound).
producers_max: Final = 100_000
_PACKED_VERSION: Final = 1
_PRODUCER_BYTES: Final = 6
# The mark of offsets written by a read-uncommitted query (read_options.READ_UNCOMMITTED).
UNCOMMITTED: Final = "read_uncommitted"


class GazetteOffsetError(ValueError):
    """A streaming offset that is not of the data source's form (or exceeds its bounds)."""


@dataclass(frozen=True)
class JournalOffset:
    """A journal's streaming offset: the Sequencer's checkpoint, and the query's origin."""

    checkpoint: SequencerCheckpoint
    origin: int = 0
    # The checkpoints at offsets inside the micro-batch that ends here, where its partitions
    # are cut (stream_read.py); ignored as a start.
    splits: tuple[tuple[int, SequencerCheckpoint], ...] = ()
    # At a split, the largest clock each transaction pending there (and begun within the
    # micro-batch) reached: the partition starting there needs it for that transaction's
    # replay, and would otherwise scan the transaction's earlier part to learn it (range_read.py).
    reached: Mapping[int, Mapping[bytes, int]] = field(default_factory=dict)
    # At a split, the messages after it (within the micro-batch) that resolve the transactions
    # pending there, [begin, end) each: the partition ending there reads only them ahead
    # (resolving.py). A split absent here was not planned so: it scans.
    resolving: Mapping[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    # The journal is no longer read (out of the selection, or of option journals): its offset
    # is kept so that, read again, it goes on from here rather than from its beginning.
    deselected: bool = False
    # The journal's etcd create revision when the query read it (0: not known, as in offsets
    # written before it was kept, or read from a store): a journal of that name with another
    # was deleted and created again since, and this offset is not one of its offsets.
    created: int = 0

    @classmethod
    def at(cls, journal: str, offset: int, origin: int = 0) -> JournalOffset:
        return cls(SequencerCheckpoint(read_through={journal: offset}), origin)

    def offset(self, journal: str) -> int:
        return self.checkpoint.read_through.get(journal, 0)


JournalOffsets = dict[str, dict[str, Any]]


def _packed(journal: str, checkpoint: SequencerCheckpoint) -> str:
    states = [
        (jp.producer, state) for jp, state in checkpoint.producers.items() if jp.journal == journal
    ]
    if len(states) > producers_max:
        raise GazetteOffsetError(
            f"journal {journal}: {len(states)} producers to remember, more than"
            f" {producers_max}; lower option producerHorizonSeconds"
        )
    return pack_producers(states)


def to_json(offsets: Mapping[str, JournalOffset], *, uncommitted: bool = False) -> JournalOffsets:
    """The offsets as Spark keeps them; `uncommitted`: of a read-uncommitted query (marked so:
    check_isolation)."""
    out: JournalOffsets = {}
    for journal, entry in offsets.items():
        encoded: dict[str, Any] = {"offset": entry.offset(journal)}
        if entry.origin:
            encoded["origin"] = entry.origin
        if uncommitted:
            encoded["isolation"] = UNCOMMITTED
        if entry.deselected:
            encoded["deselected"] = True
        if entry.created:
            encoded["created"] = entry.created
        encoded["producers"] = _packed(journal, entry.checkpoint)
        if entry.splits:
            encoded["splits"] = [
                _split_json(
                    at, _packed(journal, cp), entry.reached.get(at), entry.resolving.get(at)
                )
                for at, cp in entry.splits
            ]
        out[journal] = encoded
    return out


def _split_json(
    at: int,
    producers: str,
    reached: Mapping[bytes, int] | None,
    resolving: tuple[tuple[int, int], ...] | None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"offset": at, "producers": producers}
    if reached:
        out["reached"] = pack_clocks(reached)
    if resolving is not None:
        out["resolving"] = [[begin, end] for begin, end in resolving]
    return out


def from_json(offsets: Mapping[str, Any]) -> dict[str, JournalOffset]:
    out: dict[str, JournalOffset] = {}
    if not isinstance(offsets, Mapping):
        raise GazetteOffsetError(f"offset: must be a JSON object (got {offsets!r})")
    for journal, entry in offsets.items():
        try:
            out[journal] = _journal_from_json(journal, entry)
        except (KeyError, TypeError, ValueError, InvalidCheckpointError) as err:
            raise GazetteOffsetError(f"offset of journal {journal}: malformed: {err}") from None
    return out


def _journal_from_json(journal: str, entry: Any) -> JournalOffset:
    offset, origin, created = entry["offset"], entry.get("origin", 0), entry.get("created", 0)
    for name, value in (("offset", offset), ("origin", origin), ("created", created)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0 (got {value!r})")
    checkpoint = _checkpoint(journal, offset, entry.get("producers", ""))
    splits = []
    reached: dict[int, dict[bytes, int]] = {}
    resolving: dict[int, tuple[tuple[int, int], ...]] = {}
    for split in entry.get("splits", ()):
        at = split["offset"]
        if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at <= offset:
            raise ValueError(f"splits: offset must be an integer in [0, {offset}] (got {at!r})")
        splits.append((at, _checkpoint(journal, at, split["producers"])))
        if "reached" in split:  # Absent from offsets written before it was kept.
            reached[at] = unpack_clocks(split["reached"])
        if "resolving" in split:  # Likewise.
            resolving[at] = _ranges(split["resolving"], at, offset)
    deselected = entry.get("deselected", False)
    if not isinstance(deselected, bool):
        raise ValueError(f"deselected must be a boolean (got {deselected!r})")
    return JournalOffset(checkpoint, origin, tuple(splits), reached, resolving, deselected, created)


def check_isolation(offsets: Mapping[str, Any], *, committed: bool) -> None:
    """Refuse offsets of a query of the other isolation. Read-committed offsets carry the
    transactions pending at them, whose messages before the offset a read-uncommitted query
    going on from there would never deliver; read-uncommitted offsets carry none, so a
    read-committed query would take those transactions' tails for whole ones. Offsets of
    read-uncommitted queries written before they were marked pass for read-committed ones."""
    for journal, entry in offsets.items():
        marked = isinstance(entry, Mapping) and entry.get("isolation") == UNCOMMITTED
        if committed and not marked:
            continue
        if not committed and marked:
            continue
        parsed = from_json({journal: entry})[journal]
        if not committed and not parsed.checkpoint.producers and not parsed.splits:
            continue  # Nothing pending, nothing to tell them apart by: either way alike.
        this, other = (
            ("read_committed", UNCOMMITTED) if committed else (UNCOMMITTED, "read_committed")
        )
        raise GazetteOffsetError(
            f"offset of journal {journal}: written by a query with isolation {other}, read"
            f" by one with isolation {this}: the isolation of a query cannot change across"
            " restarts (start the query from a new checkpoint location)"
        )


def _ranges(value: Any, low: int, high: int) -> tuple[tuple[int, int], ...]:
    """Message ranges [begin, end) within [low, high], as a split's `resolving` lists them."""
    out = []
    for pair in value:
        begin, end = pair
        for bound in (begin, end):
            if isinstance(bound, bool) or not isinstance(bound, int):
                raise ValueError(f"resolving: offsets must be integers (got {pair!r})")
        if not low <= begin < end <= high:
            raise ValueError(f"resolving: [{begin}, {end}) is not within [{low}, {high}]")
        out.append((begin, end))
    return tuple(out)


def _checkpoint(journal: str, offset: int, producers: Any) -> SequencerCheckpoint:
    if isinstance(producers, Mapping):  # The form before packing.
        states = [
            (bytes.fromhex(hex_id), ProducerState(last_ack=int(s["ack"]), begin=int(s["begin"])))
            for hex_id, s in producers.items()
        ]
    else:
        states = unpack_producers(producers)
    return SequencerCheckpoint(
        read_through={journal: offset},
        producers={JournalProducer(journal, producer): state for producer, state in states},
    )


def pack_producers(states: list[tuple[bytes, ProducerState]]) -> str:
    out = bytearray([_PACKED_VERSION])
    previous = 0
    for producer, state in sorted(states, key=lambda s: (s[1].last_ack, s[0])):
        out += producer
        _varint(out, state.last_ack - previous)
        _varint(out, state.begin + 1)
        previous = state.last_ack
    return base64.b64encode(zlib.compress(bytes(out), 9)).decode()


def unpack_producers(text: str) -> list[tuple[bytes, ProducerState]]:
    if not isinstance(text, str):
        raise TypeError(f"producers must be a string (got {type(text).__name__})")
    if not text:
        return []
    try:
        data = zlib.decompress(base64.b64decode(text, validate=True))
    except (binascii.Error, zlib.error) as err:
        raise ValueError(f"producers: not packed producer states: {err}") from None
    if not data or data[0] != _PACKED_VERSION:
        raise ValueError(f"producers: unknown packing {data[:1]!r}")
    out: list[tuple[bytes, ProducerState]] = []
    at, clock = 1, 0
    while at < len(data):
        producer = data[at : at + _PRODUCER_BYTES]
        if len(producer) != _PRODUCER_BYTES:
            raise ValueError("producers: truncated")
        delta, at = _read_varint(data, at + _PRODUCER_BYTES)
        begin, at = _read_varint(data, at)
        clock += delta
        out.append((producer, ProducerState(last_ack=clock, begin=begin - 1)))
    return out


def pack_clocks(clocks: Mapping[bytes, int]) -> str:
    """Producers' clocks, packed as producer states are (the clock as the last ACK)."""
    return pack_producers([(p, ProducerState(last_ack=c, begin=-1)) for p, c in clocks.items()])


def unpack_clocks(text: str) -> dict[bytes, int]:
    return {producer: state.last_ack for producer, state in unpack_producers(text)}


def _varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("producers: truncated")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def read_through(offsets: Mapping[str, Any]) -> dict[str, int]:
    return {journal: entry.offset(journal) for journal, entry in from_json(offsets).items()}
