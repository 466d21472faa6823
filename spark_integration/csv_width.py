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
the journal, for journals named by a `journal` column. The driver remembers a width it found
(`known_fields`, per broker and journal, in its process): a streaming query builds a writer per
micro-batch (twice: to plan it and to commit it), and the width of a journal with records never
changes, so once known it is not looked up again. Deleting and re-creating a journal can change
it: the remembered width is then only a hint, the fence below still holds, and a write refused
by a remembered width looks again before it raises.

The race. Two writers of different widths (two queries, a batch write and a stream) can both
find a journal empty, and both append: records of two widths, and no reader can read the
journal. (An expected offset cannot guard the first append: AppendRequest.offset 0 means "no
check".) So every append of CSV rows is fenced on the journal's width register
(`WIDTH_REGISTER`, `width_fence`): it requires the register to hold the width it checked, or to
be absent if it found the journal without one, and sets it to the rows' width. The first
writer's append sets it; the other's is refused by the broker (REGISTER_MISMATCH) with nothing
appended, and that writer looks again (`refence`): the same width, it appends under the new
fence; another, it fails with GazetteCSVWidthError naming both. The register is set by rows'
appends only, so an ACK or rollback (appended after the rows they close) needs no fence. A
journal whose registers are all lost (Gazette resets them when etcd loses consensus) matches
any fence (Gazette's rule for an empty register set): the next append sets the register again.
Writers that do not use the register (gazctl, other producers) are not fenced.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final

from broker.client import RetryReader
from broker.client.route_cache import JournalClient
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message.csv_framing import CSVFraming, CSVSyntaxError, parse_record
from gazette_consumer.message.framing import Frame
from spark_integration.journal_io import GazetteJournalError, write_head

# A first record longer than this is not looked for further: the framing's own bound.
first_record_bytes_max: Final = CSVFraming().message_bytes_max
# The register holding the number of fields (the UUID's included) of a CSV journal's records.
WIDTH_REGISTER: Final = "gazette.csv/fields"
# Widths a process remembers (`known_fields`); past this many journals it forgets them all.
known_widths_max: Final = 4096


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


class GazetteCSVWidthRaceError(GazetteCSVWidthError):
    """Another writer fixed the width of a CSV journal that this write found empty, to another
    number of columns than this write's (`refence`)."""

    def __init__(self, journal: str, expected: int, given: int, columns: list[str]) -> None:
        super().__init__(journal, expected, given, columns)
        self.args = (
            f"{self.args[0]} (the journal was empty when this write looked; another write of"
            f" {expected} columns appended first, and fixed its width)",
        )


def check_width(journal: str, existing_fields: int, fields: int, columns: list[str]) -> None:
    """Refuse records of `fields` fields (UUID included) in a journal whose records have
    `existing_fields` (0: no record yet)."""
    if existing_fields and existing_fields != fields:
        raise GazetteCSVWidthError(journal, existing_fields - 1, fields - 1, columns)


@dataclass(frozen=True)
class WidthFence:
    """What an append of CSV records of `fields` fields requires of the journal's width
    register: to hold `expected` fields, or (0) to be absent; it sets the register to `fields`."""

    expected: int
    fields: int

    def include(self) -> list[pb.Label]:
        return [pb.Label(name=WIDTH_REGISTER, value=str(self.expected))] if self.expected else []

    def exclude(self) -> list[pb.Label]:
        return [] if self.expected else [pb.Label(name=WIDTH_REGISTER)]

    def union(self) -> pb.Label:
        return pb.Label(name=WIDTH_REGISTER, value=str(self.fields))


def registered_fields(journal: str, registers: pb.LabelSet) -> int:
    """The width the journal's register holds (0: none)."""
    value = gl.value_of(registers, WIDTH_REGISTER)
    if not value:
        return 0
    if not value.isdigit() or int(value) < 1:
        raise GazetteJournalError(
            f"journal {journal!r}: register {WIDTH_REGISTER}={value!r} is not a number of CSV"
            " fields, as this data source sets it: nothing was written"
        )
    return int(value)


async def refence(
    client: JournalClient,
    journal: str,
    registers: pb.LabelSet,
    fields: int,
    columns: list[str],
) -> WidthFence:
    """The fence of an append of `fields`-wide records whose fence the broker refused, given
    the journal's registers read since: raise GazetteCSVWidthRaceError if another writer
    fixed another width meanwhile."""
    existing = registered_fields(journal, registers)
    if existing:
        if existing != fields:
            raise GazetteCSVWidthRaceError(journal, existing - 1, fields - 1, columns)
        return WidthFence(existing, fields)
    # No register: the journal's records say (registers lost, or written by others).
    check_width(journal, await first_record_fields(client, journal), fields, columns)
    return WidthFence(0, fields)


_known: dict[tuple[str, str], int] = {}


async def known_fields(
    broker: str,
    journal: str,
    probe: Callable[[str], Coroutine[Any, Any, int]],
    *,
    fresh: bool = False,
) -> int:
    """The width of `journal` at `broker`: remembered, or `probe(journal)` (and remembered
    unless 0: an empty journal's width is fixed by its first write)."""
    key = (broker, journal)
    if not fresh and key in _known:
        return _known[key]
    fields = await probe(journal)
    if fields:
        if len(_known) >= known_widths_max:
            _known.clear()
        _known[key] = fields
    else:
        _known.pop(key, None)
    return fields


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
