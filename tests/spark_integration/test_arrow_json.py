"""Bulk encoding of written rows (arrow_json.py) and their routing (routing.py), without Spark:
each row's message is what the row-by-row encoding gives (rows.py), its UUID the one
`build_uuid` gives, and each key goes where the consumer framework's mappings send it."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid

import msgspec
import pyarrow as pa
import pytest

from broker.protocol import labels as gl
from gazette_consumer.message.framing import MESSAGE_BYTES_MAX_DEFAULT
from gazette_consumer.message.mapping import Partitions, modulo_mapping, rendezvous_choice
from gazette_consumer.message.protobuf_framing import HEADER_BYTES
from gazette_consumer.message.uuid import Flag, build_uuid, get_clock, get_flags, new_producer_id
from spark_integration.arrow_json import EncodedLines, check_sizes, lines_of, uuid_suffixes
from spark_integration.publish import encode_batch
from spark_integration.routing import RowShape, fnv1a32_each
from spark_integration.rows import GazetteRowError, _jsonable

PRODUCER = new_producer_id()
CLOCK = (1 << 59) + 0x1234_5678_9ABC_DEF


def messages(lines: EncodedLines) -> list[dict[str, object]]:
    return [json.loads(line) for line in bytes(lines.data[lines.offsets[0] :]).splitlines()]


def encoded(shape: RowShape, batch: pa.RecordBatch) -> dict[str, list[dict[str, object]]]:
    return {j: messages(lines) for j, lines in encode_batch(shape, batch, PRODUCER, CLOCK)}


def test_uuid_suffixes_are_build_uuid_texts() -> None:
    for flags in (Flag.CONTINUE_TXN, Flag.ACK_TXN, Flag.OUTSIDE_TXN):
        got = uuid_suffixes(PRODUCER, CLOCK, 40, flags).to_pylist()
        assert got == [f',"UUID":"{build_uuid(PRODUCER, CLOCK + i, flags)}"}}\n' for i in range(40)]


def test_columns_encode_as_row_by_row() -> None:
    """Every column type, nulls included: the object rows.py would publish for the row."""
    batch = pa.record_batch(
        {
            "n": pa.array([1, None, -(2**63)], pa.int64()),
            "i": pa.array([7, 8, None], pa.int32()),
            "s": pa.array(['q"uote\\back', None, "tab\tnew\nline é ☃"]),  # By value.
            "quoted": pa.array(['say "hi"', "back\\slash", "plain é"]),  # In bulk.
            "f": pa.array([0.5, float("nan"), 1e300]),
            "ok": pa.array([True, False, None]),
            "d": pa.array([decimal.Decimal("1.50"), None, decimal.Decimal("-2.25")]),
            "day": pa.array([dt.date(2024, 1, 2), None, dt.date(1970, 1, 1)]),
            "ts": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5), None, None]),
            "bin": pa.array([b"\x00\xff", None, b""]),
            "m": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int64())),
            "st": pa.array([{"x": 1, "y": "z"}, None, {"x": None, "y": None}]),
            "l": pa.array([[1, 2], [], None]),
            "empty": pa.nulls(3),
        }
    )
    shape = RowShape(content_column=False, journal_column=False, journal="a/journal")
    got = encoded(shape, batch)["a/journal"]

    python_rows = batch.to_pylist()
    for row in python_rows:  # What a pyspark Row gives for a map: a dict.
        row["m"] = None if row["m"] is None else dict(row["m"])
    expected = [json.loads(msgspec.json.encode(_jsonable(row))) for row in python_rows]
    for i, message in enumerate(got):
        assert message.pop("UUID") == str(build_uuid(PRODUCER, CLOCK + i, Flag.CONTINUE_TXN))
    assert got == expected


def test_content_objects_keep_their_fields_and_take_a_uuid() -> None:
    content = [
        '{"a": 1}',
        "  {}  ",
        '{"b": [1, {"c": "}"}] }\t',
        '{\n  "pretty": true\n}',  # A raw newline: decoded and encoded again.
        '{"UUID": "not this one", "k": 2}',  # A UUID of its own is replaced.
        '{"esc\\u0041pe": "\\n"}',
    ]
    batch = pa.record_batch({"content": content, "other": list(range(len(content)))})
    shape = RowShape(content_column=True, journal_column=False, journal="a/journal")
    got = encoded(shape, batch)["a/journal"]

    assert [{k: v for k, v in m.items() if k != "UUID"} for m in got] == [
        {"a": 1},
        {},
        {"b": [1, {"c": "}"}]},
        {"pretty": True},
        {"k": 2},
        {"escApe": "\n"},
    ]
    clocks = [get_clock(uuid.UUID(str(m["UUID"]))) for m in got]
    assert clocks == [CLOCK + i for i in range(len(content))]
    assert {get_flags(uuid.UUID(str(m["UUID"]))) for m in got} == {Flag.CONTINUE_TXN}


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ("[1, 2]", "'content' is not a JSON object: '[1, 2]'"),
        ('{"a": 1}, {"b": 2}', "'content' is not JSON"),
        ('{"a": 1} {"b": 2}', "'content' is not JSON"),
        ('{"a": tru}', "'content' is not JSON"),
        ('"{}"', "not a JSON object"),
        (None, "'content' column is null"),
    ],
)
def test_bad_content_is_refused_naming_it(bad: str | None, error: str) -> None:
    batch = pa.record_batch({"content": pa.array(['{"ok": 1}', bad], pa.string())})
    shape = RowShape(content_column=True, journal_column=False, journal="a/journal")
    with pytest.raises(GazetteRowError, match=error.replace("[", r"\[").replace("]", r"\]")):
        encode_batch(shape, batch, PRODUCER, CLOCK)


def test_journal_column_splits_rows_and_is_left_out() -> None:
    batch = pa.record_batch({"journal": ["j/one", "j/two", "j/one"], "v": [1, 2, 3]})
    shape = RowShape(content_column=False, journal_column=True, journal="")
    got = encoded(shape, batch)
    assert {j: [m["v"] for m in ms] for j, ms in got.items()} == {"j/one": [1, 3], "j/two": [2]}
    # Clocks follow row order, whichever journal a row goes to.
    assert [get_clock(uuid.UUID(str(m["UUID"]))) for m in got["j/one"]] == [CLOCK, CLOCK + 2]
    assert all("journal" not in m for ms in got.values() for m in ms)

    for bad in (None, ""):
        with pytest.raises(GazetteRowError, match="'journal' column is null or empty"):
            encode_batch(
                shape, pa.record_batch({"journal": ["j/one", bad], "v": [1, 2]}), PRODUCER, CLOCK
            )


JOURNALS = ("keyed/aa", "keyed/bb", "keyed/cc", "keyed/dd")


@pytest.mark.parametrize("mapping", ["modulo", "rendezvous"])
def test_keys_go_where_the_mappings_send_them(mapping: str) -> None:
    keys = [f"customer-{i}" for i in range(300)] + ["", "é☃", "x" * 300]
    batch = pa.record_batch({"key": keys, "v": list(range(len(keys)))})
    shape = RowShape(False, False, "", key_column="key", key_journals=JOURNALS, mapping=mapping)
    got = {str(m["key"]): j for j, ms in encoded(shape, batch).items() for m in ms}

    partitions = Partitions.of_journals(JOURNALS, "application/x-ndjson")
    if mapping == "modulo":
        choose = modulo_mapping(lambda key: key, partitions)
        assert got == {k: choose(k).journal for k in keys}
    else:
        assert got == {k: rendezvous_choice(k.encode(), partitions).journal for k in keys}
    assert set(got.values()) == set(JOURNALS)  # 303 keys spread over all four.


def test_integer_keys_hash_as_their_text_and_nulls_are_refused() -> None:
    shape = RowShape(False, False, "", key_column="id", key_journals=JOURNALS)
    batch = pa.record_batch({"id": pa.array([5, -12, 2**40], pa.int64())})
    got = {int(str(m["id"])): j for j, ms in encoded(shape, batch).items() for m in ms}
    choose = modulo_mapping(lambda key: key, Partitions.of_journals(JOURNALS, ""))
    assert got == {k: choose(str(k)).journal for k in (5, -12, 2**40)}

    with pytest.raises(GazetteRowError, match="key column 'id' is null"):
        encode_batch(shape, pa.record_batch({"id": pa.array([1, None])}), PRODUCER, CLOCK)


def test_fnv1a32_each_is_go_fnv() -> None:
    from gazette_consumer.message.mapping import fnv1a32

    keys = [b"", b"a", b"foobar", bytes(range(256)), b"k" * 1000]
    assert fnv1a32_each(pa.array(keys, pa.binary())).tolist() == [fnv1a32(k) for k in keys]


def test_pieces_cut_at_message_boundaries_within_the_bound() -> None:
    lines = lines_of(pa.array([f"{'x' * (i % 7)}\n" for i in range(100)]))
    for bound in (1, 5, 16, 1000):
        pieces = lines.pieces(bound)
        assert b"".join(bytes(p) for p in pieces) == bytes(lines.data)
        for piece in pieces:
            assert bytes(piece).endswith(b"\n")
            assert len(piece) <= bound or bytes(piece).count(b"\n") == 1


def test_rows_given_directly_encode_as_batches() -> None:
    from spark_integration.publish import batches_of_rows

    rows = [{"content": json.dumps({"k": i})} for i in range(10_000)]
    batches = list(batches_of_rows(rows))
    assert sum(b.num_rows for b in batches) == 10_000
    assert len(batches) == 3  # row_batch_rows_max rows at a time.

    with pytest.raises(GazetteRowError, match="one type each"):
        list(batches_of_rows([{"v": 1}, {"v": "text"}]))


def test_shape_routing_by_key_keeps_the_key_in_the_message() -> None:
    shape = RowShape(False, False, "", key_column="key", key_journals=JOURNALS[:1])
    got = encoded(shape, pa.record_batch({"key": ["a"], "v": [1]}))
    assert [{k: v for k, v in m.items() if k != "UUID"} for m in got[JOURNALS[0]]] == [
        {"key": "a", "v": 1}
    ]


PROTO_JOURNAL = "a/protobuf"


def _protobuf_batch(text: str) -> tuple[RowShape, pa.RecordBatch]:
    from tests.spark_integration.proto_testkit import PROTOBUF_CLASS

    shape = RowShape(
        False,
        False,
        PROTO_JOURNAL,
        content_types=((PROTO_JOURNAL, gl.CONTENT_TYPE_PROTO_FIXED),),
        protobuf_class=PROTOBUF_CLASS,
    )
    return shape, pa.record_batch({"text": [text], "n": [1]})


def test_a_too_large_protobuf_message_is_refused_naming_its_framing() -> None:
    shape, batch = _protobuf_batch("x" * MESSAGE_BYTES_MAX_DEFAULT)
    with pytest.raises(GazetteRowError, match=r"above the \d+ bytes protobuf readers accept"):
        encode_batch(shape, batch, PRODUCER, CLOCK)


def test_sizes_are_checked_as_each_framing_s_readers_measure_them() -> None:
    # A protobuf frame is an 8-byte header and the message, which readers bound; a JSON line's
    # or CSV record's bound excludes its newline.
    shape, batch = _protobuf_batch("some text")
    ((_, frames),) = encode_batch(shape, batch, PRODUCER, CLOCK)
    payload = len(frames.data) - HEADER_BYTES
    check_sizes(frames, gl.CONTENT_TYPE_PROTO_FIXED, bytes_max=payload)
    with pytest.raises(GazetteRowError, match=f"message of {payload} bytes, above the"):
        check_sizes(frames, gl.CONTENT_TYPE_PROTO_FIXED, bytes_max=payload - 1)

    lines = lines_of(pa.array(['{"a":1}\n'], pa.string()))
    check_sizes(lines, gl.CONTENT_TYPE_JSON_LINES, bytes_max=7)
    with pytest.raises(GazetteRowError, match="7 bytes, above the 6 bytes JSON-lines readers"):
        check_sizes(lines, gl.CONTENT_TYPE_JSON_LINES, bytes_max=6)
    with pytest.raises(GazetteRowError, match="7 bytes, above the 6 bytes CSV readers"):
        check_sizes(lines, gl.CONTENT_TYPE_CSV, bytes_max=6)
