"""The append machine's content phase: stream the client's content, commit, read the answers.

  STREAM_CONTENT          forward each client chunk to all replicas; on the commit marker (an
                          empty chunk, then end of stream) propose the commit, on anything else
                          propose the rollback. Then READ_ACKNOWLEDGEMENTS.
  READ_ACKNOWLEDGEMENTS   hand the pipeline to the next append, and in turn read every
                          replica's acknowledgement: FINISHED, or ERROR.

The append's own SHA1 (the response's commit fragment) is summed here too. A mixin of the
machine (append_fsm.py) over its state (append_run.py).
"""

from __future__ import annotations

import asyncio
import hashlib

from broker import metrics
from broker.append_rules import (
    apply_register_updates,
    complete_despite_cancellation,
    has_register_updates,
    may_write,
    validate_content_chunk,
)
from broker.append_run import AppendMessage, AppendRun
from broker.append_state import (
    ExpectedEOFError,
    FSMStateError,
    RegisterUpdateWithEmptyAppendError,
    State,
    UnexpectedEOFError,
)
from broker.append_suspend import CONTENT_FORBIDDEN
from broker.fragment.naming import sum_from_digest
from broker.pipeline import Pipeline, local_offload_bytes_min
from broker.pipeline_sync import AppendOutcomeUnknownError
from broker.protocol import protocol_pb2 as pb
from broker.protocol.content_wire import ContentChunk
from broker.protocol.validate import ValidationError


