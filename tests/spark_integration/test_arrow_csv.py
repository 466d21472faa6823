"""CSV writes without Spark: each row's record is what Gazette's CSV framing (Go's csv.Writer)
encodes for its fields, value by value; records decode with the framing readers use, every one
(ACKs included) as wide as the first; journals that cannot be written are refused by name."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid

import pyarrow as pa
import pytest

from broker.protocol import labels
from gazette_consumer.message.csv_framing import CSVFraming, CSVRecord, encode_record
from gazette_consumer.message.uuid import Flag, build_uuid, new_producer_id
from gazette_consumer.sequencer.decode import ChunkDecoder
from spark_integration.arrow_csv import csv_lines
from spark_integration.journal_io import GazetteJournalError
from spark_integration.options import GazetteOptionError, parse_write_options
from spark_integration.publish import encode_batch
from spark_integration.routing import RowShape
from spark_integration.write_framing import WriteFraming, write_content_type

PRODUCER = new_producer_id()
CLOCK = (1 << 59) + 0x1234_5678_9ABC_DEF
CSV = labels.CONTENT_TYPE_CSV
TRICKY = [
    "plain",
    "",
    "comma,inside",
    'quote"inside',
    " leading space",
    "\tleading tab",
    "\u3000ideographic space first",
    "\x1cnot a Go space",
    "\\.",
    "\\.not alone",
    "new\nline",
    "carriage\rreturn",
    "trailing space ",
    "é ☃",
]


def _decode(content: bytes) -> list[CSVRecord]:
    framing = CSVFraming()
    decoder = ChunkDecoder("a/journal", 0, framing, framing.new_decoder(CSVRecord))
    envelopes = decoder.feed(content, 0) + decoder.flush()
    assert decoder.error is None and not decoder.skipped_bytes
    return [env.message for env in envelopes]


def test_fields_are_quoted_as_go_writes_them() -> None:
    batch = pa.record_batch({"s": pa.array([*TRICKY, None])})
    uuids = pa.array([f"u{i}" for i in range(len(TRICKY) + 1)])

    got = csv_lines(batch, ["s"], uuids).to_pylist()

    assert got == [
        encode_record([f"u{i}", value]).decode() for i, value in enumerate([*TRICKY, ""])
    ]


def test_values_as_text() -> None:
    batch = pa.record_batch(
        {
            "n": pa.array([1, None, -(2**63)], pa.int64()),
            "f": pa.array([0.5, None, 1e300]),
            "ok": pa.array([True, False, None]),
            "d": pa.array([decimal.Decimal("1.50"), None, decimal.Decimal("-2.25")]),
            "day": pa.array([dt.date(2024, 1, 2), None, dt.date(1970, 1, 1)]),
            "ts": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5), None, None]),
            "bin": pa.array([b"\x00\xff", None, b""]),
            "l": pa.array([[1, 2], [], None]),
            "st": pa.array([{"x": 1, "y": "a,b"}, None, {"x": None, "y": None}]),
        }
    )
    got = csv_lines(batch, batch.schema.names, pa.array(["u"] * 3)).to_pylist()
    assert got == [
        encode_record(["u", *fields]).decode()
        for fields in (
            [
                *("1", "0.5", "true", "1.50", "2024-01-02", "2024-01-02T03:04:05", "00ff"),
                *("[1,2]", '{"x":1,"y":"a,b"}'),
            ],
            ["", "", "false", "", "", "", "", "[]", ""],
            [str(-(2**63)), "1e+300", "", "-2.25", "1970-01-01", "", "", "", '{"x":null,"y":null}'],
        )
    ]


def test_a_batch_to_a_csv_journal_frames_records_and_acks_alike() -> None:
    """Records and ACKs decode with the framing readers use (which requires every record to
    be as wide as the first); UUIDs are the clocks' CONTINUE_TXN ones, fields the columns."""
    journal = "a/journal"
    shape = RowShape(False, False, journal, content_types=((journal, CSV),))
    batch = pa.record_batch({"s": pa.array(TRICKY), "n": pa.array(range(len(TRICKY)))})

    [(target, lines)] = encode_batch(shape, batch, PRODUCER, CLOCK)
    framing = WriteFraming.of(journal, CSV, shape, batch.schema.names)
    ack = framing.ack(PRODUCER, CLOCK + len(TRICKY))
    records = _decode(bytes(lines.data[lines.offsets[0] : lines.offsets[-1]]) + ack)

    assert target == journal
    assert [r.get_uuid() for r in records] == [
        *(build_uuid(PRODUCER, CLOCK + i, Flag.CONTINUE_TXN) for i in range(len(TRICKY))),
        build_uuid(PRODUCER, CLOCK + len(TRICKY), Flag.ACK_TXN),
    ]
    assert [r[1:] for r in records[:-1]] == [[s, str(i)] for i, s in enumerate(TRICKY)]
    assert records[-1][1:] == ["", ""]  # The ACK: as wide as the rows, its fields empty.


