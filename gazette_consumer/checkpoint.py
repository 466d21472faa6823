"""Consumer checkpoints: building, validating, comparing, merging and (de)coding them (sans-IO).

A checkpoint is what a shard commits atomically with its store at the end of each transaction
(docs/architecture.md, Invariants): for every source journal, the offset read through and the
states of the
producers its Sequencer tracks there; and the ACK intents — the acknowledgement messages to
append, per journal, once (and only once) the commit is durable. On recovery the shard resumes
reading from the offsets, seeds its Sequencer with the producer states, and re-writes the
intents, which makes a crash between "committed" and "acknowledged" harmless.

The value type is the wire message `consumer.Checkpoint` itself, so that a checkpoint a Go
consumer stored (in a SQL table or a recovery log) restores here and vice versa. This module
adds what the generated class lacks:

- `build_checkpoint` / `from_sequencer_checkpoint` assemble one from a transaction's parts;
  `flatten_read_through`, `flatten_producer_states`, `to_sequencer_checkpoint` take it apart.
- `validate_checkpoint` checks the invariants a checkpoint must hold; every failure is an
  `InvalidCheckpointError` whose message names the offending field.
- `encode_checkpoint` / `decode_checkpoint` produce and parse Gazette's wire bytes.
- `equivalent` compares two checkpoints as values; `merge` layers a later one over an earlier.

Wire compatibility notes (how Gazette's gogoproto marshaler differs from protobuf's defaults):

- `ProducerEntry.state` is a non-nullable field in Go, so Go always writes it, even empty
  (`12 00`). We set its presence explicitly, so our bytes match Go's for zero states too.
- Go omits an empty `bytes` value inside a map entry; protobuf-python writes `12 00`. Both
  decode to the same empty ACK intent, which is accepted (Go accepts it, and appends nothing
  for it; `write_ack_intents` skips it), so only such a checkpoint's bytes differ from Go's.
- Go decodes checkpoints without validating them. We validate only what would make our
  Sequencer or reader misbehave (see `validate_checkpoint`), so that every checkpoint Go's
  consumer writes, and Gazette's own test fixtures, decode here.
- Go iterates maps in random order, so its bytes are not canonical. We write map entries sorted
  by key and producers sorted by ID: one of the orders Go could have produced, and a
  deterministic one, so that equal checkpoints encode to equal bytes.
"""

from __future__ import annotations

from collections.abc import Mapping

from google.protobuf.message import DecodeError

from broker.protocol import consumer_pb2
from broker.protocol.validate import ValidationError, at
from gazette_consumer.sequencer.types import (
    CLOCK_MAX,
    OFFSET_MAX,
    PRODUCER_ID_BYTES,
    JournalProducer,
    ProducerState,
    SequencerCheckpoint,
)

Checkpoint = consumer_pb2.Checkpoint

__all__ = [
    "Checkpoint",
    "CheckpointDecodeError",
    "CheckpointRegressionError",
    "InvalidCheckpointError",
    "build_checkpoint",
    "decode_checkpoint",
    "encode_checkpoint",
    "equivalent",
    "flatten_producer_states",
    "flatten_read_through",
    "from_sequencer_checkpoint",
    "merge",
    "to_sequencer_checkpoint",
    "validate_checkpoint",
]

_ROOT = "checkpoint"


class InvalidCheckpointError(ValidationError):
    """A checkpoint breaks a rule. The message starts with the path of the offending field, e.g.
    ``checkpoint.sources[ns/a].producers[0].id: must be 6 bytes (got 5)``."""


class CheckpointDecodeError(InvalidCheckpointError):
    """Bytes that do not parse as a `consumer.Checkpoint` at all."""


class CheckpointRegressionError(InvalidCheckpointError):
    """`merge` was asked to move a journal's read-through offset backwards.

    A later transaction reads on from where the earlier one stopped; a smaller offset means the
    two checkpoints are not of the same shard history, and merging them would re-deliver
    messages that were already committed.
    """


# --- Building and taking apart ------------------------------------------------------------------


