"""How wide a CSV journal's records are, and refusing a write of another width.

A reader of a `text/csv` journal takes the number of fields of the first record it sees as the
number every record must have (Go's csv.Reader, gazette_consumer's CSVDecoder), and fails on
any other: so a write whose rows have another column count than the journal's records would be
accepted, and every later read of the journal would fail. Gazette's CSV framing has no header:
the only thing that says how wide a journal's records are is its records. A write therefore
reads the journal's first record (at the first offset the broker still has) before it appends
anything there, and refuses rows of another width (`GazetteCSVWidthError`, naming the journal
and both column counts). An empty journal takes the width of its first write.

The look costs one read of the journal's first record: on the driver for the journals it knows
(option `journal`, the journals of `keyColumn` routing), in the task, before its first append to
the journal, for journals named by a `journal` column.
"""

from __future__ import annotations

from typing import Final

from broker.client import RetryReader
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message.csv_framing import CSVFraming, CSVSyntaxError, parse_record
from gazette_consumer.message.framing import Frame
from spark_integration.journal_io import GazetteJournalError, write_head

# A first record longer than this is not looked for further: the framing's own bound.
first_record_bytes_max: Final = CSVFraming().message_bytes_max


class GazetteCSVWidthError(GazetteJournalError):
    """Rows of a write have another number of columns than the CSV journal's records."""

    def __init__(self, journal: str, expected: int, given: int, columns: list[str]) -> None:
        self.journal = journal
        self.expected = expected
        self.given = given
        super().__init__(
            f"journal {journal!r}: its CSV records have {expected} columns after the UUID, and"
            f" this write's rows have {given} ({', '.join(columns)}): readers require every"
            " record of a journal to have as many fields as the first, so nothing was written"
            " (write the journal's columns, in its order)"
        )


def check_width(journal: str, existing_fields: int, fields: int, columns: list[str]) -> None:
    """Refuse records of `fields` fields (UUID included) in a journal whose records have
    `existing_fields` (0: no record yet)."""
    if existing_fields and existing_fields != fields:
        raise GazetteCSVWidthError(journal, existing_fields - 1, fields - 1, columns)


async def first_record_fields(client: JournalClient, journal: str) -> int:
    """The number of fields of the journal's first record (0 if it has none)."""
    head = await write_head(client, journal)
    if head == 0:
        return 0
    unpacker = CSVFraming().new_unpacker(journal, 0)
    reader = RetryReader(
        client, pb.ReadRequest(journal=journal, offset=0, end_offset=head, block=True)
    )
    read = 0
    try:
        async for chunk in reader:
            if not chunk.content:
                continue
            # The broker skips ahead past content that retention removed: feed from there.
            offset = max(chunk.offset, unpacker.offset)
            for event in unpacker.feed(chunk.content, offset):
                if isinstance(event, Frame):
                    return _fields(journal, event)
            read += len(chunk.content)
            if read > first_record_bytes_max:
                break
    finally:
        await reader.close()
    raise GazetteJournalError(
        f"journal {journal!r}: no whole CSV record in its first {read} bytes (up to offset"
        f" {unpacker.offset}): its width cannot be known, so nothing was written"
    )


def _fields(journal: str, frame: Frame) -> int:
    try:
        return len(parse_record(frame.data.decode().removesuffix("\n")))
    except (UnicodeDecodeError, CSVSyntaxError) as err:
        raise GazetteJournalError(
            f"journal {journal!r}: its first record (offsets {frame.begin}-{frame.end}) is not"
            f" CSV ({err}): nothing was written"
        ) from None
