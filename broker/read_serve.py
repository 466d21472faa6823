"""Serving a Read from this broker's replica of the journal: its FragmentIndex, its local
spool files and the fragment stores. The Read RPC (read_api.py) resolves, proxies, and maps
what fails here to gRPC statuses.

A served read is a loop over the replica's FragmentIndex, exactly as Gazette's:

1. Query the index at the read offset (-1: the write head). A blocking read waits until some
   fragment covers it; a non-blocking one answers OFFSET_NOT_YET_AVAILABLE there.
2. Send a *metadata* response: the offset the read resolved to (larger than asked after a jump
   over a gap), the write head, the covering fragment, and for a persisted fragment a signed URL
   of its file. The first response also carries the header (route and etcd revision).
3. Stop after it if the client wanted `metadata_only`, if the fragment is persisted and the
   client reads store files itself (`do_not_proxy`), or if `end_offset` is reached.
4. Stream the fragment's content from the offset in chunks of at most `chunk_bytes_max`: from
   the local spool file if the fragment is local, else from the store (decompressed and
   verified against the fragment's name before any byte is served: in memory up to 1 MiB,
   beyond through a staged scratch copy or a first pass over the file, read_staging.py).
   Stop at `end_offset`; otherwise go to 1 at the fragment's end.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Final

from broker import metrics
from broker.client.reader import (
    FragmentContentError,
    FragmentContentReader,
    missing_fragment_error,
    verify_whole_bytes_max_default,
)
from broker.fragment.index import FragmentIndex, QueryResult
from broker.fragment.spool_file import SpoolFile
from broker.fragment.stores.base import FragmentNotFoundError, FragmentReader
from broker.fragment.stores.registry import StoreRegistry
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb
from broker.read_hole import hole_wait_warning_s_default, wait_covered
from broker.read_staging import OpenRaw, StagedCopy, StagingArea, StagingError

# Content chunks of a Read stream are at most this large (Gazette's 128 KiB).
chunk_bytes_max_default: Final = 1 << 17
# Signed fragment URLs in read metadata are valid this long: long enough to open the file, not
# to pass it around. Gazette's value.
fragment_url_ttl_s: Final = 60.0
log = get_logger(__name__)

_FIRST_PASS: Final = metrics.READ_VERIFIED_WHOLE.labels(how="first_pass")
# A local fragment whose file is closed under a read (it was just persisted) is re-queried; if
# the index keeps answering with closed files this many times in a row, something is broken.
closed_file_requeries_max: Final = 8


async def serve_read(
    request: pb.ReadRequest,
    header: pb.Header,
    index: FragmentIndex,
    registry: StoreRegistry,
    *,
    chunk_bytes_max: int = chunk_bytes_max_default,
    hole_wait_warning_s: float = hole_wait_warning_s_default,
    retention_s: float = 0.0,
    staging: StagingArea | None = None,
) -> AsyncGenerator[pb.ReadResponse, None]:
    """The responses of a read served from `index` (see the module docstring). Raises
    IndexClosedError if the index closes, StoreError / FragmentContentError if a store fails.
    `retention_s` is the journal's fragment retention (0: forever): a stored fragment found
    missing past it was pruned since the last listing (FragmentPrunedError, and the index lists
    the stores again: `FragmentIndex.pruned_since_listing`). Stored fragments over 1 MiB are
    staged in `staging` if it has room (StagingError if a scratch file fails), else read twice
    (read_staging.py)."""
    req = pb.ReadRequest()
    req.CopyFrom(request)
    first = True
    closed_files = 0
    while True:
        if req.block:
            result = await wait_covered(index, req, hole_wait_warning_s)
        else:
            result = index.query(req.offset, begin_mod_time=req.begin_mod_time)
        response = await _metadata(result, registry)
        if first:
            response.header.CopyFrom(header)
            first = False
        yield response

        if (
            response.status != pb.OK
            or req.metadata_only
            or (result.file is None and req.do_not_proxy)
            or (req.end_offset and response.offset >= req.end_offset)
        ):
            return
        fragment = response.fragment
        req.offset = response.offset

        if result.file is not None:
            content = _local_content(result.file, fragment, req.offset, chunk_bytes_max)
        else:
            content = _store_content(
                registry, fragment, req.offset, chunk_bytes_max, index, retention_s, staging
            )
        try:
            async for chunk in content:
                if req.end_offset:
                    chunk = chunk[: req.end_offset - req.offset]
                metrics.READ_BYTES.inc(len(chunk))
                yield pb.ReadResponse(offset=req.offset, content=chunk)
                req.offset += len(chunk)
                if req.end_offset and req.offset >= req.end_offset:
                    return
            closed_files = 0
        except FileClosedError:
            # Persisted and closed under us: the index now answers with the stored fragment.
            closed_files += 1
            if closed_files > closed_file_requeries_max:
                raise
        finally:
            await content.aclose()


async def _metadata(result: QueryResult, registry: StoreRegistry) -> pb.ReadResponse:
    if result.lost is not None:
        # Content the index knows is gone: never answered as a gap (which a reader would wait
        # at, or take for the journal's end).
        raise result.lost.error()
    if result.fragment is None:
        return pb.ReadResponse(
            status=pb.OFFSET_NOT_YET_AVAILABLE, offset=result.offset, write_head=result.write_head
        )
    response = pb.ReadResponse(
        status=pb.OK, offset=result.offset, write_head=result.write_head, fragment=result.fragment
    )
    fragment = result.fragment
    if result.file is None and fragment.backing_store and fragment.mod_time:
        store = registry.get(fragment.backing_store)
        response.fragment_url = await store.signed_url(fragment, fragment_url_ttl_s)
    return response


class FileClosedError(Exception):
    """A local fragment's file was closed while being read."""