def build_checkpoint(
    read_through: Mapping[str, int],
    producers: Mapping[JournalProducer, ProducerState],
    ack_intents: Mapping[str, bytes],
) -> Checkpoint:
    """Assemble the checkpoint of a transaction from its parts, and validate it.

    `read_through` maps each source journal to the offset reading resumes from; `producers`
    is the Sequencer's per-(journal, producer) state; `ack_intents` maps each journal the
    transaction published to onto the ACK message to append there after the commit.

    Every producer's journal must have a read-through offset: a producer state only means
    something relative to how far its journal was read (Gazette would fail the same way).
    """
    cp = Checkpoint()
    for journal, offset in read_through.items():
        # Creating the map entry is what records the journal, even for an offset of zero.
        cp.sources[journal].read_through = offset
    for jp in sorted(producers):
        if jp.journal not in cp.sources:
            raise InvalidCheckpointError(
                f"producer {jp.producer.hex()} has no read-through offset for its journal",
                _ROOT,
                f"sources[{jp.journal}]",
            )
        state = producers[jp]
        entry = cp.sources[jp.journal].producers.add()
        entry.id = jp.producer
        entry.state.last_ack = state.last_ack
        entry.state.begin = state.begin
    for journal, intent in ack_intents.items():
        cp.ack_intents[journal] = intent
    _normalize(cp)
    validate_checkpoint(cp)
    return cp


def from_sequencer_checkpoint(
    sequencer: SequencerCheckpoint, ack_intents: Mapping[str, bytes]
) -> Checkpoint:
    """The checkpoint of a transaction whose Sequencer snapshot is `sequencer`."""
    return build_checkpoint(sequencer.read_through, sequencer.producers, ack_intents)


def flatten_read_through(cp: Checkpoint) -> dict[str, int]:
    """Journal → offset to resume reading from."""
    return {journal: source.read_through for journal, source in cp.sources.items()}


def flatten_producer_states(cp: Checkpoint) -> dict[JournalProducer, ProducerState]:
    """(journal, producer) → state, as a Sequencer is seeded with.

    Validates as it goes (via the Sequencer types), so a malformed entry raises rather than
    seeding a Sequencer with garbage; call `validate_checkpoint` first for a path-named error.
    """
    out: dict[JournalProducer, ProducerState] = {}
    for journal, source in cp.sources.items():
        for entry in source.producers:
            jp = JournalProducer(journal, bytes(entry.id))
            out[jp] = ProducerState(last_ack=entry.state.last_ack, begin=entry.state.begin)
    return out


def to_sequencer_checkpoint(cp: Checkpoint) -> SequencerCheckpoint:
    """The Sequencer snapshot stored in `cp` (its ACK intents are not the Sequencer's concern).

    A pending span that begins past its journal's read-through offset (Go accepts such
    checkpoints, e.g. Gazette's own fixtures) is seeded as no pending span: reading resumes
    before it, so every message of the span is read again and begins it afresh, and there is
    nothing before the read-through offset to replay. Seeded as is, a later ACK would ask for a
    replay of an inverted range."""
    validate_checkpoint(cp)
    read_through = flatten_read_through(cp)
    producers = {
        jp: (
            ProducerState(last_ack=state.last_ack)
            if state.begin > read_through[jp.journal]
            else state
        )
        for jp, state in flatten_producer_states(cp).items()
    }
    return SequencerCheckpoint(read_through=read_through, producers=producers)


# --- Validation ---------------------------------------------------------------------------------


def validate_checkpoint(cp: Checkpoint) -> None:
    """Raise InvalidCheckpointError naming the first field of `cp` that breaks a rule.

    Rules, which every checkpoint Go's consumer writes keeps: journals are named (non-empty:
    Go checks no more, and Gazette's own fixtures use names shorter than a journal's may be);
    read-through offsets are in [0, 2^63); producer IDs are 6 bytes and unique within their
    journal; a producer's `begin` is -1 (no pending span) or an offset. ACK intents may be
    empty (see the module docstring).
    """
    try:
        with at(_ROOT):
            for journal in sorted(cp.sources):
                with at(f"sources[{journal}]"):
                    _validate_source(journal, cp.sources[journal])
            for journal in sorted(cp.ack_intents):
                with at(f"ack_intents[{journal}]"):
                    _validate_intent(journal, cp.ack_intents[journal])
    except InvalidCheckpointError:
        raise
    except ValidationError as err:
        # Journal-name rules raise the generic ValidationError; re-type it, keeping its path,
        # so callers can catch checkpoint problems as such.
        raise InvalidCheckpointError(err.rule, *err.context) from None


def _check_journal(journal: str) -> None:
    if not journal:
        raise InvalidCheckpointError("journal name must not be empty")


