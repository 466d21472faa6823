"""The vocabulary of the Spool (spool.py): its errors, the outcome of each request, its phases
and their legal transitions, the values it hands to observers, and the checks of a proposal.

Kept apart from the Spool itself so that the state machine's module holds the rule book, and
readers of fragments (the index, the persister, the read path) can import these values without
the machine.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from broker.fragment.naming import OFFSET_MAX
from broker.fragment.spool_file import SpoolFile
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import ValidationError, at, validate_fragment, validate_label_set

if TYPE_CHECKING:
    from _hashlib import HASH

ZERO_SUM: Final = pb.SHA1Sum()


# --- Errors -----------------------------------------------------------------------------------


class SpoolRequestError(ValidationError):
    """A ReplicateRequest that no correct primary sends to this spool. The spool is unchanged."""


class ContentDeltaError(SpoolRequestError):
    """A content chunk is not contiguous with the pending content."""

    def __init__(self, expected: int, got: int) -> None:
        self.expected = expected
        self.got = got
        super().__init__(f"must equal the pending delta {expected} (got {got})", "content_delta")


class SpoolClosedError(RuntimeError):
    """The spool was closed; it accepts no more requests."""


class SpoolInvariantError(AssertionError):
    """An internal invariant broke: a bug, not bad input. Raised explicitly (not by `assert`),
    so that `python -O` keeps the checks."""


# --- Outcomes and phases ----------------------------------------------------------


class Outcome(enum.Enum):
    """What one `Spool.apply` did (see the module docstring)."""

    CONTENT_APPENDED = "content_appended"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"
    ROLLED = "rolled"
    CAUGHT_UP = "caught_up"
    MISMATCH = "mismatch"


class SpoolPhase(enum.Enum):
    """Where a spool is, as far as the legality of transitions goes."""

    EMPTY = "empty"  # No committed content, nothing pending.
    HOLDING = "holding"  # Committed content, nothing pending.
    STREAMING = "streaming"  # Pending (uncommitted) content.
    CLOSED = "closed"  # Closed: accepts nothing.


OPEN_PHASES: Final = frozenset({SpoolPhase.EMPTY, SpoolPhase.HOLDING, SpoolPhase.STREAMING})

# Each outcome's legal source phases, and the phases it may lead to (None: phase unchanged).
# The classifier decides outcomes from offsets and sums; this table cross-checks it against
# the coarser phase, so that a classification bug is caught where it happens.
TRANSITIONS: Final[dict[Outcome, tuple[frozenset[SpoolPhase], frozenset[SpoolPhase] | None]]] = {
    Outcome.CONTENT_APPENDED: (OPEN_PHASES, frozenset({SpoolPhase.STREAMING})),
    Outcome.COMMITTED: (frozenset({SpoolPhase.STREAMING}), frozenset({SpoolPhase.HOLDING})),
    Outcome.ROLLED_BACK: (OPEN_PHASES, frozenset({SpoolPhase.EMPTY, SpoolPhase.HOLDING})),
    Outcome.ROLLED: (OPEN_PHASES, frozenset({SpoolPhase.EMPTY})),
    Outcome.CAUGHT_UP: (OPEN_PHASES, frozenset({SpoolPhase.EMPTY})),
    Outcome.MISMATCH: (OPEN_PHASES, None),
}


# --- Values handed to observers -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LocalFragment:
    """A committed fragment and the local file holding its content at [0, end - begin).

    Readers may read that range while the spool keeps writing beyond it. `fragment` is a copy
    owned by this value; do not mutate it."""

    fragment: pb.Fragment
    file: SpoolFile

    @property
    def begin(self) -> int:
        return self.fragment.begin

    @property
    def end(self) -> int:
        return self.fragment.end


@dataclass(frozen=True, slots=True)
class CompletedSpool:
    """A completed (non-empty, rolled) fragment, handed to the observer for persisting.

    The observer owns both files from then on and must close them. `content_file` holds exactly
    the fragment's content. `compressed_file`, when not None, holds the complete compressed
    stream of that content in its first `compressed_length` bytes; it is None for the NONE
    codec, and when this broker did not compress (see `compress_file`)."""

    fragment: pb.Fragment
    registers: pb.LabelSet
    first_append_time: float  # Unix seconds of the fragment's first commit (path postfixes use it).
    content_file: SpoolFile
    compressed_file: SpoolFile | None
    compressed_length: int
    primary: bool
    # A primary proposed less than this fragment holds (a commit it did not see: it rolled
    # every spool forward past this one's end): content no primary has, so the persister
    # uploads it at once, as a primary's, rather than after the replica delay (readers of
    # brokers without a copy wait at a hole until it is in the store).
    ahead_of_primary: bool = False

    @property
    def begin(self) -> int:
        return self.fragment.begin

    @property
    def end(self) -> int:
        return self.fragment.end


class SpoolObserver(Protocol):
    """Told of commits (the index serves the new content) and completions (the persister
    stores the fragment). Called after the spool's state has changed."""

    def on_commit(self, fragment: LocalFragment) -> None: ...

    def on_complete(self, completed: CompletedSpool) -> None: ...


