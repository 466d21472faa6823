"""Read-your-writes through any member of a quorum journal: the barrier a non-blocking Read
passes before it is served (Raft's ReadIndex; the rules are broker/quorum/read_index.py's).

An append is acknowledged once the leader commits it; a follower learns the commit on the
leader's next message, and serves reads only up to what it has applied to its spool. Without
this barrier a non-blocking read through a follower right after an acknowledged append, and the
write head it reports (what Spark batch reads and gazctl plan their end from), stopped before
that append: data hidden without an error.

`QuorumJournals.read_barrier(journal)` (what `ReadAPI` calls for a non-blocking read of a quorum
journal served here) first learns the *read index*, the leader's commit offset as of after the
read arrived (`ReadBarrier.read_index`):

- on a follower, one round trip to the leader it knows: a `ReadIndexAsk` over the quorum
  transport, answered by a `ReadIndexAnswer`; asks and answers are fire and forget like every
  quorum message, so an unanswered ask is sent again (doubling from `read_index_retry_initial_s`
  to `read_index_retry_max_s`), to whichever member the node then knows as the leader;
- on the leader, its own commit offset, once the term register confirms it still leads its term
  (a linearizable read of `<root>/quorum/<journal>`: no newer term was claimed, so no newer
  leader acknowledged anything) and its term's barrier committed. The leader answers followers'
  asks the same way.

It then waits until this broker has applied that much to the journal's spool (the applier,
apply.py), which is what the read serves from. Blocking reads do not pass the barrier: they wait
for content at their offset, which the applier brings once it is committed.

Coalescing. A read-heavy member must not multiply round trips: one question per journal is in
flight at a time, and reads that arrive while it is in flight wait for the *next* one, which
starts when it ends (`Coalesced`): a read may only use an answer computed after it arrived, or
it could miss an append acknowledged just before it. The leader likewise reads the register at
most once at a time per journal, for its own reads and every follower's asks together, and
answers at most `read_index_asks_max` asks at once (beyond, an ask is dropped: its sender asks
again).

Bounded: the whole barrier takes at most `read_index_wait_s`, the append's own wait for an
election (append.py, `quorum_leader_wait_s`), so a read right after a leader change waits for
the new leader as an append does. Past it the read is refused with
`QuorumReadUnavailableError`, which ReadAPI answers as the gRPC status UNAVAILABLE naming why
(no leader known, the leader did not answer or did not confirm, or this broker's applier did not
reach the read index, with the applier's error). Why not proxy the read to the leader instead:
the barrier fails either because the leader cannot be reached or confirmed (an election, a
partition: a proxied read fails the same way) or because this member cannot apply what is
committed (a lagging or failing member: rare, and visible in its metrics and applier error);
a retryable status is honest in both cases, costs the leader nothing, and Gazette clients
(and ours, RetryReader) retry UNAVAILABLE, re-resolving the route. It never answers with what
this member has applied so far: that is exactly the silent stale read this barrier removes.

A leader that predates the read index (a rolling upgrade: this broker runs the new code, the
leader's does not yet) refuses the ask as a type its decoder does not know, INVALID_ARGUMENT
"unknown type 'ReadIndexAsk'", which the transport reports as the send's typed outcome
(`TypeRefused`: wire.py, transport.py). Waiting out the bound would make every non-blocking
read through this follower fail for as long as the upgrade lasts, so instead the follower
remembers that leader and term (`predates`: one pair per node) and serves non-blocking reads
up to its own commit offset, as before the read index: committed content only, but not
read-your-writes (an append acknowledged a moment ago may not show yet). It says so once per
term in a warning. Only that explicit refusal counts: an ask dropped, unanswered, refused
with another status or answered late is asked again, never downgraded. The next term's leader
is asked afresh (a restarted leader, upgraded, leads a newer term: its own leadership does not
survive the restart), and the pair is forgotten once a leader answers.

Cost: a non-blocking read through a follower pays one round trip to the leader, plus the
leader's register read (shared by every read and ask in flight), plus the wait until its own
applier catches up (normally the leader's next message, which it sends at once when the
commit moves). A read through the leader pays the register read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from broker.keyspace.backend import KeySpaceError
from broker.logging import get_logger
from broker.quorum.read_index import (
    REFUSED,
    ReadIndexAnswer,
    ReadIndexAsk,
    leader_read_index,
)
from broker.quorum.register import RegisterRead
from broker.quorum_shell.term_record import TermRecordDecodeError
from broker.quorum_shell.transport import SendOutcome, TypeRefused

if TYPE_CHECKING:
    from broker.quorum_shell.apply import CommitApplier
    from broker.quorum_shell.node import QuorumNode
    from broker.replica import Replica

log = get_logger(__name__)

# The longest a non-blocking read waits at the barrier (see the module docstring).
read_index_wait_s = 5.0
# An unanswered or refused ask is sent again after this, doubling up to the max.
read_index_retry_initial_s = 0.02
read_index_retry_max_s = 0.5
# Followers' asks a leader answers at once; beyond, an ask is dropped (its sender asks again).
read_index_asks_max = 64

T = TypeVar("T")


class QuorumReadUnavailableError(Exception):
    """A non-blocking read of a quorum journal could not learn, within the bound, how far it
    must read to see every acknowledged append: retry it (UNAVAILABLE)."""


class Coalesced(Generic[T]):
    """Runs `work` for its callers, one run at a time. A caller joins the run that has not
    started yet (or starts one); a caller arriving while a run is in progress waits for the
    next, so every answer a caller gets was computed wholly after it asked. Runs happen on a
    task `spawn` creates (cancelled with its owner: waiting callers then get
    QuorumReadUnavailableError)."""

    def __init__(
        self,
        work: Callable[[], Awaitable[T]],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self._work = work
        self._spawn = spawn
        self._next: asyncio.Future[T] | None = None
        self._running = False

    async def __call__(self) -> T:
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
            # Retrieved even when every caller went away (no "never retrieved" log).
            self._next.add_done_callback(lambda f: f.cancelled() or f.exception())
            if not self._running:
                self._running = True
                self._spawn(self._drain())
        return await asyncio.shield(self._next)

    async def _drain(self) -> None:
        try:
            while self._next is not None:
                future, self._next = self._next, None
                try:
                    result = await self._work()
                except asyncio.CancelledError:
                    future.set_exception(QuorumReadUnavailableError("the quorum node stopped"))
                    raise
                except Exception as err:
                    future.set_exception(err)
                else:
                    future.set_result(result)
        finally:
            self._running = False
            if self._next is not None and not self._next.done():
                self._next.set_exception(QuorumReadUnavailableError("the quorum node stopped"))
                self._next = None


class ReadBarrier:
    """One node's side of the read index: its own questions, and its answers to followers'
    asks while it leads (see the module docstring)."""

    def __init__(self, node: QuorumNode) -> None:
        self._node = node
        self.read_index = Coalesced(self._learn, node.spawn)
        self._confirmed = Coalesced(self._confirm, node.spawn)
        self.asks = 0  # questions this node asked (one per round: the current one's number)
        self._answer: asyncio.Future[int] | None = None
        self._answering = 0  # followers' asks being answered
        self.register_error: Exception | None = None  # the last failed register read
        # (term, leader) of a leader that refused the ask as an unknown type: it predates the
        # read index, and reads through this follower are served up to its own commit offset
        # while it leads that term (see the module docstring). One pair: bounded.
        self.predates: tuple[int, str] | None = None

    # --- Messages ----------------------------------------------------------------------------

    def receive(self, msg: ReadIndexAsk | ReadIndexAnswer) -> None:
        if isinstance(msg, ReadIndexAnswer):
            answer = self._answer
            if msg.ask == self.asks and answer is not None and not answer.done():
                answer.set_result(msg.commit_end)
            return
        node = self._node
        if not node.is_leader or msg.term != node.member.term:
            # Not the leader of the asker's term (fenced by term): it asks whom it knows next.
            node.send(msg.member, ReadIndexAnswer(node.member.term, node.name, msg.ask, REFUSED))
            return
        if self._answering >= read_index_asks_max:
            return  # dropped: the asker sends it again
        self._answering += 1
        node.spawn(self._answer_ask(msg))

    async def _answer_ask(self, ask: ReadIndexAsk) -> None:
        node = self._node
        try:
            offset = await self._confirmed()
        except QuorumReadUnavailableError:  # the node stopped meanwhile
            offset = None
        except Exception:  # a bug: refused (the asker retries), and said
            log.exception("quorum read index not confirmed", journal=node.journal)
            offset = None
        finally:
            self._answering -= 1
        commit_end = REFUSED if offset is None else offset
        node.send(ask.member, ReadIndexAnswer(node.member.term, node.name, ask.ask, commit_end))

    # --- The question --------------------------------------------------------------------------

    async def _learn(self) -> int:
        """The read index: the leader's commit offset as of after this call began. Raises
        QuorumReadUnavailableError past `read_index_wait_s`."""
        node = self._node
        loop = asyncio.get_running_loop()
        deadline = loop.time() + read_index_wait_s
        backoff = read_index_retry_initial_s
        self.asks += 1
        why = "no leader known"
        while True:
            if node.failure is not None:
                raise QuorumReadUnavailableError(f"the quorum node failed: {node.failure}")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise QuorumReadUnavailableError(
                    f"the leader's commit offset not learned within {read_index_wait_s} s"
                    f" (read_index_wait_s): {why}"
                )
            started, wait_s = loop.time(), min(backoff, remaining)
            leader = node.leader_name
            if not node.joined.is_set():
                why = "this member has not joined the journal yet"
            elif node.is_leader:
                try:
                    async with asyncio.timeout(remaining):
                        offset = await self._confirmed()
                except TimeoutError:
                    offset = None
                if offset is not None:
                    return offset
                why = "leading, but not confirmed yet (its term's barrier, or the term register)"
                if self.register_error is not None:
                    why += f"; term register: {self.register_error}"
            elif leader and leader != node.name:
                term = node.member.term
                if self.predates == (term, leader):
                    # As before the read index: what this member knows is committed.
                    return node.commit_offset
                answer: asyncio.Future[int] = loop.create_future()
                self._answer = answer
                sent = node.send(leader, ReadIndexAsk(term, node.name, self.asks))
                if sent is not None:
                    sent.add_done_callback(partial(self._sent, term, leader, answer))
                try:
                    async with asyncio.timeout(wait_s):
                        answered = await answer
                except TimeoutError:
                    why = f"no answer from the leader {leader}"
                else:
                    if answered != REFUSED:
                        self._answered(leader)
                        return answered
                    why = f"{leader} did not confirm it leads this member's term"
                finally:
                    self._answer = None
                if self.predates == (term, leader):
                    return node.commit_offset
            else:
                why = "no leader known (an election)"
            rest = wait_s - (loop.time() - started)
            if rest > 0:
                await asyncio.sleep(rest)
            backoff = min(backoff * 2, read_index_retry_max_s)

    def _sent(
        self,
        term: int,
        leader: str,
        answer: asyncio.Future[int],
        outcome: asyncio.Future[SendOutcome],
    ) -> None:
        """An ask's send ended: a leader that refused it as an unknown type predates the read
        index (only that refusal: see the module docstring)."""
        if outcome.cancelled() or outcome.exception() is not None:
            return
        if outcome.result() != TypeRefused(ReadIndexAsk.__name__):
            return
        if self.predates != (term, leader):
            self.predates = (term, leader)
            log.warning(
                "quorum leader predates the read index: non-blocking reads through this"
                " member are served up to its own commit offset, not read-your-writes, until"
                " the leader is upgraded",
                journal=self._node.journal,
                node=self._node.name,
                leader=leader,
                term=term,
            )
        if not answer.done():
            answer.set_result(REFUSED)  # wakes its question: it serves as before

    def _answered(self, leader: str) -> None:
        if self.predates is not None:
            self.predates = None
            log.info(
                "quorum leader answers the read index: reads through this member are"
                " read-your-writes again",
                journal=self._node.journal,
                node=self._node.name,
                leader=leader,
            )

    async def _confirm(self) -> int | None:
        """This leader's commit offset, if it may answer (read_index.leader_read_index) and
        the term register, read now, names it as the leader of its term; else None."""
        node = self._node
        member = node.member
        role = member.leader
        if role is None or leader_read_index(member, role.term) is None:
            return None
        try:
            async with asyncio.timeout(read_index_wait_s):
                reply = await node.register.answer(RegisterRead(node.coordinator.name, 0))
        except (KeySpaceError, TermRecordDecodeError, TimeoutError) as err:
            self.register_error = err
            return None
        self.register_error = None
        record = reply.current.record
        if record.term != role.term or record.leader != node.name or member.leader is not role:
            return None
        return leader_read_index(member, role.term)


async def wait_applied(
    applier: CommitApplier, replica: Replica, offset: int, timeout_s: float
) -> None:
    """Return once `applier` has applied the journal through `offset` to the spool of
    `replica`, the one reads are served from (not another this broker had before it);
    QuorumReadUnavailableError after `timeout_s`."""
    try:
        async with asyncio.timeout(timeout_s):
            while applier.applied_to(replica) < offset:
                applier.changed.clear()
                await applier.changed.wait()
    except TimeoutError:
        error = f" (its last error: {applier.error})" if applier.error is not None else ""
        raise QuorumReadUnavailableError(
            f"this broker applied the journal through {applier.applied}, not yet through the"
            f" read index {offset}, within {read_index_wait_s} s (read_index_wait_s){error}"
        ) from None
