"""Where a partition's bytes come from: persisted fragments read straight from their store, the
rest from a broker; and what happens to content that is lost.

A partition reads a range [begin, end) of a journal through a `JournalSource`, chunk by chunk.
The source knows the journal's fragments (fragment_plan.py): those overlapping the range are
read straight from their store, `file://` or `s3://` (a signed URL from the broker's
ListFragments, or the store itself, from option `store`), decompressed and verified against
their names (SHA1 and length: broker/fragment/verify.py) before any byte is handed out (a
fragment of up to `fragment_verify_bytes_max`; a larger one is verified as it streams, its SHA1
at its end). Content no store holds yet (the open fragment, fragments not yet persisted) is read
from a broker, `end`-bounded and blocking, as a Read of that range.

Lost content. A gap between fragments (removed by retention, or never persisted; through a
broker, once it served none of the gap for `gap_wait_s`), a fragment whose file is missing or
does not hold its content, or a broker that answers DATA_LOSS or jumps over removed content:
each is a range of the journal that cannot be read. With
`failOnDataLoss` true (the default, as Kafka's source) the read fails with
`GazetteDataLossError` naming the journal, the range and why; with false, the range is skipped
with a warning (logged, and counted in `lost_bytes`), as Kafka's source skips offsets it can no
longer read. Bytes of a fragment that fails verification are never handed out, unless the
fragment was larger than `fragment_verify_bytes_max` and the mismatch showed at its end: then
the read fails whatever `failOnDataLoss` says (its bytes were delivered).

In broker mode a fragment whose file cannot be opened here (a store this host cannot reach, an
expired signed URL) is read through the broker instead, which reads the same file and verifies
it the same way.

Whole fragments, read ahead. A fragment up to `fragment_verify_bytes_max` is loaded whole: its
file read in as few thread hops as the store allows, then decompressed and verified (SHA1) in a
worker thread, where hashing and decompression run without the GIL. While the reader decodes
one fragment, the next ones it will read are loaded (up to `read_ahead_bytes_max` of them): a
planner's walk or a partition then decodes while the next files are read and hashed on the
other core, instead of in turn on one (the driver's walk, 1M rows: SHA1 0.16 s and the
streaming reader's 32 KiB steps ~0.15 s of its ~0.9 s CPU were on its loop).
Larger fragments stream through `FragmentContentReader`, verified at their end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from broker.client.reader import (
    Chunk,
    FragmentContentReader,
    missing_fragment_error,
    raw_chunk_bytes_max,
)
from broker.client.retry_reader import RetryReader
from broker.client.route_cache import JournalClient
from broker.fragment.stores.base import FragmentNotFoundError, FragmentReader, StoreError
from broker.fragment.stores.registry import open_url
from broker.fragment.verify import (
    DataLossError,
    FragmentIntegrityError,
    IntegrityFailure,
    VerifyingDecoder,
)
from broker.protocol import protocol_pb2 as pb

if TYPE_CHECKING:
    # (The registry imports a store's backend, boto3 for s3://, only when a URL of its scheme
    # is first built: a worker reading signed file:// URLs imports none.)
    from broker.fragment.stores.registry import StoreRegistry

# How long a read through a broker waits at a gap between the planned fragments while the broker
# serves none of it (option storeGapGraceSeconds): past it, the gap is lost content. A broker
# itself waits for such a gap to be filled (an upload retried late) until the fragment after it
# is 6 hours old (offset_jump_age_s), which would hold a Spark task that long.
gap_wait_s_default: Final = 900.0
# A fragment up to this size is decoded and verified whole before its first byte is handed out.
fragment_verify_bytes_max: Final = 256 << 20
# Pieces a fragment's content is handed out in.
fragment_chunk_bytes_max: Final = 4 << 20
# A fragment file is read in pieces of at least this: each read is a hop to a worker thread,
# and the content reader asks for pieces sized for a broker's streamed responses (32 KiB), a
# hop each (a thousand hops a 32 MiB of file, ~0.1 s of the driver's planning walk per 60 MB).
file_read_bytes_min: Final = 1 << 20
# Content of the fragments loaded ahead of the one being handed out (module docstring): a read
# holds at most this much more (and their stored bytes while they load). A larger fragment is
# loaded when its turn comes.
read_ahead_bytes_max: Final = 16 << 20
# A fragment's stored file may be larger than its content (a codec's framing of incompressible
# content): by at most this fraction of it, plus `stored_slack_bytes`. A larger file is not the
# fragment's (IntegrityFailure.LONG), and is not read further.
stored_growth_max: Final = 0.25
stored_slack_bytes: Final = 1 << 16

_log = logging.getLogger(__name__)


class GazetteDataLossError(DataLossError):
    """Content of a journal in [begin, end) cannot be read: it was removed, or its fragment's
    file is missing or corrupt. Raised when option failOnDataLoss is true (the default)."""

    def __init__(self, journal: str, begin: int, end: int, reason: str) -> None:
        super().__init__(
            journal,
            f"journal {journal}: content [{begin}, {end}) cannot be read: {reason}. Set option"
            " failOnDataLoss to false to skip lost content (with a warning) instead",
        )
        self.begin = begin
        self.end = end


@dataclass(frozen=True)
class FragmentRef:
    """A fragment of a partition's journal: its protocol value (serialized: partitions are
    pickled) and the signed URL of its file ("" for one read through its store, or through a
    broker when it has no backing store)."""

    begin: int
    end: int
    spec: bytes
    url: str = ""

    @classmethod
    def of(cls, fragment: pb.Fragment, url: str = "") -> FragmentRef:
        return cls(fragment.begin, fragment.end, fragment.SerializeToString(), url)

    def fragment(self) -> pb.Fragment:
        return pb.Fragment.FromString(self.spec)

    @property
    def persisted(self) -> bool:
        return bool(self.url) or bool(self.fragment().backing_store)


class JournalSource:
    """The content of one journal (see the module docstring). `client` is None in store mode
    (no broker: only persisted content can be read), `registry` None in broker mode (fragments
    are read from their signed URLs)."""

    def __init__(
        self,
        journal: str,
        fragments: Sequence[FragmentRef],
        *,
        client: JournalClient | None,
        registry: StoreRegistry | None,
        fail_on_data_loss: bool,
        quiet: bool = False,
        gap_wait_s: float = gap_wait_s_default,
    ) -> None:
        if gap_wait_s <= 0:
            raise ValueError(f"gap_wait_s: must be > 0 (got {gap_wait_s})")
        self.journal = journal
        self._quiet = quiet
        self._gap_wait_s = gap_wait_s
        self._fragments = sorted(fragments, key=lambda f: f.begin)
        self._client = client
        self._registry = registry
        self._fail = fail_on_data_loss
        self.lost_bytes = 0

    def lenient(self) -> JournalSource:
        """The same source, skipping lost content without a word: for reads of content the
        reader did not ask for (the look-back before a start offset, range_start.py), whose
        loss only means less is known there."""
        return JournalSource(
            self.journal,
            self._fragments,
            client=self._client,
            registry=self._registry,
            fail_on_data_loss=False,
            quiet=True,
            gap_wait_s=self._gap_wait_s,
        )

    def lost(self, begin: int, end: int, reason: str) -> None:
        """Content [begin, end) cannot be read: fail, or skip it with a warning."""
        if self._fail:
            raise GazetteDataLossError(self.journal, begin, end, reason)
        self.lost_bytes += end - begin
        (_log.debug if self._quiet else _log.warning)(
            "gazette: journal %s: skipping lost content [%d, %d): %s (failOnDataLoss is false)",
            self.journal,
            begin,
            end,
            reason,
        )

    async def chunks(self, begin: int, end: int) -> AsyncGenerator[Chunk, None]:
        """The content of [begin, end), in order; offsets jump over skipped lost content."""
        at = begin
        wanted = [ref for ref in self._fragments if ref.end > at and ref.begin < end]
        # Whole fragments being loaded, by their index in `wanted` (the module docstring).
        loads: dict[int, asyncio.Task[bytes]] = {}
        try:
            for i, ref in enumerate(wanted):
                if ref.end <= at:
                    continue
                if ref.begin > at:
                    # Not among the fragments given: a broker knows what became of it (and
                    # skips it as lost if it was removed); without one, it is lost.
                    if self._client is not None:
                        async for chunk in self._broker_chunks(at, ref.begin, gap=True):
                            yield chunk
                    else:
                        self.lost(at, ref.begin, "no fragment holds it (removed by retention?)")
                    at = ref.begin
                stop = min(end, ref.end)
                if not ref.persisted:
                    async for chunk in self._broker_chunks(at, stop):
                        yield chunk
                elif _loads_whole(ref):
                    if i not in loads:
                        loads[i] = asyncio.ensure_future(self._load(ref))
                    _read_ahead(wanted, i, loads, self._load)
                    async for chunk in self._whole_chunks(ref, loads[i], at, stop):
                        yield chunk
                    del loads[i]
                else:
                    async for chunk in self._fragment_chunks(ref, at, stop):
                        yield chunk
                at = stop
        finally:
            for load in loads.values():
                load.cancel()
            await asyncio.gather(*loads.values(), return_exceptions=True)
        if at < end:
            if self._client is None:
                self.lost(at, end, "no persisted fragment holds it, and no broker was given")
                return
            async for chunk in self._broker_chunks(at, end):
                yield chunk

    async def _load(self, ref: FragmentRef) -> bytes:
        """A persisted fragment's whole content, verified (the module docstring). Failing to
        open its file raises `_Unopened`; a file that does not hold the fragment's content,
        FragmentIntegrityError."""
        fragment = ref.fragment()
        try:
            raw = await self._open_raw(ref, fragment)
        except (FragmentIntegrityError, StoreError) as err:
            raise _Unopened(err) from err
        span = fragment.end - fragment.begin
        stored_max = span + int(span * stored_growth_max) + stored_slack_bytes
        pieces: list[bytes] = []
        held = 0
        try:
            while piece := await raw.read(max(1, stored_max + 1 - held)):
                pieces.append(piece)
                held += len(piece)
                if held > stored_max:
                    raise FragmentIntegrityError(
                        fragment,
                        fragment.backing_store,
                        IntegrityFailure.LONG,
                        f"its file holds more than {stored_max} bytes for a fragment of {span}",
                    )
        finally:
            await raw.aclose()
        stored = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        return await asyncio.to_thread(_verified_content, fragment, stored)

    async def _whole_chunks(
        self, ref: FragmentRef, load: asyncio.Future[bytes], begin: int, end: int
    ) -> AsyncIterator[Chunk]:
        """[begin, end) of a fragment loaded whole, in pieces of `fragment_chunk_bytes_max`;
        a fragment that cannot be read is handled as `_fragment_chunks` handles it."""
        try:
            content = await load
        except _Unopened as unopened:
            err = unopened.error
            if self._client is None and isinstance(err, StoreError):
                raise err from None
            if self._client is None:
                self.lost(begin, end, str(err))  # Its file is missing.
                return
            if isinstance(err, StoreError):
                _log.info("gazette: reading %s through a broker: %s", self.journal, err)
            async for chunk in self._broker_chunks(begin, end):
                yield chunk
            return
        except FragmentIntegrityError as err:
            self.lost(begin, end, str(err))  # No byte of it was handed out.
            return
        lo, hi = begin - ref.begin, end - ref.begin
        if lo == 0 and hi == len(content) and hi <= fragment_chunk_bytes_max:
            yield Chunk(begin, content)  # The common case: the whole fragment, no copy.
            return
        view = memoryview(content)
        for at in range(lo, hi, fragment_chunk_bytes_max):
            yield Chunk(ref.begin + at, bytes(view[at : min(hi, at + fragment_chunk_bytes_max)]))

    async def _fragment_chunks(
        self, ref: FragmentRef, begin: int, end: int
    ) -> AsyncIterator[Chunk]:
        fragment = ref.fragment()
        try:
            reader = await self._open(ref, fragment, begin)
        except FragmentIntegrityError as err:  # The file is missing.
            if self._client is not None:
                async for chunk in self._broker_chunks(begin, end):
                    yield chunk
                return
            self.lost(begin, end, str(err))
            return
        except StoreError as err:
            if self._client is None:
                raise
            _log.info("gazette: reading %s through a broker: %s", fragment.journal, err)
            async for chunk in self._broker_chunks(begin, end):
                yield chunk
            return
        at = begin
        try:
            while at < end:
                try:
                    content = await reader.read()
                except FragmentIntegrityError as err:
                    if err.delivered:
                        raise  # Bytes of it were handed out: never skipped silently.
                    self.lost(begin, end, str(err))
                    return
                if not content:
                    break
                content = content[: end - at]
                yield Chunk(at, content)
                at += len(content)
        finally:
            await reader.aclose()

    async def _open_raw(self, ref: FragmentRef, fragment: pb.Fragment) -> FragmentReader:
        """The fragment's stored file (FragmentIntegrityError if it is missing)."""
        try:
            if ref.url:
                return await open_url(ref.url, file_read_bytes_min=file_read_bytes_min)
            if self._registry is not None:
                return await self._registry.get(fragment.backing_store).open(fragment)
            raise StoreError(f"no way to open fragment of {fragment.backing_store}")
        except FragmentNotFoundError as err:
            raise missing_fragment_error(fragment, err) from err

    async def _open(
        self, ref: FragmentRef, fragment: pb.Fragment, offset: int
    ) -> FragmentContentReader:
        raw = await self._open_raw(ref, fragment)
        try:
            return FragmentContentReader(
                raw,
                fragment,
                offset,
                chunk_bytes_max=fragment_chunk_bytes_max,
                verify_whole_bytes_max=fragment_verify_bytes_max,
                store=fragment.backing_store,
            )
        except BaseException:
            await raw.aclose()
            raise

    async def _broker_chunks(
        self, begin: int, end: int, *, gap: bool = False
    ) -> AsyncIterator[Chunk]:
        """[begin, end) through a broker. `gap`: a range between the fragments planned (see
        the module docstring): a read of it that makes no progress for `gap_wait_s` is lost."""
        client = self._client
        assert client is not None  # Callers check.
        at = begin
        while at < end:
            reader = RetryReader(
                client, pb.ReadRequest(journal=self.journal, offset=at, end_offset=end, block=True)
            )
            try:
                while True:
                    try:
                        if gap:
                            async with asyncio.timeout(self._gap_wait_s):
                                chunk = await reader.read_chunk()
                        else:
                            chunk = await reader.read_chunk()
                    except TimeoutError:
                        self.lost(
                            at,
                            end,
                            "a gap between the journal's fragments that its broker served none"
                            f" of for {self._gap_wait_s:g} s (never persisted, or removed; its"
                            " broker waits for it until the fragment after it is"
                            " 6 hours old): option storeGapGraceSeconds sets this wait",
                        )
                        return
                    except DataLossError as err:
                        reason = f"the broker reports lost content: {err}"
                        if self._fail:
                            raise GazetteDataLossError(self.journal, at, end, reason) from err
                        skip_to = await self._fragment_end(at, end)
                        self.lost(at, skip_to, reason)
                        at = skip_to
                        break
                    if chunk.offset > at:
                        self.lost(at, chunk.offset, "removed from the journal")
                        at = chunk.offset
                    if not chunk.content:
                        at = max(at, end)
                        break
                    yield chunk
                    at = chunk.offset + len(chunk.content)
            finally:
                await reader.close()

    async def _fragment_end(self, offset: int, end: int) -> int:
        """Where reading on after content lost at `offset` starts, at most `end`: the end of
        the fragment covering it (a lost one is skipped whole), else the begin of the next
        fragment (a gap the broker knows was lost: found by audit, a fragment file removed
        between others failed a read with failOnDataLoss false), else `end`."""
        from broker.client.list_apply import list_all_fragments

        assert self._client is not None
        listing = await list_all_fragments(self._client, pb.FragmentsRequest(journal=self.journal))
        after = end
        for item in listing.fragments:
            if item.spec.begin <= offset < item.spec.end:
                return min(end, item.spec.end)
            if offset < item.spec.begin < after:
                after = item.spec.begin
        return after