class FragmentPrunedError(Exception):
    """A listed fragment's file is missing from its store, past the journal's retention: it
    was pruned since the index's last listing (not lost). The index lists the stores again;
    a read retried after that goes on past the pruned range."""

    def __init__(self, fragment: pb.Fragment) -> None:
        super().__init__(
            f"fragment [{fragment.begin}, {fragment.end}) of {fragment.journal} was pruned by"
            " the journal's retention since the last store listing; listing the stores again:"
            " read again"
        )
        self.fragment = fragment


async def _local_content(
    file: SpoolFile, fragment: pb.Fragment, offset: int, chunk_bytes_max: int
) -> AsyncGenerator[bytes, None]:
    # Committed content is immutable in the file (the spool writes only beyond it), so it is
    # read without coordinating with the spool's owner. Reads are positional and small; they
    # are served from the page cache in the common case of a reader near the head.
    while offset < fragment.end:
        want = min(chunk_bytes_max, fragment.end - offset)
        if file.closed:
            raise FileClosedError()
        try:
            data = file.pread(want, offset - fragment.begin)
        except ValueError:
            if file.closed:
                raise FileClosedError() from None
            raise
        if len(data) != want:
            raise FragmentContentError(
                f"local file of {fragment.journal} [{fragment.begin}, {fragment.end}) is short:"
                f" read {len(data)} of {want} bytes at offset {offset}"
            )
        yield data
        offset += want


async def _store_content(
    registry: StoreRegistry,
    fragment: pb.Fragment,
    offset: int,
    chunk_bytes_max: int,
    index: FragmentIndex,
    retention_s: float,
    staging: StagingArea | None,
) -> AsyncGenerator[bytes, None]:
    async def open_raw() -> FragmentReader:
        # The index lists this fragment, so its file must exist: a missing one is lost
        # content, not a store that is unavailable for a moment; unless the journal's
        # retention had it pruned since the index's last listing (a lagging reader would
        # otherwise fail on DATA_LOSS until the next listing, where it jumps the pruned range).
        try:
            return await registry.get(fragment.backing_store).open(fragment)
        except FragmentNotFoundError as err:
            if index.pruned_since_listing(fragment, retention_s):
                raise FragmentPrunedError(fragment) from err
            raise missing_fragment_error(fragment, err) from err

    if fragment.end - fragment.begin > verify_whole_bytes_max_default:
        # Too long to verify in memory: verified whole all the same before its first byte is
        # served (read_staging.py), from a staged copy if there is room for one.
        file, claim = await _staged_copy(staging, fragment, open_raw)
        if file is not None and claim is not None:
            try:
                staged = _local_content(file, fragment, offset, chunk_bytes_max)
                try:
                    async for data in staged:
                        yield data
                except OSError as err:  # Reading the scratch file back: not the fragment's.
                    raise StagingError(
                        f"reading the staged copy of fragment [{fragment.begin},"
                        f" {fragment.end}) of {fragment.journal} failed: {err}; read again"
                    ) from err
                finally:
                    await staged.aclose()
            finally:
                await claim.__aexit__(None, None, None)
            return
        # No room for a copy now (or its scratch file failed): a first pass verifies it, a
        # second streams it.
        await _verify_whole(await open_raw(), fragment)
        _FIRST_PASS.inc()
    raw = await open_raw()
    # Verified against the fragment's name as it is read (FragmentIntegrityError): up to 1 MiB
    # whole before its first byte; a longer one was verified above, and is verified again as it
    # streams (a file that changed between the two reads fails at its end, saying how many of
    # its bytes were served).
    try:
        reader = FragmentContentReader(
            raw, fragment, offset, chunk_bytes_max=chunk_bytes_max, store=fragment.backing_store
        )
    except BaseException:
        await raw.aclose()
        raise
    try:
        while data := await reader.read():
            yield data
    finally:
        await reader.aclose()


async def _staged_copy(
    staging: StagingArea | None, fragment: pb.Fragment, open_raw: OpenRaw
) -> tuple[SpoolFile | None, StagedCopy | None]:
    """The fragment's staged copy, complete and verified, with the claim to leave once read;
    (None, None) without a copy: no staging area, no room, or its scratch file failed (a full
    disk, say: the read goes twice over the stored file instead of failing). Raises what
    reading the stored file raises (FragmentIntegrityError: damaged, nothing served)."""
    if staging is None:
        return None, None
    try:
        claim = staging.claim(fragment, open_raw)
        if claim is None:
            return None, None
        return await claim.__aenter__(), claim  # Left by __aenter__ itself if it raises.
    except StagingError as err:
        log.warning(
            "staging a stored fragment failed; reading it twice",
            journal=fragment.journal,
            fragment=fragment.begin,
            error=str(err),
        )
        return None, None


async def _verify_whole(raw: FragmentReader, fragment: pb.Fragment) -> None:
    """Decode and verify the fragment's stored file, keeping none of it (FragmentIntegrityError,
    with nothing served, if it is not the fragment's content)."""
    try:
        # From the fragment's end: every decoded byte is dropped, none kept.
        reader = FragmentContentReader(
            raw, fragment, fragment.end, verify_whole_bytes_max=0, store=fragment.backing_store
        )
    except BaseException:
        await raw.aclose()
        raise
    try:
        if await reader.read():
            raise AssertionError("a reader from the fragment's end returned content")
    finally:
        await reader.aclose()
