"""The Spool: a journal's fragment under construction, and the state machine of replication.

Every broker of a journal's route (the primary and each replica) owns one Spool per journal. The
primary streams each append to all of them as ReplicateRequests: content chunks, then a
*proposal* of the fragment the spool should hold next. Because every spool applies the same
requests by the same rules, they stay identical, and an append the primary reports as committed
is on every replica (docs/architecture.md, Invariants). `Spool.apply` is that one rule book; it is
sans-IO apart
from the SpoolFile it writes through, and the caller owns all networking.

State
  - `fragment`: the committed fragment [begin, end) with the SHA1 `sum` of exactly that content
    (all-zero when empty), its compression codec and backing store.
  - `registers`: the journal's registers as of the last commit (docs/architecture.md, Invariants).
  - `delta`: bytes received since the last commit and not yet committed. They sit in the content
    file at [length, length + delta); a SHA1 running over committed + pending content sits next
    to a snapshot of it as of the last commit, so a rollback restores the sum in O(1).

Content chunks must arrive contiguously: a chunk's `content_delta` must equal the pending delta,
or the peer is broken and the chunk is refused with `ContentDeltaError`.

A proposal is classified into exactly one Outcome, then applied:

  COMMITTED    the proposal is `next()`: the fragment extended by exactly the pending bytes, with
               their sum. Pending bytes become committed; registers become the proposed ones.
  ROLLED_BACK  the proposal is the current fragment, with the current registers: pending bytes
               are dropped. (The same request re-sent after a commit is therefore a no-op.)
  ROLLED       the proposal is the empty fragment at the end of everything known here, either at
               the committed end, or beyond the pending end. The current fragment, if not empty,
               is *completed* (handed to the observer for persisting) and a new empty fragment
               begins, with the proposal's codec and backing store. That is the only way those
               change: a fragment file has one codec, and its name is its content.
  CAUGHT_UP    the proposal ends beyond everything this spool holds but is not an empty
               fragment: another broker holds content this one missed (a new route member, or
               one that lost a partition). The spool rolls forward to the proposal's end, takes
               the proposal's registers, and answers PROPOSAL_MISMATCH with the new empty
               fragment, which tells the primary to re-propose a roll to that offset. This is
               Gazette's catch-up; a Go primary relies on it to add a peer.
  MISMATCH     anything else. Answered PROPOSAL_MISMATCH with the current fragment and registers;
               nothing changes (docs/architecture.md, Invariants).

This is Gazette's fragment.Spool with one deliberate narrowing: Gazette also rolls when a
zero-length proposal at the committed end mismatches afterwards (e.g. on its registers), and
reports the rolled fragment. Here such a proposal is a plain MISMATCH that changes nothing. A Go
primary treats both answers as a failed synchronization (neither lets it make progress), so
only the local side effect differs, and "a mismatch changes nothing" is worth more.

Compression (spool_compression.py). The primary compresses committed content as it commits, in
batches; replicas compress only on demand. Compression is a cache of the content file.

Durability. The spool keeps its fragments through a `FragmentFiles` (spool_types.py). Without
a data directory that is `ScratchFiles`: content in scratch files, nothing recorded, all of it
gone with the process. With one it is spool_named.JournalFiles: named content files, and a
commit record written *before* each commit or roll takes effect (so before any
acknowledgement), from which a restarted broker resumes the spool (`recovered`, see
spool_recovery.py). A resumed spool is `recovery_pending` and applies nothing until it is
settled: adopted (its content is the journal's) or disowned (it starts over, empty).

Around this module: spool_state.py holds the spool's state, its views and its invariants;
spool_types.py the values, outcomes, errors and proposal checks;
spool_classify.py what a proposal means (the rule book above, pure); spool_roll.py the
primary's roll policy; spool_file.py the content files; spool_named.py,
spool_record.py, spool_dir.py, spool_recovery.py and spool_settle.py durability and recovery.
The primary feeds its own spool content with `apply_content` (the bytes, without a
ReplicateRequest around them).

Only content whose bytes reached the file is counted, and a failed file operation raises before
any state changes, so an OSError leaves the spool consistent and the caller may retry or fail
the stream.
"""

from __future__ import annotations

