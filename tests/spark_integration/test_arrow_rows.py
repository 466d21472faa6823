"""RecordBatchBuilder's metadata columns built by views and slices (arrow_rows.py): the
`producer` column a byte slice of the UUID texts, `journal` and `labels` slices of an array
built once. Compared with how they were built before (a string slice of each UUID, a take of
one value for each row) on random batches of every kind a partition builds from: the bulk path
(with and without UUIDs, nil UUIDs), the general path, rows taken, batches concatenated,
arrays sliced (a non-zero offset), in batch sizes that grow and shrink."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql.types import StructType

from spark_integration.arrow_rows import RecordBatchBuilder
from spark_integration.json_lines import bulk_batch, general_batch
from spark_integration.message_batch import MessageBatch
from spark_integration.rows import LABELS_FIELD, META_SCHEMA
from tests.spark_integration.test_uuid_tails import NIL, V1, V1_OTHER, writer_line

JOURNAL = "arrow/rows"
LABELS = (("app", "x"), ("app", "y"), ("zone", "z"))


def random_batch(rng: random.Random) -> MessageBatch:
    lines = []
    for i in range(rng.randint(1, 60)):
        if rng.random() < 0.1:
            lines.append(b'{"text":"no uuid %d"}\n' % i)
        else:
            lines.append(writer_line(f"t{i}", rng.choice([V1, V1_OTHER, NIL])))
    piece = b"".join(lines)
    offset = rng.randrange(1 << 30)
    batch = (
        general_batch(JOURNAL, offset, piece, final=True)
        if rng.random() < 0.2
        else bulk_batch(JOURNAL, offset, piece)
    )
    assert batch is not None
    shape = rng.random()
    if shape < 0.3:
        batch = batch.take(np.array(rng.choices(range(len(batch)), k=rng.randint(1, 80))))
    elif shape < 0.5:
        batch = MessageBatch.concat([batch, random_batch(rng)])
    elif shape < 0.7 and len(batch) > 1:
        lo = rng.randrange(1, len(batch))
        batch = MessageBatch(
            batch.journal,
            batch.begins[lo:],
            batch.ends[lo:],
            batch.producers[lo:],
            batch.clocks[lo:],
            batch.flags[lo:],
            batch.uuids.slice(lo),
            batch.content.slice(lo),
        )
    return batch


@pytest.mark.parametrize("seed", range(20))
def test_metadata_columns_are_what_they_were(seed: int) -> None:
    rng = random.Random(seed)
    schema = StructType([*META_SCHEMA.fields, LABELS_FIELD])
    builder = RecordBatchBuilder(schema, LABELS)
    labels_map = [("app", "x,y"), ("zone", "z")]
    for _ in range(25):
        batch = random_batch(rng)
        n = len(batch)
        built = builder.build(batch)
        built.validate(full=True)
        assert built.column("producer").equals(pc.utf8_slice_codeunits(batch.uuids, 24, 36))
        assert built.column("uuid").equals(batch.uuids)
        assert built.column("journal").to_pylist() == [JOURNAL] * n
        assert built.column("labels").to_pylist() == [labels_map] * n
        assert built.column("content").to_pylist() == batch.content.to_pylist()
        # As Spark's worker hands it to the JVM: through Arrow's IPC format.
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, built.schema) as writer:
            writer.write_batch(built)
        assert pa.ipc.open_stream(sink.getvalue()).read_next_batch().equals(built)