class ContentPhase(AppendRun):
    """STREAM_CONTENT, READ_ACKNOWLEDGEMENTS, and the append's own sum."""

    async def on_stream_content(self, req: AppendMessage | None, err: BaseException | None) -> None:
        """One client message (``req``), the end of the client's stream (both None), or its
        failure (``err``). See the module docstring."""
        self._must_state(State.STREAM_CONTENT)
        pln, spec = self._pipeline(), self._spec()
        if self.client_fragment is None:
            self.client_fragment = await self._begin_client_fragment(pln, spec)
        fragment = self.client_fragment

        if err is None and req is not None and not isinstance(req, ContentChunk):
            # (A ContentChunk holds content alone by construction.)
            try:
                validate_content_chunk(req)
            except ValidationError as exc:
                err = exc
        eof = err is None and req is None
        # Read once: every read of a bytes field of a message copies it out.
        content: bytes | memoryview = req.content if req is not None else b""

        if eof and not self.client_commit:
            err = UnexpectedEOFError()
        elif err is None and req is not None and self.client_commit:
            err = ExpectedEOFError()
        elif err is None and req is not None and not content:
            # The commit marker; the end of the stream must follow.
            self.client_commit = True
            return
        elif err is None and req is not None and not may_write(spec):
            self._res().status = pb.NOT_ALLOWED
        elif err is None and req is not None and self.req.suspend in CONTENT_FORBIDDEN:
            # Suspension requests and SUSPEND_KEEP barriers are empty appends.
            self._res().status = pb.NOT_ALLOWED
        elif err is None and req is not None:
            await self._forward_content(pln, fragment, req, content)
            if pln.send_err() is None:
                return
        await self._propose_end(pln, fragment, err, eof=eof)

    async def _begin_client_fragment(self, pln: Pipeline, spec: pb.JournalSpec) -> pb.Fragment:
        """The append's first message: maybe roll to a new fragment ahead of it (the pipeline is
        synchronised, so every peer will agree; no acknowledgement is needed). Returns the
        empty commit fragment the append's content will extend."""
        proposal = pln.spool.roll_proposal(spec.fragment, self.env.clock(), self.roll_to_offset)
        spool_fragment = pln.spool.fragment
        if proposal != spool_fragment:
            self._pln_dirty = True
            await pln.scatter(pb.ReplicateRequest(proposal=proposal, registers=self.registers))
            spool_fragment = pln.spool.fragment
        self._client_summer = hashlib.sha1()
        return pb.Fragment(
            journal=spool_fragment.journal,
            begin=spool_fragment.end,
            end=spool_fragment.end,
            compression_codec=spool_fragment.compression_codec,
        )

    async def _forward_content(
        self,
        pln: Pipeline,
        fragment: pb.Fragment,
        req: AppendMessage,
        content: bytes | memoryview,
    ) -> None:
        """Sum one content chunk into the append's SHA1 and send it to every replica."""
        self._pln_dirty = True
        await self._sum_content(content)
        await pln.scatter_content(
            content,
            fragment.end - fragment.begin,
            append_wire=req.wire if isinstance(req, ContentChunk) else None,
        )
        fragment.end += len(content)

    async def _propose_end(
        self, pln: Pipeline, fragment: pb.Fragment, err: BaseException | None, *, eof: bool
    ) -> None:
        """The end of this append's content: propose its commit, or its rollback, to every
        replica. (Its sum is taken once the commit is acknowledged: see _finish_sum.)"""
        if eof and fragment.end == fragment.begin and has_register_updates(self.req):
            err = RegisterUpdateWithEmptyAppendError()

        if err is None and eof:
            pln.note_ended_peers()
        if err is None and eof and pln.send_err() is None and self.status == pb.OK:
            proposal = pln.spool.next()
            self.commit_proposed = fragment.end > fragment.begin
            if fragment.end > fragment.begin:
                self.registers = apply_register_updates(self.registers, self.req)
        else:
            # A client or peer error: the pipeline is still consistent, but every replica
            # must drop the partial content it has spooled.
            proposal = pln.spool.fragment
            self.err = err
        self._pln_dirty = True
        try:
            # Completes even if the client goes away meanwhile (Pipeline.scatter); its
            # acknowledgements are then owed, and read by whoever handles the cancellation.
            await pln.scatter(
                pb.ReplicateRequest(proposal=proposal, registers=self.registers, acknowledge=True)
            )
        finally:
            self.state = State.READ_ACKNOWLEDGEMENTS

    async def on_read_acknowledgements(self) -> None:
        self._must_state(State.READ_ACKNOWLEDGEMENTS)
        pln = self._pipeline()
        replica = self._pln_slot_of
        if replica is None:
            raise FSMStateError("read_acknowledgements without owning the pipeline")
        send_err = pln.send_err()
        wait_for, close_after = pln.barrier()

        # Release the send side now: the next append may stream while we wait for our turn.
        self._pln_slot_of = None
        self._pln_dirty = False
        if send_err is None:
            replica.pipeline_slot.put(pln)
        else:
            pln.release_spool()
            replica.pipeline_slot.put(None)  # The next append builds a new pipeline.
        try:
            if send_err is not None or not wait_for.is_set() or pln.has_peers_to_read():
                # Completes even if the client goes away meanwhile: responses left unread
                # would be taken by the next append for its own.
                await complete_despite_cancellation(self._read_in_turn(pln, send_err, wait_for))
            # Else (R=1, our turn already): nothing to read and nothing to wait for.
        finally:
            close_after.set()
            if send_err is not None:
                pln.abort_streams()

        if self.err is not None or self.status != pb.OK:
            self.state = State.ERROR
        elif (failed := pln.recv_err() or send_err) is not None:
            if self.commit_proposed:
                # The local spool took the commit as it was sent: say so, rather than let the
                # client believe that nothing was appended.
                unknown = AppendOutcomeUnknownError(
                    f"outcome unknown: the commit was proposed to every replica, then {failed};"
                    " this primary holds it, so it may be read, and a retry may append it twice"
                )
                unknown.__cause__ = failed
                failed = unknown
            self._fail(failed)
        else:
            metrics.PIPELINE_COMMITS.inc()  # Acknowledged by every replica.
            await self._finish_sum()
            self.state = State.FINISHED

    @staticmethod
    async def _read_in_turn(
        pln: Pipeline, send_err: BaseException | None, wait_for: asyncio.Event
    ) -> None:
        if send_err is not None:
            await pln.close_send()
        # Our turn comes when every append that sent before us has read its responses.
        await wait_for.wait()
        await pln.gather_ok()
        if send_err is not None:
            await pln.gather_eof()

    # --- The append's own sum ---

    async def _sum_content(self, content: bytes | memoryview) -> None:
        """Add ``content`` to the append's running SHA1 (the commit fragment's sum), in order.

        A large chunk is summed on a worker thread, and nothing waits for it until the next
        chunk or ``_finish_sum``: the pipeline's critical section (which every other append of
        the journal waits for) then holds only what must precede the commit proposal, the
        spool's write and sum, not this one too. At most one chunk is pending at a time."""
        if self._client_summing is not None:
            summing, self._client_summing = self._client_summing, None
            await summing
        if len(content) >= local_offload_bytes_min:
            loop = asyncio.get_running_loop()
            self._client_summing = loop.run_in_executor(None, self._client_summer.update, content)
        else:
            self._client_summer.update(content)

    async def _finish_sum(self) -> None:
        """Set the commit fragment's sum, once the last chunk is summed."""
        if self._client_summing is not None:
            summing, self._client_summing = self._client_summing, None
            await summing
        fragment = self.client_fragment
        if fragment is not None and fragment.end > fragment.begin:
            fragment.sum.CopyFrom(sum_from_digest(self._client_summer.digest()))
