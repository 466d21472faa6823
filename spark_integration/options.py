"""The options of the "gazette" data source: validation common to reads and writes, and the
options of writes (read_options.py has the reads').

Spark hands a data source its options as a case-insensitive map of strings. Every option is
checked when the DataFrame is defined (or the query starts), on the driver, and a bad one raises
`GazetteOptionError` naming the option and what was wrong with it: nothing has been read or
written then. What the executors receive is the parsed form (plain, picklable values).

Every option given must be one the reader or writer uses: an unknown one (a typo such as
`isolaton`, or an option of another source such as Kafka's `maxOffsetsPerTrigger`) is an error
that lists the valid options and suggests the closest. Spark passes option names lowercased;
they are matched case-insensitively.

Writes:
    broker      host:port (or http://host:port) of any broker of the cluster        (required)
    journal     the journal every row goes to; else each row's "journal" column, or:
    selector    the journals rows are routed to by `keyColumn` (with `mapping`)
    keyColumn   the column whose value routes a row (strings, binary, or integers as their
                decimal text: routing.py)
    mapping     modulo (default: Gazette's ModuloMapping, FNV-1a of the key modulo the
                journals sorted by name) or rendezvous
    contentType application/x-ndjson, text/csv or application/x-protobuf-fixed; each
                journal's content-type label must agree (or is taken as this, if it has
                none). Messages are framed as the label says (write_framing.py)
    protobufClass the message class ("module:Class") rows of protobuf journals are encoded
                to (arrow_protobuf.py); protobuf journals are refused without it
    appendAttempts  how many times a task tries each append of its rows that a broker
                refuses as unavailable (a full disk, a broker restarting, no primary yet),
                after back-offs doubling from 0.05 s up to 5 s, before the task fails and
                Spark retries it (its rollbacks too): 1 to 100, default 10 (about 16 s
                each). As Kafka's sink takes the producer's retries: lower it to hand
                failures to Spark's own task retry sooner
Streaming writes also take:
    replayCheck rows (default) or none: whether a micro-batch a new run of the query re-runs
                must hold, in each journal, as many rows as the run that committed it did
                (sink_rows.py). With none, a re-run planned otherwise (a checkpoint restored
                from an older copy; a query that is not deterministic) loses or repeats rows
                without an error
and the options Spark itself passes on (checkpointLocation, queryName); a streaming write is
identified by its Spark query id (see sink_commit.py).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final

from broker.client.route_cache import EndpointError, grpc_target
from broker.protocol import labels
from broker.protocol.selector import parse_selector
from broker.protocol.validate import ValidationError, validate_journal_name

OFFSET_MAX: Final = (1 << 63) - 1
# Journals one source reads or writes.
journals_max: Final = 10_000
MAPPINGS: Final = ("modulo", "rendezvous")
# What writes frame messages as (write_framing.py), each journal as its content-type label says.
WRITABLE_CONTENT_TYPES: Final = (labels.CONTENT_TYPE_JSON_LINES, labels.CONTENT_TYPE_CSV)
CONTENT_TYPES: Final = (
    labels.CONTENT_TYPE_JSON_LINES,
    labels.CONTENT_TYPE_CSV,
    labels.CONTENT_TYPE_PROTO_FIXED,
)
BATCH_WRITE_OPTIONS: Final = frozenset(
    (
        "broker",
        "journal",
        "selector",
        "keyColumn",
        "mapping",
        "contentType",
        "protobufClass",
        "appendAttempts",
    )
)
# Option appendAttempts: its default is the append client's own (broker.client.appender's
# attempts_max_default, which a test checks it equals: not imported, as read tasks must not
# load the append client), and its bound.
append_attempts_default: Final = 10
append_attempts_max: Final = 100
# Spark passes the query's checkpointLocation and queryName on to a streaming sink.
STREAM_WRITE_OPTIONS: Final = frozenset(
    (*BATCH_WRITE_OPTIONS, "replayCheck", "checkpointLocation", "queryName")
)
REPLAY_CHECKS: Final = ("rows", "none")
# Options this data source once had, and what to do instead.
_RETIRED: Final = {
    "sinkid": "is no longer used: a streaming write is identified by its Spark query id, which"
    " Spark keeps in the checkpoint (a restart keeps it, a new checkpoint is a new query): remove"
    " the option",
}


class GazetteOptionError(ValueError):
    """A missing, unknown or malformed option of the "gazette" data source."""

    def __init__(self, option: str, rule: str) -> None:
        self.option = option
        super().__init__(f"gazette data source: option {option!r}: {rule}")


@dataclass(frozen=True)
class WriteOptions:
    broker: str
    journal: str  # "" when rows name their journal, or are routed by key.
    selector: str  # Routing by `key_column` over the journals it matches.
    key_column: str
    mapping: str
    content_type: str  # "" : each journal's label decides.
    protobuf_class: str = ""  # "module:Class" of protobuf journals' messages.
    append_attempts: int = append_attempts_default  # Tries of each append of a task's rows.
    replay_check: bool = True  # Option replayCheck (streaming writes): rows, or none.


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


def get(options: Mapping[str, str], name: str) -> str:
    # Spark passes a case-insensitive dict; a plain dict (tests, direct use) may differ in case.
    value = options.get(name)
    if value is None:
        lowered = {k.lower(): v for k, v in options.items()}
        value = lowered.get(name.lower())
    return "" if value is None else str(value).strip()


def parse_broker(options: Mapping[str, str]) -> str:
    broker = get(options, "broker")
    if not broker:
        raise GazetteOptionError("broker", "is required (host:port of a Gazette broker)")
    try:
        grpc_target(broker)
    except EndpointError as err:
        raise GazetteOptionError("broker", str(err)) from None
    return broker


def journal_name(option: str, name: str) -> str:
    try:
        validate_journal_name(name)
    except ValidationError as err:
        raise GazetteOptionError(option, f"journal {name!r}: {err}") from None
    return name


EARLIEST: Final = -2  # In a JSON of offsets, Kafka's way: the journal's first offset.
LATEST: Final = -1  # Its write head.


def parse_offsets(option: str, text: str, *, special: bool = False) -> dict[str, int]:
    """A JSON object of journal -> offset (an integer >= 0; or, if `special`, -2 for the
    journal's earliest offset and -1 for its latest, as Kafka's source takes them)."""
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
    low = EARLIEST if special else 0
    out: dict[str, int] = {}
    for journal, offset in value.items():
        journal_name(option, journal)
        if (
            isinstance(offset, bool)
            or not isinstance(offset, int)
            or not low <= offset <= OFFSET_MAX
        ):
            rule = "an integer >= 0" + (", or -2 (earliest) or -1 (latest)" if special else "")
            raise GazetteOptionError(
                option, f"offset of {journal}: must be {rule} (got {offset!r})"
            )
        out[journal] = offset
    return out


def int_option(options: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    text = get(options, name)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise GazetteOptionError(name, f"must be an integer (got {text!r})") from None
    if not lo <= value <= hi:
        raise GazetteOptionError(name, f"must be in [{lo}, {hi}] (got {value})")
    return value


def journal_list(options: Mapping[str, str]) -> tuple[str, ...]:
    names = [n.strip() for n in get(options, "journals").split(",") if n.strip()]
    if len(names) > journals_max:
        raise GazetteOptionError("journals", f"at most {journals_max} journals (got {len(names)})")
    if len(set(names)) != len(names):
        raise GazetteOptionError("journals", "names a journal more than once")
    return tuple(journal_name("journals", n) for n in names)


def bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = get(options, name).lower()
    if not text:
        return default
    if text not in ("true", "false"):
        raise GazetteOptionError(name, f"must be true or false (got {text!r})")
    return text == "true"


def parse_selector_option(options: Mapping[str, str]) -> str:
    selector = get(options, "selector")
    if selector:
        try:
            parse_selector(selector)
        except ValidationError as err:
            raise GazetteOptionError("selector", str(err)) from None
    return selector


def content_type_option(options: Mapping[str, str]) -> str:
    content_type = get(options, "contentType")
    if content_type and content_type not in CONTENT_TYPES:
        raise GazetteOptionError(
            "contentType", f"must be one of {', '.join(CONTENT_TYPES)} (got {content_type!r})"
        )
    return content_type


def parse_write_options(options: Mapping[str, str], *, streaming: bool = False) -> WriteOptions:
    known, what = (
        (STREAM_WRITE_OPTIONS, "a streaming write")
        if streaming
        else (BATCH_WRITE_OPTIONS, "a batch write")
    )
    if any(str(name).lower() == "path" for name in options):
        # save(path) / start(path), as file sinks take: the journal is named otherwise.
        raise GazetteOptionError(
            "path",
            "a write to journals takes no path: name the journal with option 'journal' (or"
            " give rows a 'journal' column, or route them by keyColumn with selector); the"
            f" options of {what} are: {', '.join(sorted(known))}",
        )
    check_known(options, known, what)
    broker = parse_broker(options)
    journal = get(options, "journal")
    if journal:
        journal_name("journal", journal)
    selector = parse_selector_option(options)
    key_column = get(options, "keyColumn")
    if journal and (selector or key_column):
        raise GazetteOptionError(
            "journal", "give either journal, or selector and keyColumn, not both"
        )
    if bool(selector) != bool(key_column):
        missing = "keyColumn" if selector else "selector"
        raise GazetteOptionError(
            missing, "rows routed by key need both selector (the journals) and keyColumn"
        )
    mapping = get(options, "mapping").lower() or MAPPINGS[0]
    if mapping not in MAPPINGS:
        raise GazetteOptionError(
            "mapping", f"must be one of {', '.join(MAPPINGS)} (got {mapping!r})"
        )
    content_type = content_type_option(options)
    protobuf_class = get(options, "protobufClass")
    proto = content_type == labels.CONTENT_TYPE_PROTO_FIXED
    if proto and not protobuf_class:
        raise GazetteOptionError(
            "contentType",
            f"writes are {' or '.join(WRITABLE_CONTENT_TYPES)} (got {content_type!r}: protobuf"
            " journals are written given option protobufClass, the message class to encode"
            " rows with)",
        )
    if protobuf_class and content_type and not proto:
        raise GazetteOptionError(
            "protobufClass", f"is for protobuf journals, and option contentType is {content_type}"
        )
    replay_check = get(options, "replayCheck").lower() or REPLAY_CHECKS[0]
    if replay_check not in REPLAY_CHECKS:
        raise GazetteOptionError(
            "replayCheck", f"must be one of {', '.join(REPLAY_CHECKS)} (got {replay_check!r})"
        )
    return WriteOptions(
        broker=broker,
        journal=journal,
        selector=selector,
        key_column=key_column,
        mapping=mapping,
        content_type=content_type,
        protobuf_class=protobuf_class,
        append_attempts=int_option(
            options, "appendAttempts", append_attempts_default, 1, append_attempts_max
        ),
        replay_check=replay_check == "rows",
    )