def _validate_source(journal: str, source: Checkpoint.Source) -> None:
    _check_journal(journal)
    with at("read_through"):
        _check_int_range(source.read_through, 0, OFFSET_MAX)
    seen: set[bytes] = set()
    for index, entry in enumerate(source.producers):
        with at(f"producers[{index}]"):
            producer = bytes(entry.id)
            with at("id"):
                if len(producer) != PRODUCER_ID_BYTES:
                    raise InvalidCheckpointError(
                        f"must be {PRODUCER_ID_BYTES} bytes (got {len(producer)})"
                    )
                if producer in seen:
                    # Two states for one producer: which one a Sequencer would keep is
                    # arbitrary, and either choice can re-deliver or drop messages.
                    raise InvalidCheckpointError(f"duplicate producer {producer.hex()}")
            seen.add(producer)
            with at("state.last_ack"):
                _check_int_range(entry.state.last_ack, 0, CLOCK_MAX)
            with at("state.begin"):
                # -1: no pending span. A begin at or past the read-through offset is accepted
                # as Go accepts it; `to_sequencer_checkpoint` says how it is seeded.
                _check_int_range(entry.state.begin, -1, OFFSET_MAX)


def _validate_intent(journal: str, intent: bytes) -> None:
    _check_journal(journal)


def _check_int_range(value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise InvalidCheckpointError(f"must be in [{low}, {high}] (got {value})")


# --- Wire bytes ---------------------------------------------------------------------------------


def encode_checkpoint(cp: Checkpoint) -> bytes:
    """Validate `cp` and return its wire bytes, canonically ordered (see the module docstring).

    `cp` is not modified.
    """
    validate_checkpoint(cp)
    canonical = Checkpoint()
    canonical.CopyFrom(cp)
    _normalize(canonical)
    return canonical.SerializeToString(deterministic=True)


def decode_checkpoint(data: bytes) -> Checkpoint:
    """Parse and validate wire bytes. Empty bytes are the empty checkpoint (a fresh shard)."""
    cp = Checkpoint()
    try:
        cp.ParseFromString(data)
    except DecodeError as err:
        raise CheckpointDecodeError(
            f"not a consumer.Checkpoint ({len(data)} bytes): {err}", _ROOT
        ) from None
    validate_checkpoint(cp)
    _normalize(cp)
    return cp


def _normalize(cp: Checkpoint) -> None:
    """Sort producers by ID and mark every producer state present (as Go always writes it)."""
    for source in cp.sources.values():
        entries = sorted(source.producers, key=lambda e: bytes(e.id))
        copies = [_copy_entry(e) for e in entries]
        del source.producers[:]
        for entry in copies:
            added = source.producers.add()
            added.CopyFrom(entry)
            added.state.SetInParent()


def _copy_entry(entry: Checkpoint.Source.ProducerEntry) -> Checkpoint.Source.ProducerEntry:
    # A copy detached from its container: deleting container elements invalidates references.
    out = Checkpoint.Source.ProducerEntry()
    out.CopyFrom(entry)
    return out


# --- Comparing and merging ----------------------------------------------------------------------


def equivalent(a: Checkpoint, b: Checkpoint) -> bool:
    """True if `a` and `b` hold the same values, whatever the order of their producer entries.

    Protobuf's `==` compares repeated fields in order, and Go writes producers in map order, so
    two equal checkpoints can compare unequal with `==`.
    """
    return _comparable(a) == _comparable(b)


def _comparable(
    cp: Checkpoint,
) -> tuple[dict[str, tuple[int, frozenset[tuple[bytes, int, int]]]], dict[str, bytes]]:
    sources = {
        journal: (
            source.read_through,
            frozenset((bytes(e.id), e.state.last_ack, e.state.begin) for e in source.producers),
        )
        for journal, source in cp.sources.items()
    }
    return sources, dict(cp.ack_intents)


def merge(earlier: Checkpoint, later: Checkpoint) -> Checkpoint:
    """The checkpoint that results from committing `later` on top of `earlier`.

    Sources are united: a journal `later` names takes `later`'s offset and producer states
    whole (they are a complete snapshot as of that offset); a journal only `earlier` names
    carries over. ACK intents are `later`'s alone: `earlier`'s were written once it committed.
    Raises CheckpointRegressionError if `later` moves a journal's offset backwards.
    """
    validate_checkpoint(earlier)
    validate_checkpoint(later)
    out = Checkpoint()
    out.CopyFrom(earlier)
    out.ClearField("ack_intents")
    for journal in sorted(later.sources):
        source = later.sources[journal]
        if journal in earlier.sources:
            before = earlier.sources[journal].read_through
            if source.read_through < before:
                raise CheckpointRegressionError(
                    f"must not move backwards (from {before} to {source.read_through})",
                    _ROOT,
                    f"sources[{journal}]",
                    "read_through",
                )
        out.sources[journal].CopyFrom(source)
    for journal, intent in later.ack_intents.items():
        out.ack_intents[journal] = intent
    _normalize(out)
    return out