class _Unopened(Exception):
    """A fragment's file could not be opened: `error` says why (missing, or a store error)."""

    def __init__(self, error: FragmentIntegrityError | StoreError) -> None:
        super().__init__(str(error))
        self.error = error


def _loads_whole(ref: FragmentRef) -> bool:
    return ref.end - ref.begin <= fragment_verify_bytes_max


def _read_ahead(
    wanted: Sequence[FragmentRef],
    current: int,
    loads: dict[int, asyncio.Task[bytes]],
    load: Callable[[FragmentRef], Coroutine[Any, Any, bytes]],
) -> None:
    """Start loading the persisted fragments after `wanted[current]`, in order, as long as
    their content stays within `read_ahead_bytes_max` (the module docstring)."""
    held = sum(wanted[j].end - wanted[j].begin for j in loads if j > current)
    for j in range(current + 1, len(wanted)):
        ref = wanted[j]
        if j in loads:
            continue
        if not ref.persisted or held + ref.end - ref.begin > read_ahead_bytes_max:
            return
        loads[j] = asyncio.ensure_future(load(ref))
        held += ref.end - ref.begin


def _verified_content(fragment: pb.Fragment, stored: bytes) -> bytes:
    """A fragment's content from its whole stored file, verified against its name (in a worker
    thread: decompression and SHA1 release the GIL). Compressed content is decoded in steps of
    `raw_chunk_bytes_max`, so that a file decoding to more than the fragment stops early."""
    decoder = VerifyingDecoder(fragment, fragment.backing_store)
    if fragment.compression_codec == pb.NONE:
        out = [decoder.feed(stored)]
    else:
        view = memoryview(stored)
        out = [
            decoder.feed(bytes(view[at : at + raw_chunk_bytes_max]))
            for at in range(0, len(stored), raw_chunk_bytes_max)
        ]
    out.append(decoder.finish())
    return out[0] if len(out) == 2 and not out[1] else b"".join(out)
