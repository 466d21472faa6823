"""RetryReader: a Reader that survives broker restarts, reassignments and transient errors.

A Read RPC ends for many ordinary reasons: the broker serving it exits or loses the journal's
assignment, a directly read fragment is read through, a network blip breaks the stream. The
RetryReader starts a new Reader at the offset where the last one stopped, so that its caller sees
one continuous stream of chunks (with visible offset jumps, as Reader's).

Back-off. Consecutive failed attempts wait exponentially longer before the next one: from
`backoff_initial_s`, doubling up to `backoff_max_s`, each delay drawn with jitter from
[1 - backoff_jitter, 1] of its value (so that readers failed by one event do not retry in
step). An attempt *failed* unless it made progress: its offset advanced (content, or a jump),
or it stood healthy for at least `attempt_healthy_s` (answered OK, or ended by the broker
without an error: say blocked at the head of a quiet journal) before it ended. Merely being
answered OK does not count: a broker that answers the metadata and then fails every read at
once must not be hammered.

What is surfaced rather than retried:
- the end of `end_offset`, or of a `metadata_only` read: the read is complete (an empty chunk;
  the metadata is in `reader.response`);
- OFFSET_NOT_YET_AVAILABLE of a non-blocking read (the caller asked not to wait);
- JOURNAL_NOT_FOUND, after a few attempts that ride out the propagation of a just-created
  journal (at once if the request carried a header: the broker already honoured its revision);
- lost or corrupt content (`DataLossError`: the broker's DATA_LOSS, or a directly read fragment
  that fails verification): reading again reads the same bytes;
- other non-retriable statuses (NOT_ALLOWED, SUSPENDED, ...), gRPC errors that a retry cannot
  fix (invalid argument, unimplemented, permission), and malformed responses;
- cancellation of the caller's task;
- what `verify` raises (see below), unless it is retried as the read's own errors are;
- `attempts_max` consecutive failed attempts (one to two minutes of back-off with the
  defaults): a reader that makes no progress for that long is not going to.

`verify`, if given, is awaited with the journal's name when a Read RPC first answers with
content, before that content is handed out (the first RPC's too), and before the next RPC after
one ended (by an error, or by the broker); after a fragment read directly from its store (the
common, ordinary end of a catching-up read) both only if `verify_direct_every_s` passed since
the last check. A caller that must know the journal is still the one it was reading (a
consumer shard, gazette_consumer/source_revisions.py) checks there: the check after the answer
leaves no window between a check and the read it covers (an incarnation the broker served
before the check is the one the check finds, or an older one: revisions only grow), and the
check before the RPC finds a journal created again at once, rather than once its new content
passed the offset read. With the name comes the etcd revision of the answer checked (its
header's: the keyspace the reading broker served it from; before an RPC, the last answer's;
0 if none): the check must look at the journal as of that revision or later, since the broker
it asks may lag the one that served the read, and an older view may show the incarnation
before the one read.
Its errors are classified as the read's own: a transient one (the broker it asks is down) is an
attempt failed, and the check runs again before the next.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Final

import grpc
import grpc.aio

from broker.client.reader import (
    Chunk,
    DataLossError,
    FragmentContentError,
    OpenURL,
    Reader,
    ReadProtocolError,
    open_url,
)
from broker.client.route_cache import JournalClient
from broker.fragment.stores.base import StoreError
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import (
    GazetteError,
    JournalNotFoundError,
    OffsetNotYetAvailableError,
)

if TYPE_CHECKING:
    from broker.fragment.stores.registry import StoreRegistry

log = get_logger(__name__)

# Consecutive failed attempts (without progress) before the RetryReader gives up.
attempts_max_default: Final = 30
# Attempts at reading a journal not found, when the request has no header: a journal created
# a moment ago may not have reached every broker's view of etcd yet.
journal_not_found_attempts_max: Final = 3
# Back-off before retry `attempt` (1-based): backoff_initial_s, doubling up to backoff_max_s.
# Most retries wait for the cluster to agree on a journal's assignment, which takes a few etcd
# watch round trips; a failure that outlasts that (a broker down, a store unavailable) is
# retried every few seconds, not hammered.
backoff_initial_s: Final = 0.05
backoff_max_s: Final = 5.0
# Each delay is drawn from [1 - backoff_jitter, 1] of its value.
backoff_jitter: Final = 0.5
# An attempt answered OK that lasted at least this long before failing made progress (it was
# healthy until then: e.g. blocked at the head of a quiet journal), so the failure count resets.
attempt_healthy_s: Final = backoff_max_s

Verify = Callable[[str, int], Awaitable[None]]
"""A check of the journal read (see the module docstring): its name, and the etcd revision the
check must see the journal at, at least."""

# After a fragment read directly from its store, `verify` is awaited again only this long after
# the last time: a catching-up reader ends an RPC per fragment, and the check is a List RPC.
verify_direct_every_s: Final = 30.0

# gRPC codes no retry can fix.
_FATAL_CODES: Final = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)


def _unavailable(err: grpc.aio.AioRpcError) -> bool:
    return bool(err.code() == grpc.StatusCode.UNAVAILABLE)


def backoff_s(attempt: int, draw: float = 0.0) -> float:
    """Delay before retry `attempt` (1-based), given a uniform `draw` in [0, 1) for jitter (0:
    the full delay)."""
    exponent = min(max(attempt, 1) - 1, 32)  # 2**32 * initial is past any max: no overflow.
    base = min(backoff_max_s, backoff_initial_s * 2.0**exponent)
    return base * (1.0 - backoff_jitter * draw)


class RetryReader:
    """See the module docstring. `request` is copied; `offset` is the next offset to read."""

    def __init__(
        self,
        client: JournalClient,
        request: pb.ReadRequest,
        *,
        registry: StoreRegistry | None = None,
        opener: OpenURL = open_url,
        attempts_max: int = attempts_max_default,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
        verify: Verify | None = None,
    ) -> None:
        if attempts_max < 1:
            raise ValueError(f"attempts_max: must be >= 1 (got {attempts_max})")
        self.client = client
        self._registry = registry
        self._opener = opener
        self._attempts_max = attempts_max
        self._verify = verify
        self._verify_pending = False
        # Check again once the current RPC answered with content, before handing it out (the
        # first RPC's too): see the module docstring.
        self._verify_answered = verify is not None
        self._held: Chunk | None = None
        self._sleep = sleep
        self._clock = clock
        self._verified_at = clock()
        self._jitter = jitter
        self._attempt_started = 0.0
        self._attempt_offset = 0
        self.reader = self._new_reader(request)
        self.restarts = 0

    def _new_reader(self, request: pb.ReadRequest) -> Reader:
        self._attempt_started = self._clock()
        self._attempt_offset = request.offset
        return Reader(self.client, request, registry=self._registry, opener=self._opener)

    @property
    def journal(self) -> str:
        return self.reader.request.journal

    @property
    def offset(self) -> int:
        held = self._held
        return held.offset if held is not None else self.reader.offset

    @property
    def request(self) -> pb.ReadRequest:
        return self.reader.request

    @property
    def response(self) -> pb.ReadResponse:
        """The latest metadata response (of the current Reader, or of the one before it until
        the current one has one): e.g. the write head a non-blocking read stopped below."""
        return self.reader.response

    @property
    def header(self) -> pb.Header:
        """The header of the latest response that carried one (Reader.header)."""
        return self.reader.header

    @property
    def jumps(self) -> int:
        return self.reader.jumps

    async def read(self) -> bytes:
        """The next chunk's content; b"" only once `end_offset` is read through."""
        return (await self.read_chunk()).content

    async def read_chunk(self) -> Chunk:
        """The next chunk (see Reader.read_chunk), retrying failures (see the module docstring).
        Raises what is not retried, DataLossError among them."""
        held = self._held
        if held is not None:  # Read, but its check did not complete (cancelled, or failed).
            await self._verify_answer(held)
            return held
        attempt = 0
        while True:
            try:
                if self._verify_pending:
                    await self._verify_journal()
                chunk = await self.reader.read_chunk()
            except Exception as err:
                # The Reader is spent either way: the next read, now or after surfacing the
                # error, continues with a fresh one where it stopped.
                progressed = await self._renew(clean=False)
                if isinstance(err, grpc.aio.AioRpcError) and _unavailable(err):
                    # The broker read from may be gone (it exited or crashed): go through the
                    # default broker next, which knows the journal's current route.
                    self.client.update_route(self.journal, None)
                attempt = self._attempt_after(err, 0 if progressed else attempt)
            else:
                if chunk.content and self._verify_answered:
                    await self._verify_answer(chunk)
                if chunk.content or self._complete():
                    return chunk
                # The RPC (or a directly read fragment) ended: continue with a new one. One that
                # ended without making progress counts as a failed attempt.
                attempt = 0 if await self._renew(clean=True) else attempt + 1
                if attempt >= self._attempts_max:
                    raise ConnectionError(
                        f"reading {self.journal}: {attempt} consecutive Read RPCs ended without"
                        " progress"
                    )
            if attempt:
                await self._sleep(backoff_s(attempt, self._jitter()))
                self._attempt_started = self._clock()  # The next attempt starts now.

    async def _verify_journal(self) -> None:
        assert self._verify is not None
        # The current RPC's answer's revision (before it answers: the last RPC's, kept).
        await self._verify(self.journal, self.reader.header.etcd.revision)
        self._verify_pending = False
        self._verified_at = self._clock()

    async def _verify_answer(self, chunk: Chunk) -> None:
        """`verify`, now that the RPC answered with `chunk`, which is held back meanwhile:
        transient errors are retried here (as the read's own, bounded alike), leaving the RPC
        as it is; until the check passes, a cancelled or failed call leaves the chunk held, and
        the next call checks it again before handing it out (found by review: moving the
        offset back instead left a reader cancelled here with its RPC ahead of its offset)."""
        self._held = chunk
        attempt = 0
        while True:
            try:
                await self._verify_journal()
                break
            except Exception as err:
                attempt = self._attempt_after(err, attempt)
            await self._sleep(backoff_s(attempt, self._jitter()))
        self._held = None
        self._verify_answered = False

    def _complete(self) -> bool:
        request = self.reader.request
        if request.metadata_only:
            return True  # One answer is all a metadata read wants.
        return request.end_offset != 0 and self.reader.offset >= request.end_offset

    def _attempt_after(self, err: Exception, attempt: int) -> int:
        """The attempt count after `err` (`attempt` failures before it), or raise `err` if it
        is not to be retried."""
        if not self._retriable(err, attempt):
            raise err
        attempt += 1
        if attempt >= self._attempts_max:
            raise err
        log.warning(
            "read failed (will retry)",
            journal=self.journal,
            offset=self.offset,
            attempt=attempt,
            error=str(err),
        )
        return attempt

    def _retriable(self, err: Exception, attempt: int) -> bool:
        if isinstance(err, DataLossError):
            return False  # Reading again reads the same lost or corrupt bytes.
        if isinstance(err, OffsetNotYetAvailableError):
            # A caller may make a non-blocking reader blocking; then it waits at the head.
            return self.reader.request.block
        if isinstance(err, JournalNotFoundError):
            return (
                not self.reader.request.HasField("header")
                and attempt < journal_not_found_attempts_max
            )
        if isinstance(err, GazetteError):
            return err.retriable
        if isinstance(err, grpc.aio.AioRpcError):
            return err.code() not in _FATAL_CODES
        if isinstance(err, ReadProtocolError):
            return False
        return isinstance(err, FragmentContentError | StoreError | OSError)

    async def _renew(self, *, clean: bool) -> bool:
        """Replace the spent Reader with a new one continuing where it stopped. Returns whether
        the spent one made progress (see the module docstring); `clean`: it ended without an
        error."""
        spent = self.reader
        lasted = self._clock() - self._attempt_started >= attempt_healthy_s
        progressed = spent.offset > self._attempt_offset or (
            lasted and (clean or spent.ok_responses > 0)
        )
        request = pb.ReadRequest()
        request.CopyFrom(spent.request)
        await spent.close()
        if self._verify is not None and (
            not spent.read_directly or self._clock() - self._verified_at >= verify_direct_every_s
        ):
            # The RPC ended (a broker stopping, the journal deleted...): whatever the caller
            # checks of the journal is checked again before the next one reads on. After a
            # fragment read directly, at most every `verify_direct_every_s`.
            self._verify_pending = self._verify_answered = True
        self.reader = self._new_reader(request)
        self.reader.jumps = spent.jumps
        self.reader.response = spent.response
        self.reader.header = spent.header
        self.restarts += 1
        return progressed

    async def seek(self, offset: int) -> None:
        """Continue reading at `offset` (a new RPC)."""
        request = pb.ReadRequest()
        request.CopyFrom(self.reader.request)
        request.offset = offset
        await self.reader.close()
        self.reader = self._new_reader(request)
        self._held = None
        self._verify_answered = self._verify is not None  # A new RPC: its answer is checked.

    async def close(self) -> None:
        await self.reader.close()

    def __aiter__(self) -> AsyncIterator[Chunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[Chunk]:
        while True:
            chunk = await self.read_chunk()
            if not chunk.content:
                return
            yield chunk
