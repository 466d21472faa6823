"""The options of reads (batch and streaming), parsed and validated once, on the driver.

See options.py for what is common (unknown options are errors, names match case-insensitively).

Where to read:
    broker      host:port (or http://host:port) of any broker of the cluster
    store       a fragment store URL (file:///..., s3://bucket/prefix/): list the journals'
                fragments from the store itself and read them from it, with no broker (then
                only persisted content is read; journals must be named)
                                                                  (broker, store, or both)
    journals    comma-separated journal names                       (this or selector)
    selector    a label selector, e.g. "app=orders,region in (eu, us)"   (this or journals;
                needs a broker)
What to read:
    isolation   read_committed (default) or read_uncommitted
    format      raw (default: the content column holds the message) or json (fields parsed)
    contentType the journals' framing: application/x-ndjson, text/csv or
                application/x-protobuf-fixed (default: each journal's content-type label;
                JSON lines in store mode)
    protobufClass  for protobuf journals, "module:Class" of the messages (a protobuf class)
    includeLabels  true: the default schema has a `labels` map column (default false)
    failOnDataLoss true (default): content that cannot be read (removed, a missing or corrupt
                fragment file) fails the read; false: it is skipped with a warning (sources.py)
    ringSize    the Sequencer's ring entries (default 8192)
    lookbackBytes  how far before a start offset other than the journal's first a
                read-committed read looks to learn which transactions were open there
                (default 16 MiB; see range_start.py)
    filterPushdown  true: filters on `journal` and `labels` prune journals (Spark needs
                spark.sql.python.filterPushdown.enabled=true, and refuses a reader that pushes
                filters without it; default false)
Batch reads only:
    startingOffsets / endingOffsets   earliest / latest (defaults), or JSON {journal: offset}
                with -2 for earliest and -1 for latest; message boundaries. `begin` and `end`
                are the same as JSON offsets (the names of earlier versions)
    startingTimestamp / endingTimestamp   milliseconds since the Unix epoch: each journal from
                (or up to) its first message whose UUID clock is at or after it
    maxPartitionBytes  partitions are cut at fragment boundaries into ranges of about this
                size (default 128 MiB)
    minPartitions   cut finer if needed to make at least this many partitions (default: the
                planning host's CPU cores, with partitions of 16 MiB at least)
Streaming reads only:
    startingOffsets   earliest (default), latest, or JSON {journal: offset}, -2 / -1 as above
    startingTimestamp as above
    maxBytesPerTrigger / maxMessagesPerTrigger  at most this much per micro-batch, across
                all journals (messages counted as framed: ACKs and duplicates too)
    producerHorizonSeconds   producers idle for longer are forgotten (default 1 day)
    idleWaitMs  how long planning waits for an append when no journal has new data
                (default 500; 0: do not wait)
    storeGapGraceSeconds   how long a gap between fragments may wait to be filled (a
                retried upload) before it is read as lost (default 900): streaming with
                `store` and no broker, by the age of the fragment after it; through a broker
                (batch and streaming), while the broker serves none of it (at least 1 s)
    maxPartitionBytes, minPartitions   as above, for micro-batches
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from broker.fragment.stores.base import StoreURL, StoreURLError
from broker.protocol import labels
from spark_integration.options import (
    EARLIEST,
    LATEST,
    OFFSET_MAX,
    GazetteOptionError,
    bool_option,
    check_known,
    content_type_option,
    get,
    int_option,
    journal_list,
    parse_broker,
    parse_offsets,
    parse_selector_option,
)

READ_COMMITTED: Final = "read_committed"
READ_UNCOMMITTED: Final = "read_uncommitted"
# The Sequencer's ring: transactions committed within this many messages of their start are
# delivered from memory; longer ones are re-read from the journal.
ring_size_default: Final = 8192
ring_size_max: Final = 1 << 20
producer_horizon_s_default: Final = 86_400
# Streaming planning with nothing new waits this long for an append before it answers "nothing"
# (stream_read.py). The bound is how long a query's stop can take while it waits.
idle_wait_ms_default: Final = 500
idle_wait_ms_max: Final = 60_000
# A store-only stream stops at a gap between persisted fragments (an upload being retried)
# until the fragment after it is this old; then the gap is lost content. Brokers retry an
# upload round every 30 s doubling to 300 s (broker/fragment/persister.py): three rounds fit.
store_gap_grace_s_default: Final = 900
store_gap_grace_s_max: Final = 7 * 86_400
# A read starting at an offset other than 0 reads up to this much before it to learn which
# transactions were open there (range_start.py).
lookback_bytes_default: Final = 16 << 20
lookback_bytes_max: Final = 1 << 30
# Partitions of a read (fragment_plan.py): Spark's own default for files.
max_partition_bytes_default: Final = 128 << 20
max_partition_bytes_min: Final = 1 << 10
min_partitions_max: Final = 100_000
# Timestamps are milliseconds since the Unix epoch, between these years' starts (1970, 3000).
timestamp_ms_max: Final = 32_503_680_000_000

_READ_OPTIONS: Final = (
    "broker",
    "store",
    "journals",
    "selector",
    "isolation",
    "format",
    "contentType",
    "protobufClass",
    "includeLabels",
    "failOnDataLoss",
    "ringSize",
    "lookbackBytes",
    "filterPushdown",
    "startingOffsets",
    "startingTimestamp",
    "maxPartitionBytes",
    "minPartitions",
    "storeGapGraceSeconds",
)
BATCH_READ_OPTIONS: Final = frozenset(
    (*_READ_OPTIONS, "endingOffsets", "endingTimestamp", "begin", "end")
)
STREAM_READ_OPTIONS: Final = frozenset(
    (
        *_READ_OPTIONS,
        "producerHorizonSeconds",
        "idleWaitMs",
        "maxBytesPerTrigger",
        "maxMessagesPerTrigger",
    )
)
ReadKind = Literal["batch", "stream", "any"]
# Where a read starts or ends: "earliest", "latest", offsets per journal (EARLIEST / LATEST
# allowed), or a timestamp (Unix milliseconds).
Position = str | Mapping[str, int] | int


@dataclass(frozen=True)
class ReadOptions:
    broker: str  # "" in store mode.
    store: str  # "" in broker mode.
    journals: tuple[str, ...]  # Named journals; empty when a selector is given.
    selector: str  # The selector's text ("" when journals are named).
    starting: Position
    ending: Position
    starting_option: str  # The option `starting` came from (for errors).
    ending_option: str
    isolation: str
    json_fields: bool
    content_type: str  # "" : each journal's label.
    protobuf_class: str
    include_labels: bool
    fail_on_data_loss: bool
    ring_size: int
    producer_horizon_s: int
    idle_wait_ms: int  # Streaming: bound of the wait for an append when idle; 0: no wait.
    store_gap_grace_s: int  # How long a gap may wait to be filled (the docstring).
    lookback_bytes: int  # Read before a start offset to learn the open transactions.
    filter_pushdown: bool
    max_partition_bytes: int
    min_partitions: int
    max_bytes_per_trigger: int  # 0: no limit.
    max_messages_per_trigger: int  # 0: no limit.

    @property
    def committed(self) -> bool:
        return self.isolation == READ_COMMITTED


def _position(
    options: Mapping[str, str], offsets_name: str, alias: str, timestamp_name: str, default: str
) -> tuple[Position, str]:
    """Where a read starts or ends, and the option that said so."""
    given = [n for n in (offsets_name, alias, timestamp_name) if get(options, n)]
    if len(given) > 1:
        raise GazetteOptionError(given[1], f"give one of {', '.join(given)}, not several")
    if get(options, timestamp_name):
        return int_option(options, timestamp_name, 0, 0, timestamp_ms_max), timestamp_name
    if alias and get(options, alias):
        return parse_offsets(alias, get(options, alias)), alias
    text = get(options, offsets_name)
    if not text:
        return default, offsets_name
    if text.lower() in ("earliest", "latest"):
        return text.lower(), offsets_name
    return parse_offsets(offsets_name, text, special=True), offsets_name


def _check_store(store: str) -> None:
    try:
        StoreURL.parse(store)
    except StoreURLError as err:
        raise GazetteOptionError("store", str(err)) from None


def _check_protobuf_class(text: str) -> None:
    module, _, name = text.partition(":")
    if not module or not name:
        raise GazetteOptionError("protobufClass", f"must be module:Class (got {text!r})")


def parse_read_options(options: Mapping[str, str], kind: ReadKind = "any") -> ReadOptions:
    """The options of a batch read, a streaming read, or either (`kind` "any": the schema, which
    Spark asks for before it knows which)."""
    if kind == "batch":
        check_known(options, BATCH_READ_OPTIONS, "a batch read")
    elif kind == "stream":
        check_known(options, STREAM_READ_OPTIONS, "a streaming read")
    else:
        check_known(options, BATCH_READ_OPTIONS | STREAM_READ_OPTIONS, "a read")
    store = get(options, "store")
    if store:
        _check_store(store)
    broker = parse_broker(options) if get(options, "broker") or not store else ""
    journals = journal_list(options)
    if journals and get(options, "selector"):
        raise GazetteOptionError("journals", "give either journals or selector, not both")
    selector = parse_selector_option(options)
    if not journals and not selector:
        raise GazetteOptionError(
            "journals", "is required (comma-separated journal names), or option 'selector'"
        )
    if selector and not broker:
        raise GazetteOptionError("selector", "needs a broker (option 'broker') to list journals")
    isolation = get(options, "isolation").lower() or READ_COMMITTED
    if isolation not in (READ_COMMITTED, READ_UNCOMMITTED):
        raise GazetteOptionError(
            "isolation", f"must be {READ_COMMITTED} or {READ_UNCOMMITTED} (got {isolation!r})"
        )
    fmt = get(options, "format").lower() or "raw"
    if fmt not in ("raw", "json"):
        raise GazetteOptionError("format", f"must be raw or json (got {fmt!r})")
    content_type = content_type_option(options)
    protobuf_class = get(options, "protobufClass")
    if protobuf_class:
        _check_protobuf_class(protobuf_class)
    elif content_type == labels.CONTENT_TYPE_PROTO_FIXED:
        raise GazetteOptionError("protobufClass", "is required to read protobuf journals")
    starting, starting_option = _position(
        options, "startingOffsets", "begin", "startingTimestamp", "earliest"
    )
    ending, ending_option = _position(options, "endingOffsets", "end", "endingTimestamp", "latest")
    for name, position in ((starting_option, starting), (ending_option, ending)):
        if isinstance(position, Mapping) and journals:
            unknown = sorted(set(position) - set(journals))
            if unknown:
                raise GazetteOptionError(name, f"names journals not read: {', '.join(unknown)}")
    if isinstance(starting, Mapping) and isinstance(ending, Mapping):
        for journal, offset in ending.items():
            begin = starting.get(journal, 0)
            if offset >= 0 and begin >= 0 and offset < begin:
                raise GazetteOptionError(
                    ending_option, f"offset of {journal}: must be >= its begin {begin}"
                )
    if ending == "earliest" or (isinstance(ending, Mapping) and EARLIEST in ending.values()):
        raise GazetteOptionError("endingOffsets", "cannot be earliest")
    if starting == "latest" and kind == "batch":
        raise GazetteOptionError("startingOffsets", "a batch read cannot start at latest")
    if isinstance(starting, Mapping) and kind == "batch" and LATEST in starting.values():
        raise GazetteOptionError("startingOffsets", "a batch read cannot start at latest (-1)")
    return ReadOptions(
        broker=broker,
        store=store,
        journals=journals,
        selector=selector,
        starting=starting,
        ending=ending,
        starting_option=starting_option,
        ending_option=ending_option,
        isolation=isolation,
        json_fields=fmt == "json",
        content_type=content_type,
        protobuf_class=protobuf_class,
        include_labels=bool_option(options, "includeLabels", False),
        fail_on_data_loss=bool_option(options, "failOnDataLoss", True),
        ring_size=int_option(options, "ringSize", ring_size_default, 1, ring_size_max),
        producer_horizon_s=int_option(
            options, "producerHorizonSeconds", producer_horizon_s_default, 0, 10 * 365 * 86_400
        ),
        idle_wait_ms=int_option(options, "idleWaitMs", idle_wait_ms_default, 0, idle_wait_ms_max),
        store_gap_grace_s=int_option(
            options, "storeGapGraceSeconds", store_gap_grace_s_default, 0, store_gap_grace_s_max
        ),
        lookback_bytes=int_option(
            options, "lookbackBytes", lookback_bytes_default, 0, lookback_bytes_max
        ),
        filter_pushdown=bool_option(options, "filterPushdown", False),
        max_partition_bytes=int_option(
            options,
            "maxPartitionBytes",
            max_partition_bytes_default,
            max_partition_bytes_min,
            OFFSET_MAX,
        ),
        # 0: not given (fragment_plan.target_bytes: one partition per core).
        min_partitions=int_option(options, "minPartitions", 0, 1, min_partitions_max),
        max_bytes_per_trigger=int_option(options, "maxBytesPerTrigger", 0, 1, OFFSET_MAX),
        max_messages_per_trigger=int_option(options, "maxMessagesPerTrigger", 0, 1, OFFSET_MAX),
    )