def test_a_journal_column_is_not_a_field_and_json_journals_stay_json() -> None:
    csv_journal, json_journal = "j/csv", "j/json"
    shape = RowShape(False, True, "")
    batch = pa.record_batch(
        {"journal": [csv_journal, json_journal, csv_journal], "n": pa.array([0, 1, 2])}
    )
    types = {csv_journal: CSV, json_journal: labels.CONTENT_TYPE_JSON_LINES}

    out = dict(encode_batch(shape, batch, PRODUCER, CLOCK, types))

    csv_records = _decode(bytes(out[csv_journal].data[out[csv_journal].offsets[0] :]))
    assert [r[1:] for r in csv_records] == [["0"], ["2"]]
    assert [r.get_uuid() for r in csv_records] == [
        build_uuid(PRODUCER, CLOCK + i, Flag.CONTINUE_TXN) for i in (0, 2)
    ]
    json_line = bytes(out[json_journal].data[out[json_journal].offsets[0] :])
    assert json_line.startswith(b'{"n":1,"UUID":"')


def test_a_content_column_cannot_be_written_to_csv() -> None:
    shape = RowShape(True, False, "a/journal")
    with pytest.raises(GazetteJournalError, match=r"'content' column .* rename or drop it"):
        WriteFraming.of("a/journal", CSV, shape, ["content"])


@pytest.mark.parametrize(
    ("label", "wanted", "error"),
    [
        (
            labels.CONTENT_TYPE_PROTO_FIXED,
            "",
            r"writes application/x-ndjson and text/csv journals only, and protobuf journals given option protobufClass",
        ),
        ("", "", r"content-type is 'not set'.* give option contentType"),
        ("text/plain", "", "writes application/x-ndjson and text/csv journals only"),
        (CSV, labels.CONTENT_TYPE_JSON_LINES, "is 'text/csv', not 'application/x-ndjson'"),
    ],
)
def test_journals_that_cannot_be_written_are_refused(label: str, wanted: str, error: str) -> None:
    with pytest.raises(GazetteJournalError, match=error):
        write_content_type("a/journal", label, wanted)


def test_content_types_written() -> None:
    assert write_content_type("a/journal", CSV, "") == CSV
    assert write_content_type("a/journal", "", CSV) == CSV
    assert write_content_type("a/journal", CSV, CSV) == CSV
    options = {"broker": "localhost:8080", "journal": "a/journal"}
    assert parse_write_options({**options, "contentType": CSV}).content_type == CSV
    with pytest.raises(GazetteOptionError, match="writes are application/x-ndjson or text/csv"):
        parse_write_options({**options, "contentType": labels.CONTENT_TYPE_PROTO_FIXED})


def test_uuid_texts_are_the_json_writers() -> None:
    """The UUID field of a CSV record is the text the JSON writer puts in "UUID"."""
    shape = RowShape(False, False, "a/journal", content_types=(("a/journal", CSV),))
    [(_, lines)] = encode_batch(shape, pa.record_batch({"n": [1, 2]}), PRODUCER, CLOCK)
    texts = [line.split(b",")[0].decode() for line in bytes(lines.data).splitlines()]
    assert [uuid.UUID(t) for t in texts] == [
        build_uuid(PRODUCER, CLOCK + i, Flag.CONTINUE_TXN) for i in range(2)
    ]
