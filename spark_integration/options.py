"""The options of the "gazette" data source, parsed and validated once, on the driver.

Spark hands a data source its options as a case-insensitive map of strings. Every option is
checked here, when the DataFrame is defined (or the query starts), and a bad one raises
`GazetteOptionError` naming the option and what was wrong with it: nothing has been read or
written then. What the executors receive is the parsed form (plain, picklable values).

Reads:
    broker      host:port (or http://host:port) of any broker of the cluster        (required)
    journals    comma-separated journal names                       (this or selector)
    selector    a label selector, e.g. "app=orders,region in (eu, us)"   (this or journals)
    begin, end  JSON {journal: offset}: where a batch read starts (default 0) and ends
                (default: the write head when the read is planned)
    isolation   read_committed (default) or read_uncommitted
    format      raw (default: the content column holds the JSON line) or json (fields parsed)
    startingOffsets   streaming: earliest (default), latest, or JSON {journal: offset}
    ringSize    the Sequencer's ring entries (default 8192)
    producerHorizonSeconds   streaming: producers idle for longer are forgotten (default 1 day)
    idleWaitMs  streaming: how long planning waits for an append when no journal has new data
                (default 500; 0: do not wait)

Writes:
    broker      as above                                                          (required)
    journal     the journal every row goes to (else each row's "journal" column)
    sinkId      streaming: names the query's commit register (default: from checkpointLocation)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

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

    @property
    def committed(self) -> bool:
        return self.isolation == READ_COMMITTED


@dataclass(frozen=True)
class WriteOptions:
    broker: str
    journal: str  # "" when each row names its journal.
    sink_id: str  # "" when neither sinkId nor checkpointLocation was given.


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


def parse_read_options(options: Mapping[str, str]) -> ReadOptions:
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
    )


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    broker = parse_broker(options)
    journal = _get(options, "journal")
    if journal:
        _journal_name("journal", journal)
    sink_id = _get(options, "sinkId")
    if sink_id:
        if len(sink_id) > 64 or not all(c.isalnum() or c in "-_." for c in sink_id):
            raise GazetteOptionError(
                "sinkId", f"must be 1-64 letters, digits, '-', '_' or '.' (got {sink_id!r})"
            )
    else:
        checkpoint = _get(options, "checkpointLocation")
        if checkpoint:
            # A query's checkpoint location is what makes it the same query across restarts.
            sink_id = hashlib.sha1(checkpoint.encode()).hexdigest()[:16]
    return WriteOptions(broker=broker, journal=journal, sink_id=sink_id)