# --- Where a spool keeps its fragments -----------------------------------------------------------


class FragmentFiles(Protocol):
    """Where a Spool keeps its fragments' content and, when durable, its commit records
    (spool_dir.JournalFiles). `ScratchFiles` keeps content in scratch files and records nothing.
    """

    def content_file(self, begin: int) -> SpoolFile:
        """A new, empty content file for the fragment beginning at `begin`."""
        ...

    def record(
        self, fragment: pb.Fragment, registers: pb.LabelSet, first_append_time: float | None
    ) -> None:
        """Record `fragment` and `registers` as the spool's committed state. Called before the
        commit or roll that leads there takes effect: once it returns, the state survives the
        process. A fragment beginning elsewhere than the last one recorded starts a new record;
        the previous one then goes with its content file (the persister's from then on), or
        is removed if it had no content. Raises OSError having recorded nothing."""
        ...

    def forget(self) -> None:
        """Stop recording the current fragment (the spool starts over, empty): its record goes
        with its content file, or is removed if it has none."""
        ...

    def close(self) -> None:
        """Release open records; what is recorded stays recorded."""
        ...


class ScratchFiles:
    """FragmentFiles of a spool that is not durable: content in `new_file()`s, no records."""

    __slots__ = ("_new_file",)

    def __init__(self, new_file: Callable[[], SpoolFile]) -> None:
        self._new_file = new_file

    def content_file(self, begin: int) -> SpoolFile:
        return self._new_file()

    def record(
        self, fragment: pb.Fragment, registers: pb.LabelSet, first_append_time: float | None
    ) -> None:
        pass

    def forget(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class RecoveredSpool:
    """A spool's committed state as recovered from its files (spool_dir.py): the Spool resumes
    from it. `file` holds exactly the fragment's content (None when it is empty), and `summer`
    is a SHA1 over that content, matching `fragment.sum`."""

    fragment: pb.Fragment
    registers: pb.LabelSet
    first_append_time: float | None
    file: SpoolFile | None
    summer: HASH


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """The outcome of one request, and the response owed to the primary: None for a content
    chunk (the protocol acknowledges proposals only)."""

    outcome: Outcome
    response: pb.ReplicateResponse | None


# --- Proposal checks ---------------------------------------------------------------------------


def validate_proposal_request(request: pb.ReplicateRequest, journal: str) -> None:
    """A proposal request to the spool of `journal`: a valid fragment of that journal, with
    registers, and without content. Raises ValidationError (or SpoolRequestError)."""
    proposal = request.proposal
    with at("proposal"):
        validate_fragment(proposal)
        if proposal.begin < 0:
            raise ValidationError(f"must be >= 0 (got {proposal.begin})", "begin")
        if proposal.end > OFFSET_MAX:
            raise ValidationError(f"must fit in an int64 (got {proposal.end})", "end")
        if proposal.journal != journal:
            raise SpoolRequestError(
                f"must be the spool's journal {journal!r} (got {proposal.journal!r})",
                "journal",
            )
    if not request.HasField("registers"):
        raise SpoolRequestError("expected with a proposal (got none)", "registers")
    with at("registers"):
        validate_label_set(request.registers)
    if request.content:
        raise SpoolRequestError(
            f"unexpected with a proposal (got {len(request.content)} bytes)", "content"
        )
    if request.content_delta:
        raise SpoolRequestError(
            f"unexpected with a proposal (got {request.content_delta})", "content_delta"
        )


# --- Fragment helpers ---------------------------------------------------------------------------


def same_fragment(a: pb.Fragment, b: pb.Fragment) -> bool:
    """Whether two Fragments are equal field by field.

    Protobuf's `==` also compares the *presence* of the `sum` sub-message, which carries no
    meaning here: Go's Fragment.Sum is a non-nullable struct, always sent, while a zero sum built
    in Python may be absent. Proposals must match on values only, or a Go primary's proposal of
    an empty fragment could never equal ours."""
    return _with_sum(a) == _with_sum(b)


def _with_sum(fragment: pb.Fragment) -> pb.Fragment:
    copy = copy_fragment(fragment)
    copy.sum.SetInParent()
    return copy


def copy_fragment(fragment: pb.Fragment) -> pb.Fragment:
    copy = pb.Fragment()
    copy.CopyFrom(fragment)
    return copy


def copy_registers(registers: pb.LabelSet) -> pb.LabelSet:
    copy = pb.LabelSet()
    copy.CopyFrom(registers)
    return copy