from broker.fragment import codecs
from broker.fragment.naming import OFFSET_MAX
from broker.fragment.spool_classify import classify, rolled_fragment
from broker.fragment.spool_compression import (
    IncrementalCompression,
    compress_batch_bytes_min_default,
    compress_chunk_bytes_max,
    compress_file,
)
from broker.fragment.spool_file import BytesLike, SpoolFile, unlink_durable
from broker.fragment.spool_roll import RollReason, roll_proposal, roll_reason
from broker.fragment.spool_state import SpoolState
from broker.fragment.spool_types import (
    ZERO_SUM,
    ApplyResult,
    CompletedSpool,
    ContentDeltaError,
    LocalFragment,
    Outcome,
    SpoolClosedError,
    SpoolInvariantError,
    SpoolObserver,
    SpoolPhase,
    SpoolRequestError,
    copy_fragment,
    copy_registers,
    same_fragment,
    validate_proposal_request,
)
from broker.protocol import protocol_pb2 as pb

# Re-exported: the Spool's values and errors are part of its interface.
__all__ = [
    "ApplyResult",
    "CompletedSpool",
    "ContentDeltaError",
    "IncrementalCompression",
    "LocalFragment",
    "Outcome",
    "RollReason",
    "Spool",
    "SpoolClosedError",
    "SpoolInvariantError",
    "SpoolObserver",
    "SpoolPhase",
    "SpoolRequestError",
    "compress_batch_bytes_min_default",
    "compress_chunk_bytes_max",
    "compress_file",
    "same_fragment",
]


