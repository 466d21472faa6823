"""How a write frames messages in each journal: JSON lines or CSV, as the journal's
content-type label says (sans-IO).

Readers decode a journal by its `content-type` label, so a write frames its messages by it too:
`application/x-ndjson` journals get JSON objects (arrow_json.py), `text/csv` journals CSV
records (arrow_csv.py), protobuf journals (`application/x-protobuf-fixed`) messages of the class
option `protobufClass` names (arrow_protobuf.py; without the option they are refused: a
DataFrame's rows carry no message class to encode them with). Option `contentType`, if given,
must agree with the label (or stands for it on a journal without one). Any other content-type
is refused, with the list of those that can be written (`GazetteJournalError`).

A CSV journal's records all have as many fields as the first one a reader sees (CSV framing), so
its ACK records are as wide as the rows they acknowledge: the UUID, then empty fields
(Gazette's `CSVRecord.new_acknowledgement`). The framing of a CSV journal therefore carries the
width of its records, fixed by the write's columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from broker.protocol import labels as gl
from gazette_consumer.message.csv_framing import encode_record
from gazette_consumer.message.json_framing import JSONFraming
from gazette_consumer.message.uuid import Flag, ProducerID, build_uuid
from spark_integration.arrow_csv import csv_lines
from spark_integration.arrow_json import UUID_SUFFIX_BYTES, content_lines, object_bodies
from spark_integration.arrow_protobuf import ack_frame, check_columns, protobuf_frames
from spark_integration.journal_io import GazetteJournalError
from spark_integration.options import WRITABLE_CONTENT_TYPES
from spark_integration.raw_json import UUID_FIELD, JSONRow
from spark_integration.routing import RowShape

WRITABLE: Final = WRITABLE_CONTENT_TYPES
# Where the UUID's text lies in a suffix of arrow_json.uuid_suffixes: `,"UUID":"<uuid>"}\n`.
_UUID_AT: Final = 1 + len(f'"{UUID_FIELD}":"')
_UUID_TEXT_BYTES: Final = 36
assert _UUID_AT + _UUID_TEXT_BYTES + 3 == UUID_SUFFIX_BYTES


def write_content_type(journal: str, label: str, wanted: str, protobuf_class: str = "") -> str:
    """The content-type a write frames `journal`'s messages with: its label `label`, or option
    contentType `wanted` ("" if not given) where it has none; protobuf given option
    protobufClass (`protobuf_class`)."""
    if label and wanted and label != wanted:
        raise GazetteJournalError(
            f"journal {journal!r}: content-type is {label!r}, not {wanted!r} (option"
            " contentType): readers decode it by its label"
        )
    content_type = label or wanted
    if content_type == gl.CONTENT_TYPE_PROTO_FIXED and protobuf_class:
        return content_type
    if content_type not in WRITABLE:
        why = ""
        if content_type == gl.CONTENT_TYPE_PROTO_FIXED:
            why = (
                ", and protobuf journals given option protobufClass (the message class to encode"
                " rows with, 'module:Class')"
            )
        elif not content_type:
            why = " (label the journal, or give option contentType)"
        raise GazetteJournalError(
            f"journal {journal!r}: content-type is {content_type or 'not set'!r}: the gazette"
            f" data source writes {' and '.join(WRITABLE)} journals only{why}"
        )
    return content_type


@dataclass(frozen=True)
class WriteFraming:
    """The framing of one journal's messages: `content_type`; for CSV the number of fields of
    every record (the UUID's and one per message column); for protobuf the message class
    ("module:Class", arrow_protobuf.py)."""

    content_type: str = gl.CONTENT_TYPE_JSON_LINES
    csv_fields: int = 0
    protobuf_class: str = ""

    @classmethod
    def of(
        cls,
        journal: str,
        content_type: str,
        shape: RowShape,
        names: Sequence[str],
        types: pa.Schema | None = None,
    ) -> WriteFraming:
        """The framing of rows of columns `names` (of `types`, if known: protobuf columns
        are checked against the message's fields), shaped by `shape`, in a journal of
        `content_type` (a checked one: `write_content_type`)."""
        if content_type == gl.CONTENT_TYPE_JSON_LINES:
            return cls()
        if shape.content_column:
            raise GazetteJournalError(
                f"journal {journal!r} is {content_type}: its messages are written from the"
                " DataFrame's columns, and a 'content' column (for JSON-lines journals, the"
                " message as JSON) cannot be one of them: rename or drop it"
            )
        if content_type == gl.CONTENT_TYPE_PROTO_FIXED:
            if types is not None:
                check_columns(journal, shape.protobuf_class, types, shape.message_columns(names))
            return cls(content_type, protobuf_class=shape.protobuf_class)
        return cls(content_type, 1 + len(shape.message_columns(names)))

    def ack(self, producer: ProducerID, clock: int) -> bytes:
        """The framed ACK_TXN of `producer` at `clock`."""
        uuid = str(build_uuid(producer, clock, Flag.ACK_TXN))
        if self.content_type == gl.CONTENT_TYPE_CSV:
            return encode_record([uuid, *([""] * (self.csv_fields - 1))])
        if self.content_type == gl.CONTENT_TYPE_PROTO_FIXED:
            return ack_frame(self.protobuf_class, uuid)
        return JSONFraming().marshal(JSONRow({UUID_FIELD: uuid}))

    def lines(self, shape: RowShape, batch: pa.RecordBatch, suffixes: pa.Array) -> pa.Array:
        """The framed messages of `batch`'s rows (string or binary array, each message whole),
        given each row's UUID suffix (arrow_json.uuid_suffixes)."""
        if self.content_type in (gl.CONTENT_TYPE_CSV, gl.CONTENT_TYPE_PROTO_FIXED):
            uuids = pc.utf8_slice_codeunits(suffixes, _UUID_AT, _UUID_AT + _UUID_TEXT_BYTES)
            columns = shape.message_columns(batch.schema.names)
            if self.content_type == gl.CONTENT_TYPE_CSV:
                return csv_lines(batch, columns, uuids)
            return protobuf_frames(batch, columns, self.protobuf_class, uuids)
        if shape.content_column:
            return content_lines(batch.column("content"), suffixes)
        pieces = object_bodies(batch, shape.message_columns(batch.schema.names))
        return pc.binary_join_element_wise(*pieces, suffixes, "")


JSON_LINES: Final = WriteFraming()
