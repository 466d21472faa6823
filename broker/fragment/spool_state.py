"""The Spool's state (spool.py, "State"), the read-only views of it, and the checks every
transition passes: the phase table (spool_types.TRANSITIONS) and the invariants. `Spool`
(spool.py) is this state with the rule book that changes it; the state is built here, empty or
resumed from a recovered one (spool_recovery.py).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

from broker.fragment.naming import OFFSET_MAX, sum_from_digest
from broker.fragment.spool_compression import (
    IncrementalCompression,
    compress_batch_bytes_min_default,
)
from broker.fragment.spool_file import SpoolFile
from broker.fragment.spool_types import (
    TRANSITIONS,
    ZERO_SUM,
    FragmentFiles,
    LocalFragment,
    Outcome,
    RecoveredSpool,
    ScratchFiles,
    SpoolInvariantError,
    SpoolObserver,
    SpoolPhase,
    copy_fragment,
    copy_registers,
)
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import at, validate_journal_name


class SpoolState:
    """See the module docstring. A `Spool` is one; nothing else is."""

    def __init__(
        self,
        journal: str,
        observer: SpoolObserver,
        *,
        new_file: Callable[[], SpoolFile],
        files: FragmentFiles | None = None,
        recovered: RecoveredSpool | None = None,
        clock: Callable[[], float] = time.time,
        compress_batch_bytes_min: int = compress_batch_bytes_min_default,
    ) -> None:
        """`new_file` makes scratch files (compressed copies); `files` keeps the fragments'
        content and commit records (default: `ScratchFiles(new_file)`, nothing durable).
        `recovered` resumes the spool from a recovered state (see `recovery_pending`)."""
        with at("journal"):
            validate_journal_name(journal)
        if compress_batch_bytes_min < 0:
            raise ValueError(
                f"compress_batch_bytes_min: must be >= 0 (got {compress_batch_bytes_min})"
            )
        self._journal = journal
        self._observer = observer
        self._new_file = new_file
        self._files: FragmentFiles = files if files is not None else ScratchFiles(new_file)
        self._clock = clock
        self._compress_batch_bytes_min = compress_batch_bytes_min
        # A new journal starts at offset zero, uncompressed; the primary's first synchronization
        # rolls every spool to the journal's actual offset and codec.
        self._fragment = pb.Fragment(journal=journal, sum=ZERO_SUM, compression_codec=pb.NONE)
        self._registers = pb.LabelSet()
        self._closed = False
        self._recovery_pending = False
        self._reset_content()
        if recovered is not None:
            self._restore(recovered)

    def _reset_content(self) -> None:
        """Forget the content of the current fragment (its files were handed over or closed)."""
        self._file: SpoolFile | None = None
        self._delta = 0
        self._summer = hashlib.sha1()
        self._sum_at_commit = self._summer.copy()
        self._first_append_time: float | None = None
        self._compression: IncrementalCompression | None = None
        # A proposal ended below the committed end (see CompletedSpool.ahead_of_primary).
        self._ahead_of_primary = False

    def _restore(self, recovered: RecoveredSpool) -> None:
        fragment = copy_fragment(recovered.fragment)
        fragment.sum.SetInParent()
        length = fragment.end - fragment.begin
        if fragment.journal != self._journal:
            raise ValueError(f"recovered: fragment of another journal {fragment.journal!r}")
        if length and (recovered.file is None or recovered.file.size() < length):
            raise ValueError(f"recovered: [{fragment.begin}, {fragment.end}) without its content")
        if length and sum_from_digest(recovered.summer.digest()) != fragment.sum:
            raise ValueError(f"recovered: [{fragment.begin}, {fragment.end}) SHA1 mismatch")
        self._fragment = fragment
        self._registers = copy_registers(recovered.registers)
        self._file = recovered.file if length else None
        self._summer = recovered.summer.copy()
        self._sum_at_commit = self._summer.copy()
        self._first_append_time = recovered.first_append_time if length else None
        self._recovery_pending = True
        self._check_invariants()

    @property
    def recovery_pending(self) -> bool:
        """Whether the spool was resumed from a recovered state that is not yet settled: it must
        be adopted or disowned (spool_settle.py) before it applies anything."""
        return self._recovery_pending

    # --- Read-only views ---

    @property
    def journal(self) -> str:
        return self._journal

    @property
    def fragment(self) -> pb.Fragment:
        """A copy of the committed fragment."""
        return copy_fragment(self._fragment)

    @property
    def registers(self) -> pb.LabelSet:
        """A copy of the registers as of the last commit."""
        return copy_registers(self._registers)

    @property
    def delta(self) -> int:
        """Pending (uncommitted) bytes."""
        return self._delta

    @property
    def content_length(self) -> int:
        """Committed bytes of the current fragment."""
        return self._fragment.end - self._fragment.begin

    @property
    def first_append_time(self) -> float | None:
        """Unix seconds of the current fragment's first commit; None while it is empty."""
        return self._first_append_time

    @property
    def local_fragment(self) -> LocalFragment | None:
        """The committed fragment with its content file; None while it is empty."""
        if self._file is None or self.content_length == 0:
            return None
        return LocalFragment(self.fragment, self._file)

    @property
    def phase(self) -> SpoolPhase:
        if self._closed:
            return SpoolPhase.CLOSED
        if self._delta:
            return SpoolPhase.STREAMING
        return SpoolPhase.HOLDING if self.content_length else SpoolPhase.EMPTY

    def next(self) -> pb.Fragment:
        """The proposal that would commit exactly the pending content: what a primary proposes
        at the end of an append."""
        proposal = copy_fragment(self._fragment)
        proposal.end += self._delta
        if proposal.begin == proposal.end:
            # Gazette names empty fragments with the zero sum, not SHA1(b"").
            proposal.sum.CopyFrom(ZERO_SUM)
        else:
            proposal.sum.CopyFrom(sum_from_digest(self._summer.digest()))
        return proposal

    def __repr__(self) -> str:
        f = self._fragment
        return (
            f"Spool<{self._journal} [{f.begin}, {f.end}) codec={f.compression_codec}"
            f" delta={self._delta} phase={self.phase.value}>"
        )

    # --- Transition checks ---

    def _enter(self, outcome: Outcome) -> SpoolPhase:
        phase = self.phase
        legal_from, _ = TRANSITIONS[outcome]
        if phase not in legal_from:
            raise SpoolInvariantError(f"{self!r}: {outcome.value} is illegal from {phase.value}")
        return phase

    def _leave(self, before: SpoolPhase, outcome: Outcome) -> None:
        _, leads_to = TRANSITIONS[outcome]
        after = self.phase
        if after not in (leads_to or (before,)):
            raise SpoolInvariantError(
                f"{self!r}: {outcome.value} from {before.value} led to {after.value}"
            )
        self._check_invariants()

    def _check_invariants(self) -> None:
        """Checked after every transition. Messages are built only on failure: this runs on
        every chunk of every append."""
        f = self._fragment
        empty = f.begin == f.end
        pending_end = self.content_length + self._delta
        if f.journal != self._journal:
            raise SpoolInvariantError(f"fragment of another journal {f.journal!r}")
        if not 0 <= f.begin <= f.end or f.end + self._delta > OFFSET_MAX or self._delta < 0:
            raise SpoolInvariantError(f"bad range [{f.begin}, {f.end}) + delta {self._delta}")
        if empty != (f.sum == ZERO_SUM):
            raise SpoolInvariantError(f"sum must be zero exactly when empty (got {f.sum})")
        if empty != (self._first_append_time is None):
            raise SpoolInvariantError("first append time must be set exactly when not empty")
        if self._file is None and pending_end != 0:
            raise SpoolInvariantError(f"{pending_end} content bytes without a content file")
        if self._file is not None and self._file.size() < pending_end:
            raise SpoolInvariantError(
                f"content file holds {self._file.size()} bytes, fewer than {pending_end}"
            )
        if self._compression is not None and (
            f.compression_codec == pb.NONE or self._compression.through > self.content_length
        ):
            raise SpoolInvariantError(
                f"compressed {self._compression.through} bytes of {self.content_length}"
                f" under codec {f.compression_codec}"
            )