class Spool(SpoolState):
    """See the module docstring; its state, the views of it and the transition checks are
    SpoolState's (spool_state.py). Owned by one task at a time; not thread-safe."""

    # --- Recovery (spool_recovery.py) ---

    def adopt_recovery(self) -> None:
        """Keep the recovered state: its content is the journal's. The observer hears of the
        recovered fragment as of a commit (the index then serves it)."""
        self._check_recovery_pending()
        self._recovery_pending = False
        local = self.local_fragment
        if local is not None:
            self._observer.on_commit(local)

    def disown_recovery(self) -> SpoolFile | None:
        """Drop the recovered state and start over as a new spool, empty at offset zero with
        no registers. Returns the recovered content's file (with its commit record: set it
        aside), or None if the fragment was empty."""
        self._check_recovery_pending()
        file = self._file if self.content_length else None
        self._files.forget()
        self._fragment = pb.Fragment(journal=self._journal, sum=ZERO_SUM, compression_codec=pb.NONE)
        self._registers = pb.LabelSet()
        self._reset_content()
        self._recovery_pending = False
        self._check_invariants()
        return file

    def _check_recovery_pending(self) -> None:
        if self._closed:
            raise SpoolClosedError(f"{self!r}: recovery settled after close()")
        if not self._recovery_pending:
            raise SpoolInvariantError(f"{self!r}: no recovery pending")

    # --- Roll decisions of a primary (spool_roll.py) ---

    def roll_reason(
        self, spec: pb.JournalSpec.Fragment, now: float, roll_to_offset: int = 0
    ) -> RollReason | None:
        """See `spool_roll.roll_reason`."""
        return roll_reason(self._fragment, self._first_append_time, spec, now, roll_to_offset)

    def roll_proposal(
        self, spec: pb.JournalSpec.Fragment, now: float, roll_to_offset: int = 0
    ) -> pb.Fragment:
        """See `spool_roll.roll_proposal`. Equal to `fragment` when no roll need be sent."""
        return roll_proposal(self._fragment, self._first_append_time, spec, now, roll_to_offset)

    # --- Applying requests ---

    def apply(self, request: pb.ReplicateRequest, primary: bool) -> ApplyResult:
        """Apply one content chunk or proposal (see the module docstring). `primary` says
        whether this broker is the journal's primary (it then compresses as it commits).

        Raises SpoolRequestError (spool unchanged) for a request no correct primary sends,
        SpoolClosedError after close(), and OSError if the content file fails (spool
        unchanged, except that compression may have to be rebuilt)."""
        if self._closed:
            raise SpoolClosedError(f"{self!r}: apply() after close()")
        if self._recovery_pending:
            raise SpoolInvariantError(f"{self!r}: apply() before its recovery was settled")
        if request.HasField("proposal"):
            return self._apply_proposal(request, primary)
        return self._apply_content(request)

    def must_apply(self, request: pb.ReplicateRequest, *, primary: bool = False) -> ApplyResult:
        """Apply a request derived from this spool itself (a rollback, or a roll at its end),
        which cannot mismatch unless the spool is broken."""
        result = self.apply(request, primary=primary)
        if result.outcome is Outcome.MISMATCH or result.outcome is Outcome.CAUGHT_UP:
            raise SpoolInvariantError(
                f"{self!r}: self-derived request mismatched ({result.outcome})"
            )
        return result

    def close(self) -> None:
        """Close the spool and its files, without completing the current fragment (roll first
        to persist it). Durable files keep what they recorded, for a later recovery; other
        content is gone. Files already handed to the observer are not touched."""
        if self._closed:
            return
        self._discard_files(unlink=False)
        self._files.close()
        self._closed = True

    # --- Content chunks ---

    def apply_content(self, content: BytesLike, content_delta: int) -> ApplyResult:
        """Apply one content chunk given as its bytes and delta: what `apply` does with a
        ReplicateRequest of only `content` and `content_delta`, without one having to be built.
        The primary feeds its own spool this way, saving a copy of every appended byte."""
        if self._closed:
            raise SpoolClosedError(f"{self!r}: apply_content() after close()")
        if self._recovery_pending:
            raise SpoolInvariantError(f"{self!r}: content before its recovery was settled")
        return self._append_content(content, content_delta)

    def _apply_content(self, request: pb.ReplicateRequest) -> ApplyResult:
        if request.HasField("registers"):
            raise SpoolRequestError("unexpected without a proposal", "registers")
        # Each read of a bytes field copies it out of the message: read it once.
        return self._append_content(request.content, request.content_delta)

    def _append_content(self, content: BytesLike, content_delta: int) -> ApplyResult:
        if not content:
            raise SpoolRequestError("expected content or a proposal (got neither)")
        if content_delta != self._delta:
            raise ContentDeltaError(self._delta, content_delta)
        end = self._fragment.end + self._delta + len(content)
        if end > OFFSET_MAX:
            raise SpoolRequestError(
                f"would extend the journal to offset {end}, beyond the int64 maximum", "content"
            )
        before = self._enter(Outcome.CONTENT_APPENDED)

        if self._file is None:
            if self.content_length:
                raise SpoolInvariantError(f"{self!r}: non-empty fragment without a content file")
            self._file = self._files.content_file(self._fragment.begin)
        self._file.pwrite(content, self.content_length + self._delta)
        # Only bytes that reached the file are counted, so a failed write above leaves the spool
        # as it was (any partial bytes lie beyond the pending end, and are overwritten later).
        self._summer.update(content)
        self._delta += len(content)

        self._leave(before, Outcome.CONTENT_APPENDED)
        return ApplyResult(Outcome.CONTENT_APPENDED, None)

    # --- Proposals ---

    def _apply_proposal(self, request: pb.ReplicateRequest, primary: bool) -> ApplyResult:
        proposal = request.proposal
        validate_proposal_request(request, self._journal)
        registers = request.registers

        outcome = self._classify(proposal, registers)
        before = self._enter(outcome)
        committed: LocalFragment | None = None
        completed: CompletedSpool | None = None
        if outcome is Outcome.COMMITTED:
            committed = self._commit(proposal, registers, primary)
        elif outcome is Outcome.ROLLED_BACK:
            self._rollback()
        elif outcome is Outcome.ROLLED or outcome is Outcome.CAUGHT_UP:
            completed = self._roll(proposal, registers, primary)
        self._leave(before, outcome)

        # Observers hear of a transition only once it is complete and checked, so that what
        # they see (and anything they do to the index or persister) matches the spool.
        if committed is not None:
            self._observer.on_commit(committed)
        if completed is not None:
            self._observer.on_complete(completed)

        if outcome is Outcome.MISMATCH and proposal.end < self._fragment.end:
            # The primary lacks committed content of this fragment: it will roll every spool
            # past it, and only spools like this one hold it until it is persisted.
            self._ahead_of_primary = True
        if outcome is Outcome.MISMATCH or outcome is Outcome.CAUGHT_UP:
            response = pb.ReplicateResponse(
                status=pb.PROPOSAL_MISMATCH,
                fragment=copy_fragment(self._fragment),
                registers=copy_registers(self._registers),
            )
        else:
            response = pb.ReplicateResponse(status=pb.OK)
        return ApplyResult(outcome, response)

    def _classify(self, proposal: pb.Fragment, registers: pb.LabelSet) -> Outcome:
        """Decide what `proposal` means to this spool (spool_classify.py). Pure."""
        # next() only matters with pending bytes: skip building it (and its digest) otherwise.
        following = self.next() if self._delta else self._fragment
        return classify(
            self._fragment, self._registers, self._delta, following, proposal, registers
        )

    def _rolled_fragment(self, proposal: pb.Fragment) -> pb.Fragment:
        return rolled_fragment(self._journal, proposal)

    def _commit(
        self, proposal: pb.Fragment, registers: pb.LabelSet, primary: bool
    ) -> LocalFragment:
        length = proposal.end - proposal.begin
        if primary and self._fragment.compression_codec != pb.NONE:
            through = self._compression.through if self._compression is not None else 0
            if length - through >= self._compress_batch_bytes_min:
                # First, so that a failing compression raises before the commit changes state.
                self._compress_through(length)
        if self._file is None:
            raise SpoolInvariantError("commit without a content file")
        first_append_time = self._first_append_time
        if first_append_time is None:
            first_append_time = self._clock()
        committed = copy_fragment(proposal)
        committed.sum.SetInParent()  # Always present, as Go's non-nullable field is.
        # Recorded before anything changes: the commit is acknowledged once this returns.
        self._files.record(committed, registers, first_append_time)
        self._fragment = committed
        self._registers.CopyFrom(registers)
        self._delta = 0
        self._sum_at_commit = self._summer.copy()
        self._first_append_time = first_append_time
        return LocalFragment(self.fragment, self._file)

    def _rollback(self) -> None:
        self._delta = 0
        self._summer = self._sum_at_commit.copy()

    def _roll(
        self, proposal: pb.Fragment, registers: pb.LabelSet, primary: bool
    ) -> CompletedSpool | None:
        """Roll to the empty fragment of `proposal`; return the completed fragment, if any."""
        catching_up = proposal.end > self._fragment.end + self._delta
        completed = self._complete(primary) if self.content_length else None
        rolled = self._rolled_fragment(proposal)
        # Whoever holds content up to the proposal's end holds the registers that go with it.
        rolled_registers = registers if catching_up else self._registers
        try:
            self._files.record(rolled, rolled_registers, None)
        except BaseException:
            if completed is not None:
                # The roll did not happen: the fragment stays current. Its file was cut to the
                # committed length, so pending content goes, as a rollback would drop it.
                if completed.compressed_file is not None:
                    completed.compressed_file.close()
                self._rollback()
            raise
        if completed is None:
            self._discard_files(unlink=True)
        if catching_up:
            self._registers.CopyFrom(registers)
        self._fragment = rolled
        self._reset_content()
        return completed

    def _complete(self, primary: bool) -> CompletedSpool:
        """Package the non-empty current fragment for the persister. Raises (and changes
        nothing but the compression cache) if the files fail."""
        file = self._file
        first_append_time = self._first_append_time
        if file is None or first_append_time is None:
            raise SpoolInvariantError("non-empty fragment without a content file or first append")
        length = self.content_length
        compressed_file: SpoolFile | None = None
        compressed_length = 0
        if self._fragment.compression_codec != pb.NONE and (
            self._compression is not None or primary
        ):
            compression = self._compress_through(length)
            try:
                compressed_file, compressed_length = compression.finish()
                # Hand over exactly the fragment's bytes: drop pending and rolled-back bytes
                # beyond its end, so the persister may read the file whole.
                file.truncate(length)
            except BaseException:
                self._drop_compression()
                raise
            self._compression = None  # Now the CompletedSpool's.
        else:
            file.truncate(length)
        return CompletedSpool(
            fragment=self.fragment,
            registers=self.registers,
            first_append_time=first_append_time,
            content_file=file,
            compressed_file=compressed_file,
            compressed_length=compressed_length,
            primary=primary,
            ahead_of_primary=self._ahead_of_primary,
        )

    def _compress_through(self, length: int) -> IncrementalCompression:
        """Extend compression to content [0, length); start it if needed. On error, drop it
        (it is rebuilt from the content file next time) and raise."""
        file = self._file
        if file is None:
            raise SpoolInvariantError("compressing without a content file")
        try:
            if self._compression is None:
                codec = codecs.CompressionCodec(self._fragment.compression_codec)
                self._compression = IncrementalCompression(codec, self._new_file)
            self._compression.extend(file, length)
        except BaseException:
            self._drop_compression()
            raise
        return self._compression

    def _drop_compression(self) -> None:
        if self._compression is not None:
            compression, self._compression = self._compression, None
            compression.discard()

    def _discard_files(self, *, unlink: bool) -> None:
        """Close the current files; with `unlink`, remove a durable content file's name too
        (its content is dropped for good: an empty fragment's rolled-back bytes)."""
        self._drop_compression()
        if self._file is not None:
            file, self._file = self._file, None
            if unlink:
                unlink_durable(file)
            file.close()
