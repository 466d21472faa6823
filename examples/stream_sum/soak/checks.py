"""What the soak checks after each fault: journals readable whole, the same through every broker
and over both APIs, and never rewritten; appends possible again (and how soon).

- `read_grpc` reads a journal from an offset (0: whole) to its write head *through one broker*
  (a Read RPC sent to that broker, which serves it or proxies it to a replica; persisted
  fragments are read from the store by the broker), and `read_http` the same through that
  broker's HTTP gateway. Transient failures are retried from the offset reached, a bounded
  number of times. An offset jump (content missing) is an error of its own, `ContentGapError`.
- `ContentLedger` compares what each (broker, API) read (a `Read`: its start and content):
  every read must agree with the one reaching furthest where they overlap, and extend what the
  previous check verified, byte for byte (a journal whose content shrank or changed lost
  acknowledged bytes, or had an offset written twice). A read from 0 is checked against the
  SHA-1 of everything verified before; a read from near the end (the soak's checks between
  whole reads, which would otherwise grow with the journals) against the last
  `overlap_bytes` verified. JSON-lines journals must hold whole, decodable lines with a UUID
  each. Persisted fragments (the Fragments RPC) must hold exactly the content at their offsets
  (`check_fragments`: each fragment once, when a read covers it).
- `read_member` reads a quorum journal's committed range from one member, served by that
  broker itself (not proxied to the leader): every member must hold identical bytes.
- `probe_append` appends nothing (an empty append is a write barrier that still goes through
  the journal's primary and its replication pipeline) until one succeeds: how long appends to a
  journal were impossible.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final, NamedTuple

import aiohttp
import grpc
import grpc.aio
import msgspec

from broker.client.appender import append
from broker.client.list_apply import list_all_fragments
from broker.client.route_cache import ChannelPool, JournalClient
from broker.fragment.naming import digest_of_sum
from broker.protocol import protocol_pb2 as pb
from examples.stream_sum.verifier import Finding

__all__ = [
    "ContentGapError",
    "ContentLedger",
    "Read",
    "ReadFailedError",
    "check_fragments",
    "probe_append",
    "read_grpc",
    "read_http",
    "read_member",
]

# Attempts of one whole-journal read (through one broker, one API) before it is reported failed.
read_attempts_max: Final = 6
# How long a read may keep finding content below the write head that the broker it goes through
# does not hold yet (not in its spool, not listed from the store: a replica restarted after a
# fault, whose recovered spool was set aside, serves it only once another replica's upload of it
# is listed, as Gazette's brokers do) before it is reported failed. Generous against the soak's
# 1 s listing refresh and an upload's retries after a store outage; far below "never".
not_listed_wait_s_max: Final = 30.0
# Back-off between read attempts and between probe appends: doubling, capped.
backoff_initial_s: Final = 0.05
backoff_max_s: Final = 1.0
# One read RPC or HTTP request, and one probe append, may take this long.
read_rpc_timeout_s: Final = 30.0
# An HTTP read's body is taken this many bytes at a time.
http_piece_bytes: Final = 1 << 16
probe_attempt_timeout_s: Final = 5.0
# Bytes of a journal quoted when its content is malformed.
quote_bytes: Final = 120
# A read that does not start at 0 starts this far before the end of what was verified, which it
# must repeat byte for byte (and the ledger keeps that much of each journal).
overlap_bytes: Final = 64 << 10


class Read(NamedTuple):
    """What one (broker, API) read of a journal: `content` from offset `start`."""

    start: int
    content: bytes

    @property
    def end(self) -> int:
        return self.start + len(self.content)


class ReadFailedError(RuntimeError):
    """A journal could not be read through a broker (after retries)."""


class ContentGapError(ReadFailedError):
    """A read skipped content: the broker resolved an offset past the one asked for."""


_TRANSIENT_GRPC: Final = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)
# Statuses a read may get while the cluster converges (a route being re-assigned).
_TRANSIENT_STATUS: Final = frozenset(
    {pb.NOT_JOURNAL_BROKER, pb.INSUFFICIENT_JOURNAL_BROKERS, pb.NO_JOURNAL_PRIMARY_BROKER}
)
_TRANSIENT_HTTP: Final = frozenset({502, 503, 504})


class _NotListedYet(Exception):
    """A read found content below the write head that its broker does not hold yet."""


async def _retrying(
    what: str,
    read_once: Callable[[], Awaitable[bool]],
    last_error: list[str],
    *,
    not_listed_wait_s: float = not_listed_wait_s_max,
) -> None:
    """Call `read_once` until it returns True (done); retry its transient failures (it
    returns False, having put why in `last_error`) with back-off, at most
    `read_attempts_max` times. Content not listed yet at the broker (`_NotListedYet`) is
    waited for instead, with the same back-off, for at most `not_listed_wait_s` in all."""
    delay = backoff_initial_s
    attempt = 0
    not_listed_since: float | None = None
    while True:
        try:
            if await read_once():
                return
            attempt += 1
            if attempt == read_attempts_max:
                last = last_error[0] if last_error else "?"
                raise ReadFailedError(
                    f"{what}: still failing after {read_attempts_max} attempts ({last})"
                )
        except _NotListedYet as err:
            now = time.monotonic()
            not_listed_since = now if not_listed_since is None else not_listed_since
            if now - not_listed_since >= not_listed_wait_s:
                raise ReadFailedError(
                    f"{what}: {err} for {now - not_listed_since:.1f} s"
                    f" (at most {not_listed_wait_s:g} s waited)"
                ) from None
        await asyncio.sleep(delay)
        delay = min(backoff_max_s, delay * 2)


async def read_grpc(channels: ChannelPool, endpoint: str, journal: str, start: int = 0) -> bytes:
    """`journal`'s content from `start` to its write head, read through the broker at
    `endpoint`."""
    out = bytearray()
    last_error: list[str] = []

    async def once() -> bool:
        at = start + len(out)
        request = pb.ReadRequest(journal=journal, offset=at, block=False)
        try:
            call = channels.stub(endpoint).Read(request, timeout=read_rpc_timeout_s)
            async for resp in call:
                if resp.status == pb.OFFSET_NOT_YET_AVAILABLE:
                    if resp.write_head > start + len(out):
                        # Below the write head: content this broker cannot serve yet (not
                        # persisted, and not in its spool), not the journal's end.
                        raise _NotListedYet(_below_head(start + len(out), resp.write_head))
                    return True
                if resp.status in _TRANSIENT_STATUS:
                    last_error[:] = [pb.Status.Name(resp.status)]
                    return False
                if resp.status != pb.OK:
                    raise ReadFailedError(
                        f"{journal} via {endpoint} (gRPC): {pb.Status.Name(resp.status)}"
                        f" at offset {start + len(out)}"
                    )
                at = start + len(out)
                if resp.offset != at and (resp.content or resp.HasField("fragment")):
                    raise ContentGapError(
                        f"{journal} via {endpoint} (gRPC): read at {at} resolved to"
                        f" {resp.offset}: bytes [{at}, {resp.offset}) are missing"
                    )
                out.extend(resp.content)
            # Ended before the write head (a replica went away under the read): go on.
            last_error[:] = [
                f"the stream ended at offset {start + len(out)}, before the write head"
            ]
            return False
        except grpc.aio.AioRpcError as err:
            if err.code() not in _TRANSIENT_GRPC:
                raise ReadFailedError(
                    f"{journal} via {endpoint} (gRPC) at offset {start + len(out)}:"
                    f" {err.code().name} {err.details()}"
                ) from None
            last_error[:] = [f"{err.code().name} {err.details()}"]
            return False

    await _retrying(f"{journal} via {endpoint} (gRPC)", once, last_error)
    return bytes(out)


async def read_http(
    session: aiohttp.ClientSession, base: str, journal: str, start: int = 0
) -> bytes:
    """`journal`'s content from `start` to its write head, read through the HTTP gateway at
    `base` (GETs with ``block=false`` from the offset reached, until the gateway answers 416 at
    the write head)."""
    out = bytearray()
    last_error: list[str] = []

    async def once() -> bool:
        while True:
            url = f"{base}/{journal}"
            at = start + len(out)
            params = {"offset": str(at), "block": "false"}
            # Bounded per read of the socket, not in total: a GET answers the rest of the
            # journal (100 MB and more after an hour, through a loaded S3 server), and what it
            # received before a failure is kept (the next GET goes on from there).
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=read_rpc_timeout_s, sock_read=read_rpc_timeout_s
            )
            got = 0
            try:
                async with session.get(url, params=params, timeout=timeout) as resp:
                    if resp.status == 416:
                        head = int(resp.headers.get("X-Write-Head", "0") or 0)
                        if head > at:  # Not the end: see read_grpc.
                            raise _NotListedYet(_below_head(at, head))
                        return True  # At the write head.
                    if resp.status in _TRANSIENT_HTTP:
                        last_error[:] = [f"HTTP {resp.status} {(await resp.text()).strip()}"]
                        return False
                    if resp.status != 206:
                        text = (await resp.text()).strip()
                        raise ReadFailedError(
                            f"{journal} via {base} (HTTP) at offset {at}: {resp.status} {text}"
                        )
                    offset = _content_range_offset(resp.headers.get("Content-Range", ""))
                    if offset != at:
                        raise ContentGapError(
                            f"{journal} via {base} (HTTP): read at {at} resolved to"
                            f" {offset}: bytes [{at}, {offset}) are missing"
                        )
                    async for piece in resp.content.iter_chunked(http_piece_bytes):
                        out.extend(piece)
                        got += len(piece)
            except (aiohttp.ClientError, TimeoutError) as err:
                # Includes a body cut short (the gateway closes the connection on an error):
                # the bytes before the cut are the journal's, at their offsets.
                if got:
                    continue  # Progress: not a failed attempt.
                last_error[:] = [f"{type(err).__name__}: {err}"]
                return False
            if not got:
                last_error[:] = [f"an empty 206 at offset {at}"]
                return False

    await _retrying(f"{journal} via {base} (HTTP)", once, last_error)
    return bytes(out)


async def read_member(
    channels: ChannelPool, endpoint: str, suffix: str, journal: str, start: int, end: int
) -> bytes:
    """`journal`'s content [start, end) as the broker `suffix` at `endpoint` serves it *itself*
    (a quorum member's own committed content: a stream that broker proxied to another, or
    answered NOT_JOURNAL_BROKER, is tried again; so is one ended early). Blocking reads: a
    follower applies a commit a heartbeat after the leader. Raises ReadFailedError after
    `read_attempts_max` attempts, ContentGapError on an offset jump."""
    out = bytearray()
    last_error: list[str] = []
    where = f"{journal} via {suffix} (its own)"

    async def once() -> bool:
        at = start + len(out)
        if at >= end:
            return True
        request = pb.ReadRequest(journal=journal, offset=at, block=True)
        try:
            call = channels.stub(endpoint).Read(request, timeout=read_rpc_timeout_s)
            try:
                async for resp in call:
                    if resp.HasField("header") and resp.header.process_id.suffix != suffix:
                        served = resp.header.process_id.suffix or "nobody"
                        last_error[:] = [f"served by {served}, not by {suffix} itself"]
                        return False
                    if resp.status != pb.OK:
                        last_error[:] = [pb.Status.Name(resp.status)]
                        return False
                    if resp.offset != start + len(out) and (
                        resp.content or resp.HasField("fragment")
                    ):
                        raise ContentGapError(
                            f"{where}: read at {start + len(out)} resolved to {resp.offset}"
                        )
                    out.extend(resp.content)
                    if start + len(out) >= end:
                        return True
            finally:
                call.cancel()
        except grpc.aio.AioRpcError as err:
            last_error[:] = [f"{err.code().name} {err.details()}"]
            return False
        last_error[:] = [f"the stream ended at offset {start + len(out)}, before {end}"]
        return False

    await _retrying(where, once, last_error)
    return bytes(out[: end - start])


def _below_head(offset: int, write_head: int) -> str:
    return (
        f"no content available at offset {offset}, below the write head {write_head}"
        " (not persisted yet, and not held by this broker)"
    )


def _content_range_offset(header: str) -> int:
    # "bytes <offset>-<max>/<max>"
    try:
        return int(header.split()[1].split("-")[0])
    except (IndexError, ValueError):
        raise ReadFailedError(f"malformed Content-Range {header!r}") from None


@dataclass
class _Verified:
    length: int
    prefix: hashlib._Hash  # SHA-1 of the content [0, length).
    tail: bytes  # The content [length - len(tail), length).


class ContentLedger:
    """See the module docstring. One ledger lives through the whole soak."""

    def __init__(self, json_journals: set[str]) -> None:
        self._json = json_journals
        self._verified: dict[str, _Verified] = {}

    def verified_length(self, journal: str) -> int:
        v = self._verified.get(journal)
        return 0 if v is None else v.length

    def read_start(self, journal: str) -> int:
        """Where a read of `journal` that need not be whole starts: `overlap_bytes` before the
        end of what was verified."""
        return max(0, self.verified_length(journal) - overlap_bytes)

    def check(self, journal: str, reads: Mapping[str, Read | bytes]) -> list[Finding]:
        """`reads`: what each source (e.g. ``broker-a1/gRPC``) read of `journal` (bytes: read
        from offset 0). Every read starts at most at `verified_length`."""
        if not reads:
            return [Finding("unreadable", f"{journal}: no broker could be read")]
        got = {s: r if isinstance(r, Read) else Read(0, r) for s, r in reads.items()}
        before = self._verified.get(journal)
        length = before.length if before is not None else 0
        for source, r in got.items():
            if r.start > length:
                raise ValueError(f"{journal}: {source} starts at {r.start}, past {length}")
        findings: list[Finding] = []
        # The furthest read (the earliest start among those): the others must agree with it.
        ref_source, ref = max(got.items(), key=lambda kv: (kv[1].end, -kv[1].start))
        for source, r in sorted(got.items()):
            lo = max(r.start, ref.start)
            mine = r.content[lo - r.start :]
            theirs = ref.content[lo - ref.start : lo - ref.start + len(mine)]
            if mine != theirs:
                at = lo + _first_difference(theirs, mine)
                findings.append(
                    Finding(
                        "content differs",
                        f"{journal}: {source} and {ref_source} differ at offset {at}"
                        f" ({source} read [{r.start}, {r.end}), {ref_source}"
                        f" [{ref.start}, {ref.end}))",
                    )
                )
        if before is not None:
            tail_start = length - len(before.tail)
            for source, r in sorted(got.items()):
                if r.end < length:
                    findings.append(
                        Finding(
                            "content lost",
                            f"{journal}: {source} reads to offset {r.end}; {length} bytes"
                            " were verified before (acknowledged content is gone)",
                        )
                    )
                    continue
                if r.start == 0:
                    rewritten = hashlib.sha1(r.content[:length]).digest() != before.prefix.digest()
                else:
                    lo = max(r.start, tail_start)
                    rewritten = (
                        r.content[lo - r.start : length - r.start] != before.tail[lo - tail_start :]
                    )
                if rewritten:
                    findings.append(
                        Finding(
                            "content rewritten",
                            f"{journal}: {source}: content below offset {length} changed since"
                            " the last check (an offset written twice)",
                        )
                    )
        if journal in self._json and ref.end > length:
            findings.extend(_check_json_lines(journal, ref, length))
        if not findings:
            prefix = before.prefix.copy() if before is not None else hashlib.sha1()
            prefix.update(ref.content[length - ref.start :])
            known = ref.content
            if before is not None and ref.start > length - len(before.tail):
                # The reads started late (a short read): the rest of the tail is the old one's.
                known = before.tail[: ref.start - (length - len(before.tail))] + known
            self._verified[journal] = _Verified(ref.end, prefix, known[-overlap_bytes:])
        return findings


class _Line(msgspec.Struct):
    UUID: str


_DECODE_LINE: Final = msgspec.json.Decoder(_Line)


def _check_json_lines(journal: str, read: Read, start: int) -> list[Finding]:
    """The lines of `read` from journal offset `start` (>= read.start)."""
    content, base = read.content, read.start
    rel = start - base
    # At rel 0 (start > 0) the byte before is not in this read: the previous check verified
    # that a line ended there.
    if rel > 0 and content[rel - 1 : rel] != b"\n":
        return [Finding("torn content", f"{journal}: no line ends at offset {start}")]
    offset = start
    for line in content[rel:].split(b"\n"):
        if offset >= read.end:
            break
        try:
            _DECODE_LINE.decode(line)
        except msgspec.DecodeError as err:
            quoted = line[:quote_bytes]
            return [
                Finding(
                    "torn content", f"{journal}: a bad line at offset {offset} ({err}): {quoted!r}"
                )
            ]
        offset += len(line) + 1
    if not content.endswith(b"\n"):
        return [Finding("torn content", f"{journal}: content ends inside a line")]
    return []


def _first_difference(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


async def check_fragments(
    client: JournalClient, journal: str, read: Read, verified: set[tuple[int, int, bytes]]
) -> list[Finding]:
    """Every persisted fragment of `journal` within `read` must hold exactly that content (its
    SHA-1 sum); a fragment beyond it is fine (the journal grew since it was read), and one
    before its start is checked by a later read that covers it. `verified` holds the fragments
    checked already (begin, end, SHA-1), each checked once. A failed listing is a finding too."""
    try:
        response = await list_all_fragments(
            client, pb.FragmentsRequest(journal=journal), timeout_s=read_rpc_timeout_s
        )
    except Exception as err:
        return [Finding("fragments unlisted", f"{journal}: {type(err).__name__}: {err}")]
    out = []
    for f in response.fragments:
        spec = f.spec
        if not spec.backing_store or spec.begin == spec.end:
            continue
        key = (spec.begin, spec.end, digest_of_sum(spec.sum))
        if key in verified or spec.begin < read.start or spec.end > read.end:
            continue
        content = read.content[spec.begin - read.start : spec.end - read.start]
        if hashlib.sha1(content).digest() != key[2]:
            out.append(
                Finding(
                    "fragment differs",
                    f"{journal}: persisted fragment [{spec.begin}, {spec.end}) in"
                    f" {spec.backing_store} does not hold the journal's content there",
                )
            )
        else:
            verified.add(key)
    return out


class ProbeTimeoutError(TimeoutError):
    """No append to a journal succeeded within the probe's deadline."""


async def probe_append(
    client_of: Callable[[], JournalClient], journal: str, started_at: float, deadline_s: float
) -> float:
    """Append nothing to `journal` until an append succeeds; the seconds from `started_at`
    (monotonic) to that success. Each attempt uses a new client from `client_of`, closed
    after it. Raises ProbeTimeoutError (with the last error) past `deadline_s` after
    `started_at`."""
    delay = backoff_initial_s
    last = "no attempt"
    while True:
        remaining = started_at + deadline_s - time.monotonic()
        if remaining <= 0:
            raise ProbeTimeoutError(
                f"{journal}: no append succeeded within {deadline_s:.0f}s (last: {last})"
            )
        client = client_of()
        try:
            async with asyncio.timeout(min(probe_attempt_timeout_s, remaining)):
                await append(client, pb.AppendRequest(journal=journal), b"", attempts_max=1)
            return time.monotonic() - started_at
        except Exception as err:  # Any failure: the probe retries until its deadline.
            last = f"{type(err).__name__}: {err}"[:300]
        finally:
            await client.close()
        await asyncio.sleep(delay)
        delay = min(backoff_max_s, delay * 2)
