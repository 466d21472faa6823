"""Streaming offsets: per journal, the read-through offset and the Sequencer's producer states.

    {"journal/a": {"offset": 1234,
                   "producers": {"a1b2c3d4e5f6": {"ack": "139...", "begin": -1},
                                 "0f0e0d0c0b0a": {"ack": "139...", "begin": 1100}}}}

An offset is a `SequencerCheckpoint` per journal: `offset` is where the next micro-batch reads
from, `ack` the clock of the producer's last acknowledged message (a decimal string: clocks are
unsigned 64-bit), and `begin` where its pending transaction began (-1: none). Restored into a
Sequencer, it de-duplicates messages across micro-batches and commits a transaction whose
messages straddle a micro-batch boundary (see stream_reader.py). The number of producers kept per
journal is bounded (`producers_max`); idle producers are pruned by the producer horizon.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gazette_consumer.sequencer.types import (
    InvalidCheckpointError,
    JournalProducer,
    ProducerState,
    SequencerCheckpoint,
)
from spark_integration.options import GazetteOptionError

# Producers remembered per journal in one offset. Offsets are written to the query's
# checkpoint every micro-batch: they must stay small.
producers_max: Final = 10_000


class GazetteOffsetError(ValueError):
    """A streaming offset that is not of the data source's form (or exceeds its bounds)."""


JournalOffsets = dict[str, dict[str, Any]]


def to_json(checkpoints: Mapping[str, SequencerCheckpoint]) -> JournalOffsets:
    out: JournalOffsets = {}
    for journal, cp in checkpoints.items():
        producers = {
            jp.producer.hex(): {"ack": str(state.last_ack), "begin": state.begin}
            for jp, state in cp.producers.items()
            if jp.journal == journal
        }
        if len(producers) > producers_max:
            raise GazetteOffsetError(
                f"journal {journal}: {len(producers)} producers to remember, more than"
                f" {producers_max}; lower option producerHorizonSeconds"
            )
        out[journal] = {"offset": cp.read_through.get(journal, 0), "producers": producers}
    return out


def from_json(offsets: Mapping[str, Any]) -> dict[str, SequencerCheckpoint]:
    out: dict[str, SequencerCheckpoint] = {}
    if not isinstance(offsets, Mapping):
        raise GazetteOffsetError(f"offset: must be a JSON object (got {offsets!r})")
    for journal, entry in offsets.items():
        try:
            out[journal] = _journal_from_json(journal, entry)
        except (KeyError, TypeError, ValueError, InvalidCheckpointError) as err:
            raise GazetteOffsetError(f"offset of journal {journal}: malformed: {err}") from None
    return out


def _journal_from_json(journal: str, entry: Any) -> SequencerCheckpoint:
    offset = entry["offset"]
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an integer >= 0 (got {offset!r})")
    producers = {
        JournalProducer(journal, bytes.fromhex(hex_id)): ProducerState(
            last_ack=int(state["ack"]), begin=int(state["begin"])
        )
        for hex_id, state in entry.get("producers", {}).items()
    }
    return SequencerCheckpoint(read_through={journal: offset}, producers=producers)


def read_through(offsets: Mapping[str, Any]) -> dict[str, int]:
    return {journal: cp.read_through[journal] for journal, cp in from_json(offsets).items()}


def starting_offsets(option: Mapping[str, int], journals: list[str]) -> dict[str, int]:
    """Offsets of option startingOffsets (JSON), which must name only journals read."""
    unknown = sorted(set(option) - set(journals))
    if unknown:
        raise GazetteOptionError(
            "startingOffsets", f"names journals not read: {', '.join(unknown)}"
        )
    return {journal: option.get(journal, 0) for journal in journals}
