"""The options of the "gazette" data source, parsed and validated once, on the driver.

Spark hands a data source its options as a case-insensitive map of strings. Every option is
checked here, when the DataFrame is defined (or the query starts), and a bad one raises
`GazetteOptionError` naming the option and what was wrong with it: nothing has been read or
written then. What the executors receive is the parsed form (plain, picklable values).

Every option given must be one the reader or writer uses: an unknown one (a typo such as
`isolaton`, or an option of another source such as Kafka's `maxOffsetsPerTrigger`) is an error
that lists the valid options and suggests the closest. Spark passes option names lowercased;
they are matched case-insensitively.

Reads (batch and streaming):
    broker      host:port (or http://host:port) of any broker of the cluster        (required)
    journals    comma-separated journal names                       (this or selector)
    selector    a label selector, e.g. "app=orders,region in (eu, us)"   (this or journals)
    isolation   read_committed (default) or read_uncommitted
    format      raw (default: the content column holds the JSON line) or json (fields parsed)
    ringSize    the Sequencer's ring entries (default 8192)
    lookbackBytes  how far before a start offset other than 0 a read-committed read looks to
                learn which transactions were open there (default 16 MiB; see range_start.py)
Batch reads only:
    begin, end  JSON {journal: offset}: where a batch read starts (default 0) and ends
                (default: the write head when the read is planned); message boundaries
Streaming reads only:
    startingOffsets   earliest (default), latest, or JSON {journal: offset}
    producerHorizonSeconds   producers idle for longer are forgotten (default 1 day)
    idleWaitMs  how long planning waits for an append when no journal has new data
                (default 500; 0: do not wait)

Writes:
    broker      as above                                                          (required)
    journal     the journal every row goes to (else each row's "journal" column)
Streaming writes also accept the options Spark itself passes on (checkpointLocation,
queryName); a streaming write is identified by its Spark query id (see sink_commit.py).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from broker.client.route_cache import EndpointError, grpc_target
from broker.protocol.selector import parse_selector
from broker.protocol.validate import ValidationError, validate_journal_name

READ_COMMITTED: Final = "read_committed"
READ_UNCOMMITTED: Final = "read_uncommitted"
OFFSET_MAX: Final = (1 << 63) - 1
# The Sequencer's ring: transactions committed within this many messages of their start are
# delivered from memory; longer ones are re-read from the journal.
ring_size_default: Final = 8192
ring_size_max: Final = 1 << 20
# Journals one source reads (one Spark partition each).
journals_max: Final = 10_000
producer_horizon_s_default: Final = 86_400
# Streaming planning with nothing new waits this long for an append before it answers "nothing"
# (stream_read.py). The bound is how long a query's stop can take while it waits.
idle_wait_ms_default: Final = 500
idle_wait_ms_max: Final = 60_000
# A read starting at an offset other than 0 reads up to this much before it to learn which
# transactions were open there (range_start.py).
lookback_bytes_default: Final = 16 << 20
lookback_bytes_max: Final = 1 << 30

_READ_OPTIONS: Final = ("broker", "journals", "selector", "isolation", "format", "ringSize")
_READ_OPTIONS_ALL: Final = (*_READ_OPTIONS, "lookbackBytes")
BATCH_READ_OPTIONS: Final = frozenset((*_READ_OPTIONS_ALL, "begin", "end"))
STREAM_READ_OPTIONS: Final = frozenset(
    (*_READ_OPTIONS_ALL, "startingOffsets", "producerHorizonSeconds", "idleWaitMs")
)
BATCH_WRITE_OPTIONS: Final = frozenset(("broker", "journal"))
# Spark passes the query's checkpointLocation and queryName on to a streaming sink.
STREAM_WRITE_OPTIONS: Final = frozenset((*BATCH_WRITE_OPTIONS, "checkpointLocation", "queryName"))
# Options this data source once had, and what to do instead.
_RETIRED: Final = {
    "sinkid": "is no longer used: a streaming write is identified by its Spark query id, which"
    " Spark keeps in the checkpoint (a restart keeps it, a new checkpoint is a new query): remove"
    " the option",
}
ReadKind = Literal["batch", "stream", "any"]


class GazetteOptionError(ValueError):
    """A missing, unknown or malformed option of the "gazette" data source."""

    def __init__(self, option: str, rule: str) -> None:
        self.option = option
        super().__init__(f"gazette data source: option {option!r}: {rule}")


@dataclass(frozen=True)
class ReadOptions:
    broker: str
    journals: tuple[str, ...]  # Named journals; empty when a selector is given.
    selector: str  # The selector's text ("" when journals are named).
    begin: Mapping[str, int]
    end: Mapping[str, int]
    isolation: str
    json_fields: bool
    starting: str | Mapping[str, int]  # "earliest", "latest", or offsets.
    ring_size: int
    producer_horizon_s: int
    idle_wait_ms: int  # Streaming: bound of the wait for an append when idle; 0: no wait.
    lookback_bytes: int  # Read before a start offset > 0 to learn the open transactions.

    @property
    def committed(self) -> bool:
        return self.isolation == READ_COMMITTED


@dataclass(frozen=True)
class WriteOptions:
    broker: str
    journal: str  # "" when each row names its journal.


def check_known(options: Mapping[str, str], known: Collection[str], what: str) -> None:
    """Refuse an option that is not in `known`, naming the closest known one."""
    by_lower = {name.lower(): name for name in known}
    for given in options:
        lowered = str(given).lower()
        if lowered in by_lower:
            continue
        retired = _RETIRED.get(lowered)
        if retired is not None:
            raise GazetteOptionError(given, retired)
        close = difflib.get_close_matches(lowered, list(by_lower), n=1, cutoff=0.6)
        hint = f" (did you mean {by_lower[close[0]]!r}?)" if close else ""
        raise GazetteOptionError(
            given,
            f"unknown option{hint}; the options of {what} are: {', '.join(sorted(known))}",
        )


def _get(options: Mapping[str, str], name: str) -> str:
    # Spark passes a case-insensitive dict; a plain dict (tests, direct use) may differ in case.
    value = options.get(name)
    if value is None:
        lowered = {k.lower(): v for k, v in options.items()}
        value = lowered.get(name.lower())
    return "" if value is None else str(value).strip()


def parse_broker(options: Mapping[str, str]) -> str:
    broker = _get(options, "broker")
    if not broker:
        raise GazetteOptionError("broker", "is required (host:port of a Gazette broker)")
    try:
        grpc_target(broker)
    except EndpointError as err:
        raise GazetteOptionError("broker", str(err)) from None
    return broker


def _journal_name(option: str, name: str) -> str:
    try:
        validate_journal_name(name)
    except ValidationError as err:
        raise GazetteOptionError(option, f"journal {name!r}: {err}") from None
    return name


def parse_offsets(option: str, text: str) -> dict[str, int]:
    """A JSON object of journal → offset (non-negative integers)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise GazetteOptionError(
            option, f"must be a JSON object of journal offsets: {err}"
        ) from None
    if not isinstance(value, dict):
        raise GazetteOptionError(
            option, f"must be a JSON object of journal offsets (got {type(value).__name__})"
        )
    out: dict[str, int] = {}
    for journal, offset in value.items():
        _journal_name(option, journal)
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= OFFSET_MAX:
            raise GazetteOptionError(
                option, f"offset of {journal}: must be an integer >= 0 (got {offset!r})"
            )
        out[journal] = offset
    return out


