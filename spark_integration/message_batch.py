"""A batch of read messages as columns, and the Sequencer's view of each of its rows (sans-IO).

A Spark partition decodes journal content a piece at a time (json_lines.py) into a
`MessageBatch`: per message its offsets, the parts of its UUID (numpy arrays), its UUID text
and its content (Arrow arrays). Output rows are then cut from the batch by index (`take`), so a
message's bytes are never a Python object of their own on the fast path.

The Sequencer sees each row as a `BatchRow`: the `Sequenced` fields, plus the batch and the
row's index in it, which is how a committed row finds its way back to its columns, whichever
batch it was read in (a transaction's messages wait in the Sequencer's ring across batches).
A BatchRow holds its batch alive while the ring holds it: the ring holds at most `ringSize`
rows, as it held their messages' bytes before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Final

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from gazette_consumer.message.message import Envelope
from gazette_consumer.message.uuid import ZERO_PRODUCER_ID
from gazette_consumer.sequencer.types import PRODUCER_ID_BYTES
from spark_integration.uuid_columns import U64Array

I64Array = npt.NDArray[np.int64]
# Distinct producers an interning table keeps before it starts over (an identity test of
# producers is what lets the Sequencer's fast paths skip comparing bytes).
interned_producers_max: Final = 1 << 16


class BatchRow(msgspec.Struct, frozen=True, gc=False):
    """A row of a MessageBatch as the Sequencer sees it (`Sequenced`); `batch.take` finds its
    columns by `index`. Not tracked by the garbage collector: it refers to its batch, which
    never refers back."""

    journal: str
    begin: int
    end: int
    producer: bytes
    clock: int
    flags: int
    batch: MessageBatch
    index: int


@dataclass(eq=False)
class MessageBatch:
    """Messages of one journal, in journal order: [begins[i], ends[i]) holds message i. A
    message without a UUID has producer 0, clock 0 and flags 0 (OUTSIDE_TXN), and a null
    `uuids` entry. `content` is the message as a JSON line (without its newline), a CSV record,
    or (protobuf) its payload."""

    journal: str
    begins: I64Array
    ends: I64Array
    producers: U64Array
    clocks: U64Array
    flags: npt.NDArray[np.uint16]
    uuids: pa.Array  # string
    content: pa.Array  # string (JSON lines, CSV) or binary (protobuf)

    def __len__(self) -> int:
        return len(self.begins)

    @property
    def end(self) -> int:
        """Where the batch's last message ends."""
        return int(self.ends[-1]) if len(self.ends) else 0

    def rows(self, intern: ProducerIntern) -> list[BatchRow]:
        """The Sequencer's view of every row, in order."""
        return self.rows_at(None, intern)

    def rows_at(
        self, indices: npt.NDArray[np.intp] | None, intern: ProducerIntern
    ) -> list[BatchRow]:
        """The Sequencer's view of the rows at `indices` (all for None), in that order."""
        if indices is None:
            n, index_list = len(self), range(len(self))
            begins, ends = self.begins, self.ends
            producers, clocks, flags = self.producers, self.clocks, self.flags
        else:
            n, index_list = len(indices), indices.tolist()
            begins, ends = self.begins[indices], self.ends[indices]
            producers, clocks = self.producers[indices], self.clocks[indices]
            flags = self.flags[indices]
        if n == 0:
            return []
        return list(
            map(
                BatchRow,
                repeat(self.journal, n),
                begins.tolist(),
                ends.tolist(),
                intern.objects(producers),
                clocks.tolist(),
                flags.tolist(),
                repeat(self, n),
                index_list,
            )
        )

    def take(self, indices: npt.NDArray[np.intp] | None) -> MessageBatch:
        """The rows at `indices`, in that order (all of them for None)."""
        if indices is None:
            return self
        # From the buffer, not pa.array: its first call in a process imports pandas (~0.4 s),
        # which a driver's planning walk needs nowhere (json_lines.py).
        positions = np.ascontiguousarray(indices, np.int64)
        arrow_indices = pa.Array.from_buffers(
            pa.int64(), len(positions), [None, pa.py_buffer(positions)]
        )
        return MessageBatch(
            self.journal,
            self.begins[indices],
            self.ends[indices],
            self.producers[indices],
            self.clocks[indices],
            self.flags[indices],
            self.uuids.take(arrow_indices),
            self.content.take(arrow_indices),
        )

    @classmethod
    def concat(cls, batches: Sequence[MessageBatch]) -> MessageBatch:
        if len(batches) == 1:
            return batches[0]
        return cls(
            batches[0].journal,
            np.concatenate([b.begins for b in batches]),
            np.concatenate([b.ends for b in batches]),
            np.concatenate([b.producers for b in batches]),
            np.concatenate([b.clocks for b in batches]),
            np.concatenate([b.flags for b in batches]),
            pa.concat_arrays([b.uuids for b in batches]),
            pa.concat_arrays([b.content for b in batches]),
        )


def gather(rows: Sequence[BatchRow]) -> MessageBatch | None:
    """The columns of `rows`, in their order (None if there are none). Rows of one batch, the
    common case, are one `take`; rows of several are taken from each and concatenated."""
    if not rows:
        return None
    batch = rows[0].batch
    if all(row.batch is batch for row in rows):
        indices = np.fromiter((row.index for row in rows), np.intp, len(rows))
        if len(indices) == len(batch) and bool(np.all(indices[1:] > indices[:-1])):
            return batch  # Every row, in order.
        return batch.take(indices)
    pieces: list[MessageBatch] = []
    start = 0
    for at in range(1, len(rows) + 1):
        if at == len(rows) or rows[at].batch is not rows[start].batch:
            run = rows[start:at]
            indices = np.fromiter((row.index for row in run), np.intp, len(run))
            pieces.append(run[0].batch.take(indices))
            start = at
    return MessageBatch.concat(pieces)


class ProducerIntern:
    """One bytes object per ProducerID, across batches (see `interned_producers_max`)."""

    def __init__(self) -> None:
        self._objects: dict[int, bytes] = {0: ZERO_PRODUCER_ID}

    def objects(self, producers: U64Array) -> list[bytes]:
        """The interned ProducerID of each row."""
        unique, inverse = np.unique(producers, return_inverse=True)
        known = self._objects
        if len(known) + len(unique) > interned_producers_max:
            known.clear()
            known[0] = ZERO_PRODUCER_ID
        objects = []
        for value in unique.tolist():
            obj = known.get(value)
            if obj is None:
                obj = known[value] = value.to_bytes(PRODUCER_ID_BYTES, "big")
            objects.append(obj)
        if len(objects) == 1:
            return [objects[0]] * len(producers)
        return [objects[i] for i in inverse.tolist()]


def batch_of_envelopes(
    journal: str, envelopes: Sequence[Envelope[Any]], content: pa.Array
) -> MessageBatch:
    """A MessageBatch of envelopes decoded one by one (the general path: CSV, protobuf, and
    JSON lines the bulk decoder does not take), with their `content` built by the caller."""
    n = len(envelopes)
    uuids = [None if env.uuid is None else str(env.uuid) for env in envelopes]
    return MessageBatch(
        journal,
        np.fromiter((env.begin for env in envelopes), np.int64, n),
        np.fromiter((env.end for env in envelopes), np.int64, n),
        np.fromiter((int.from_bytes(env.producer, "big") for env in envelopes), np.uint64, n),
        np.fromiter((env.clock for env in envelopes), np.uint64, n),
        np.fromiter((env.flags for env in envelopes), np.uint16, n),
        pa.array(uuids, pa.string()),
        content,
    )
