"""The look-back before a read's start offset (range_start.py) finds the first record boundary
of a CSV journal by the parity of the quotes after each newline, not at the first newline,
which may lie inside a quoted field (Gazette's CSV framing quotes fields holding newlines, and
a record may span lines).

Found by review (2026-11-28): a read-committed read from a valid record boundary decoded from
the middle of a record and failed ('bare " in non-quoted-field'), although the offset and the
journal were fine; every later partition of a multi-partition read of a CSV journal, and a
streaming query's startingOffsets, take such a look-back.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import StringType, StructField, StructType

from broker.protocol import labels
from spark_integration.batch_read import GazetteBatchReader
from spark_integration.options import parse_write_options
from spark_integration.read_options import parse_read_options
from spark_integration.write import GazetteBatchWriter
from tests.spark_integration.spark_testkit import create_journals, read_all, unique


def test_a_csv_read_from_a_record_boundary_with_a_look_back(broker: str) -> None:
    journal = unique("review/csv")
    create_journals(broker, [journal], content_type=labels.CONTENT_TYPE_CSV)
    schema = StructType([StructField("text", StringType())])
    writer = GazetteBatchWriter(
        parse_write_options({"broker": broker, "journal": journal}), schema, False
    )
    texts = ["first line\nsecond line", "plain", "another"]
    writer.commit([writer.write(iter([pa.RecordBatch.from_pydict({"text": texts})]))])

    content = read_all(broker, journal)
    # S: the start of the second record (after the first record's closing newline).
    first_end = content.index(b'"\n') + 2
    embedded = content.index(b"\n")  # The newline inside the first record's quoted field.
    assert embedded < first_end
    # A look-back that starts inside the first record, before its embedded newline.
    lookback = first_end - (embedded - 3)

    assert _read_from(broker, journal, first_end, lookback) == ["plain", "another"]


def test_a_look_back_starting_inside_many_quoted_newlines(broker: str) -> None:
    """Records of several lines each, quotes doubled inside them: every look-back length finds
    a boundary the decoder takes (no record split), and the read delivers the same rows (each
    record its own transaction, closed before the start: none is skipped)."""
    journal = unique("csv/lookback-many")
    create_journals(broker, [journal], content_type=labels.CONTENT_TYPE_CSV)
    schema = StructType([StructField("text", StringType())])
    writer = GazetteBatchWriter(
        parse_write_options({"broker": broker, "journal": journal}), schema, False
    )
    texts = [f'r{i} "q"\nline two\n,three' for i in range(6)] + ["last"]
    for text in texts:  # A transaction each: all closed before the read's start.
        writer.commit([writer.write(iter([pa.RecordBatch.from_pydict({"text": [text]})]))])
    content = read_all(broker, journal)
    start = content.index(b"r5")  # Inside no quotes? Back to the start of its record.
    start = content.rindex(b"\n", 0, start) + 1
    while content.count(b'"', 0, start) % 2:  # A newline inside quotes: not its start.
        start = content.rindex(b"\n", 0, start - 1) + 1
    for lookback in range(1, start, 7):
        assert _read_from(broker, journal, start, lookback) == texts[5:], lookback


def _read_from(broker: str, journal: str, start: int, lookback: int) -> list[str]:
    """The texts a read-committed batch read from `start` delivers, looking `lookback` back."""
    opts = parse_read_options(
        {
            "broker": broker,
            "journals": journal,
            "startingOffsets": f'{{"{journal}": {start}}}',
            "lookbackBytes": str(lookback),
        },
        "batch",
    )
    reader = GazetteBatchReader(opts, StructType([StructField("text", StringType())]))
    return [
        row
        for part in reader.partitions()
        for batch in reader.read(part)
        for row in batch.column("text").to_pylist()
    ]