def _int_option(options: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    text = _get(options, name)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise GazetteOptionError(name, f"must be an integer (got {text!r})") from None
    if not lo <= value <= hi:
        raise GazetteOptionError(name, f"must be in [{lo}, {hi}] (got {value})")
    return value


def _journal_list(options: Mapping[str, str]) -> tuple[str, ...]:
    names = [n.strip() for n in _get(options, "journals").split(",") if n.strip()]
    if len(names) > journals_max:
        raise GazetteOptionError("journals", f"at most {journals_max} journals (got {len(names)})")
    if len(set(names)) != len(names):
        raise GazetteOptionError("journals", "names a journal more than once")
    return tuple(_journal_name("journals", n) for n in names)


def parse_read_options(options: Mapping[str, str], kind: ReadKind = "any") -> ReadOptions:
    """The options of a batch read, a streaming read, or either (`kind` "any": the schema, which
    Spark asks for before it knows which)."""
    if kind == "batch":
        check_known(options, BATCH_READ_OPTIONS, "a batch read")
    elif kind == "stream":
        check_known(options, STREAM_READ_OPTIONS, "a streaming read")
    else:
        check_known(options, BATCH_READ_OPTIONS | STREAM_READ_OPTIONS, "a read")
    broker = parse_broker(options)
    journals = _journal_list(options)
    selector = _get(options, "selector")
    if journals and selector:
        raise GazetteOptionError("journals", "give either journals or selector, not both")
    if not journals and not selector:
        raise GazetteOptionError(
            "journals", "is required (comma-separated journal names), or option 'selector'"
        )
    if selector:
        try:
            parse_selector(selector)
        except ValidationError as err:
            raise GazetteOptionError("selector", str(err)) from None
    isolation = _get(options, "isolation").lower() or READ_COMMITTED
    if isolation not in (READ_COMMITTED, READ_UNCOMMITTED):
        raise GazetteOptionError(
            "isolation", f"must be {READ_COMMITTED} or {READ_UNCOMMITTED} (got {isolation!r})"
        )
    fmt = _get(options, "format").lower() or "raw"
    if fmt not in ("raw", "json"):
        raise GazetteOptionError("format", f"must be raw or json (got {fmt!r})")
    begin = parse_offsets("begin", _get(options, "begin") or "{}")
    end = parse_offsets("end", _get(options, "end") or "{}")
    for journal, offset in end.items():
        if offset < begin.get(journal, 0):
            raise GazetteOptionError(
                "end", f"offset of {journal}: must be >= its begin {begin.get(journal, 0)}"
            )
    if journals:
        for option, offsets in (("begin", begin), ("end", end)):
            unknown = sorted(set(offsets) - set(journals))
            if unknown:
                raise GazetteOptionError(option, f"names journals not read: {', '.join(unknown)}")
    starting_text = _get(options, "startingOffsets") or "earliest"
    starting: str | dict[str, int]
    if starting_text.lower() in ("earliest", "latest"):
        starting = starting_text.lower()
    else:
        starting = parse_offsets("startingOffsets", starting_text)
    return ReadOptions(
        broker=broker,
        journals=journals,
        selector=selector,
        begin=begin,
        end=end,
        isolation=isolation,
        json_fields=fmt == "json",
        starting=starting,
        ring_size=_int_option(options, "ringSize", ring_size_default, 1, ring_size_max),
        producer_horizon_s=_int_option(
            options, "producerHorizonSeconds", producer_horizon_s_default, 0, 10 * 365 * 86_400
        ),
        idle_wait_ms=_int_option(options, "idleWaitMs", idle_wait_ms_default, 0, idle_wait_ms_max),
        lookback_bytes=_int_option(
            options, "lookbackBytes", lookback_bytes_default, 0, lookback_bytes_max
        ),
    )


def parse_write_options(options: Mapping[str, str], *, streaming: bool = False) -> WriteOptions:
    if streaming:
        check_known(options, STREAM_WRITE_OPTIONS, "a streaming write")
    else:
        check_known(options, BATCH_WRITE_OPTIONS, "a batch write")
    broker = parse_broker(options)
    journal = _get(options, "journal")
    if journal:
        _journal_name("journal", journal)
    return WriteOptions(broker=broker, journal=journal)
