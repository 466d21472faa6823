"""Which journal each written row goes to, and which of its columns make the message (sans-IO).

A write names its journals one of three ways (options.py):

- option `journal`: every row goes there;
- a `journal` column: each row names its journal (the column is not part of the message);
- option `keyColumn` with `selector`: each row goes to one of the journals the selector matched
  when the write was planned (on the driver: every task of a write, and every retry, maps over
  the same journals), chosen from the key as the consumer framework's mappings choose
  (gazette_consumer/message/mapping.py): `modulo`, FNV-1a (32 bit) of the key modulo the
  journals sorted by name, as Gazette's Go ModuloMapping; or `rendezvous`, the journal of
  highest weight for the key. A key is hashed as bytes: a string's UTF-8, a binary value's
  bytes, an integer's decimal text. So a key always goes to the same journal while the
  selector matches the same journals; a journal added later takes keys from the others (most
  of them with modulo, only those it wins with rendezvous).

Both ways of routing rows are deterministic, as Spark requires of a task it may re-run: a
retried task writes the same rows to the same journals, where the sink rolls back what a failed
attempt wrote (sink_commit.py). Routing works on whole Arrow batches: keys are hashed once per
distinct key of a batch (vectorised FNV-1a; rendezvous weights with numpy), and rows are
grouped per journal with index arrays.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gazette_consumer.message.mapping import hash64
from spark_integration.arrow_json import string_offsets
from spark_integration.rows import GazetteRowError

_FNV32_OFFSET: Final = np.uint32(0x811C9DC5)
_FNV32_PRIME: Final = np.uint32(0x01000193)
MODULO: Final = "modulo"
RENDEZVOUS: Final = "rendezvous"


@dataclass(frozen=True)
class RowShape:
    """How rows map to messages: a "content" column of JSON, or every column (but a routing
    "journal" column); and to journals: option "journal", each row's "journal" column, or
    `key_column` mapped over `key_journals` (sorted by name) by `mapping`. `content_types`:
    the content-type of each journal the driver resolved (write_framing.py; tasks look up
    the others); `content_type`: option contentType ("" if not given); `journal_labels`:
    the content-type label of every journal, listed by the driver when rows name their
    journal (so that tasks need not look each one up); `csv_fields`: the number of fields of
    the records of each CSV journal whose width the driver read (csv_width.py; 0 if empty)."""

    content_column: bool
    journal_column: bool
    journal: str
    key_column: str = ""
    key_journals: tuple[str, ...] = ()
    mapping: str = MODULO
    content_types: tuple[tuple[str, str], ...] = ()
    content_type: str = ""
    journal_labels: tuple[tuple[str, str], ...] = ()
    csv_fields: tuple[tuple[str, int], ...] = ()
    protobuf_class: str = ""  # Option protobufClass: the message class of protobuf journals.

    @property
    def routing(self) -> str:
        """A fingerprint of how rows map to journals when that depends on which journals exist
        (by key: the key journals and the mapping); "" when rows name their journal or one is
        given, which a change of the journals cannot move. A micro-batch re-run by another run
        of the query routes its rows as the first run did only if this is the same."""
        if not self.key_column:
            return ""
        text = "\n".join((self.mapping, self.key_column, *self.key_journals))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def message_columns(self, names: Sequence[str]) -> list[str]:
        """The columns of a row that make its JSON object (when there is no content column)."""
        return [n for n in names if not (self.journal_column and n == "journal")]


def fnv1a32_each(keys: pa.Array) -> np.ndarray[Any, np.dtype[np.uint32]]:
    """32-bit FNV-1a of each key's bytes (as mapping.fnv1a32), all keys at once: one numpy step
    per byte position, over the keys at least that long."""
    offsets, data = string_offsets(keys)
    starts, lengths = offsets[:-1], np.diff(offsets)
    out = np.full(len(keys), _FNV32_OFFSET, dtype=np.uint32)
    live = np.arange(len(keys))
    for position in range(int(lengths.max()) if len(keys) else 0):
        live = live[lengths[live] > position]
        byte = data[starts[live] + position].astype(np.uint32)
        out[live] = (out[live] ^ byte) * _FNV32_PRIME  # uint32 arithmetic wraps, as FNV does.
    return out


def _mix64(value: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """mapping.mix64 on uint64 arrays (multiplication wraps modulo 2**64, as there)."""
    value = (value ^ (value >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    value = (value ^ (value >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return value ^ (value >> np.uint64(31))


def rendezvous_each(keys: pa.Array, journals: Sequence[str]) -> np.ndarray[Any, Any]:
    """The index of each key's journal by mapping.rendezvous_choice (highest weight; ties to
    the first journal by name, as argmax takes the first)."""
    seeds = np.array([hash64(j.encode()) for j in journals], dtype=np.uint64)
    hashes = np.array([hash64(k) for k in keys.to_pylist()], dtype=np.uint64)
    with np.errstate(over="ignore"):
        weights = _mix64(hashes[:, None] ^ seeds[None, :])
    return np.argmax(weights, axis=1)


def key_bytes(keys: pa.Array) -> pa.Array:
    """Keys as the bytes they are hashed as: strings and binary as they are, integers as
    decimal text."""
    if pa.types.is_integer(keys.type):
        keys = pc.cast(keys, pa.string())
    if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type):
        return keys.cast(pa.binary())
    if pa.types.is_binary(keys.type) or pa.types.is_large_binary(keys.type):
        return keys.cast(pa.binary())
    raise GazetteRowError(f"key column: values of type {keys.type} cannot be routed")


def journal_index(shape: RowShape, keys: pa.Array) -> np.ndarray[Any, Any]:
    """The index in `shape.key_journals` of each row's journal, from its key."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if keys.null_count:
        raise GazetteRowError(f"row's key column {shape.key_column!r} is null")
    keys = key_bytes(keys)
    distinct = pc.unique(keys)
    if shape.mapping == RENDEZVOUS:
        chosen = rendezvous_each(distinct, shape.key_journals)
    else:
        chosen = fnv1a32_each(distinct).astype(np.int64) % len(shape.key_journals)
    return np.asarray(chosen)[pc.index_in(keys, value_set=distinct).to_numpy()]


def route(shape: RowShape, batch: pa.RecordBatch) -> list[tuple[str, pa.Array | None]]:
    """(journal, indices of its rows in `batch`; None for all of them) of each journal the
    batch's rows go to."""
    if shape.key_column:
        if not shape.key_journals:
            raise GazetteRowError("no journal to route rows to")
        index = journal_index(shape, batch.column(shape.key_column))
        out = []
        for j in np.unique(index):
            rows = np.flatnonzero(index == j)
            journal = shape.key_journals[int(j)]
            out.append((journal, None if len(rows) == batch.num_rows else pa.array(rows)))
        return out
    if not shape.journal_column:
        return [(shape.journal, None)]
    column = batch.column("journal")
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count or pc.any(pc.equal(column, "")).as_py():
        raise GazetteRowError("row has no journal: its 'journal' column is null or empty")
    names = pc.unique(column)
    if len(names) == 1:
        return [(str(names[0].as_py()), None)]
    codes = pc.index_in(column, value_set=names).to_numpy()
    return [
        (str(name), pa.array(np.flatnonzero(codes == i)))
        for i, name in enumerate(names.to_pylist())
    ]
