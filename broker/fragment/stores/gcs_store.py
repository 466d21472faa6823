"""gs:// — fragment files in Google Cloud Storage (the `gcs` extra: google-cloud-storage).

URL form and query arguments are Gazette's GCS store's:

    gs://<bucket>/<optional/prefix/>?find=&replace=

Keys are `<prefix><journal>/<postfix>/<content name>`, as for every store (see `naming.py`).

Credentials are Google's application default credentials (GOOGLE_APPLICATION_CREDENTIALS, the
metadata server, ...). Signed URLs are V4 signatures made locally, so they need credentials
that hold a private key: a service account key, as Gazette requires. Other credentials serve
every other operation, and signing then fails with a StoreError saying so.

STORAGE_EMULATOR_HOST (the variable Google's SDKs read) points the store at an emulator:
requests then go there unauthenticated, and signed URLs name the emulator's host, signed with
the key of GOOGLE_APPLICATION_CREDENTIALS if set.

Reads return the stored bytes: GZIP_OFFLOAD_DECOMPRESSION files (stored with
`Content-Encoding: gzip`) are downloaded raw, not transcoded. google-cloud-storage is blocking;
every call runs in a worker thread. Requests retry transient failures with exponential backoff
for at most `request_retry_timeout_s`.
"""

from __future__ import annotations

import asyncio
import datetime
import io
import os
import shutil
import tempfile
from typing import Any, BinaryIO, cast

import google.auth
import google.auth.exceptions
import requests
from google.api_core import exceptions as api_exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY
from google.oauth2 import service_account

from broker.fragment.stores.base import (
    BlockingReader,
    Content,
    FragmentNotFoundError,
    FragmentReader,
    FragmentStore,
    ListedObject,
    StoreError,
    StoreURL,
    StoreURLError,
    as_bytes_io,
    run_blocking_put,
    run_to_completion,
)

SCHEME = "gs"
QUERY_ARGS = ("find", "replace")
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
_FULL_CONTROL_SCOPE = "https://www.googleapis.com/auth/devstorage.full_control"

# Each request (with its retries) gives up after this long; retries back off exponentially
# from `retry_delay_initial_s` up to `retry_delay_max_s`.
request_retry_timeout_s = 120.0
retry_delay_initial_s = 0.5
retry_delay_max_s = 16.0
retry_delay_multiplier = 2.0
# Per-HTTP-request timeouts: (connect, read).
request_timeout_s = (10.0, 60.0)
# Reads fetch ranges of at most this size; uploads above it are resumable, in chunks of it.
transfer_chunk_bytes = 16 << 20
# Content that cannot seek is buffered before upload: in memory up to this, then on disk.
upload_buffer_memory_bytes_max = 16 << 20
copy_chunk_bytes = 1 << 20
# Objects per listing page (the API's maximum).
list_page_objects_max = 1000

_RETRY = DEFAULT_RETRY.with_delay(
    initial=retry_delay_initial_s, maximum=retry_delay_max_s, multiplier=retry_delay_multiplier
).with_timeout(request_retry_timeout_s)
_ERRORS = (
    api_exceptions.GoogleAPIError,
    google.auth.exceptions.GoogleAuthError,
    requests.RequestException,
    OSError,
    ValueError,  # The SDK's own, e.g. a response it cannot parse.
)


class GCSStore(FragmentStore):
    """`chunk_bytes` (a multiple of 256 KiB): the size of read ranges and resumable upload
    chunks, and of the largest single-request upload."""

    def __init__(self, url: StoreURL, *, chunk_bytes: int = transfer_chunk_bytes) -> None:
        if url.scheme != SCHEME:
            raise StoreURLError(f"scheme must be {SCHEME!r} (got {url.url!r})")
        if not url.host:
            raise StoreURLError(f"must name a bucket as the URL host (got {url.url!r})")
        args = url.take_args(QUERY_ARGS)
        super().__init__(url, find=args.get("find", ""), replace=args.get("replace", ""))
        self._chunk_bytes = chunk_bytes
        self._client, self._signer, self._sign_endpoint = _new_client(url.url)
        self._bucket = self._client.bucket(url.host)

    def _error(self, op: str, key: str, err: Exception) -> StoreError:
        return StoreError(f"fragment store {self.url}: {op} of key {key!r}: {err}")

    def _blob(self, key: str) -> Any:
        return self._bucket.blob(key, chunk_size=self._chunk_bytes)

    async def _put(self, key: str, content: Content, content_encoding: str) -> None:
        blob = self._blob(key)
        if content_encoding:
            blob.content_encoding = content_encoding

        def upload() -> None:
            with _Section(as_bytes_io(content)) as stream:
                # Names are content addresses: a retried upload writes equal content, so every
                # upload may be retried (the SDK would not retry a non-conditional one
                # otherwise).
                blob.upload_from_file(
                    stream,
                    size=stream.size,
                    content_type="application/octet-stream",
                    timeout=request_timeout_s,
                    retry=_RETRY,
                )

        try:
            await run_blocking_put(upload)
        except _ERRORS as err:
            raise self._error("put", key, err) from err

    async def _open(self, key: str) -> FragmentReader:
        blob = self._blob(key)

        def open_reader() -> Any:
            # Metadata first: a missing file is told at open, and reads are pinned to the
            # generation found (ranged reads of a file replaced meanwhile fail, never mix).
            blob.reload(timeout=request_timeout_s, retry=_RETRY)
            return blob.open(
                "rb",
                chunk_size=self._chunk_bytes,
                raw_download=True,
                if_generation_match=blob.generation,
                timeout=request_timeout_s,
                retry=_RETRY,
            )

        try:
            raw = await run_to_completion(open_reader, discard=lambda r: r.close())
        except api_exceptions.NotFound:
            raise FragmentNotFoundError(self.url, key) from None
        except _ERRORS as err:
            raise self._error("get", key, err) from err
        return _GCSReader(raw, self, key)

    async def _exists(self, key: str) -> bool:
        try:
            exists: bool = await asyncio.to_thread(
                self._blob(key).exists, timeout=request_timeout_s, retry=_RETRY
            )
        except _ERRORS as err:
            raise self._error("head", key, err) from err
        return exists

    async def _delete(self, key: str) -> None:
        try:
            await asyncio.to_thread(self._blob(key).delete, timeout=request_timeout_s, retry=_RETRY)
        except api_exceptions.NotFound:
            return None
        except _ERRORS as err:
            raise self._error("delete", key, err) from err

    async def _sign(self, key: str, ttl_s: float) -> str:
        signer = self._signer
        if signer is None or not hasattr(signer, "sign_bytes"):
            raise StoreError(
                f"fragment store {self.url}: signed URLs need service-account credentials with"
                " a private key (set GOOGLE_APPLICATION_CREDENTIALS to a key file)"
            )

        def sign() -> str:
            url: str = self._blob(key).generate_signed_url(
                version="v4",
                expiration=datetime.timedelta(seconds=max(1, int(ttl_s))),
                method="GET",
                credentials=signer,
                api_access_endpoint=self._sign_endpoint,
            )
            return url

        try:
            return await asyncio.to_thread(sign)
        except (*_ERRORS, AttributeError) as err:
            raise self._error("sign", key, err) from err

    async def _list(self, prefix: str) -> list[ListedObject]:
        def list_all() -> list[ListedObject]:
            blobs = self._client.list_blobs(
                self._bucket,
                prefix=prefix,
                page_size=list_page_objects_max,
                timeout=request_timeout_s,
                retry=_RETRY,
            )
            return [
                ListedObject(
                    blob.name[len(prefix) :],
                    int(blob.updated.timestamp()) if blob.updated else 0,
                    int(blob.size or 0),
                )
                for blob in blobs
            ]

        try:
            return await asyncio.to_thread(list_all)
        except _ERRORS as err:
            raise self._error("list", prefix, err) from err

    async def close(self) -> None:
        await asyncio.to_thread(self._client.close)


class _Section(io.RawIOBase):
    """The rest of a stream from its current position, as a stream of its own starting at 0:
    the SDK needs the size up front and rewinds to 0 to retry. A stream that cannot seek (the
    persister's spool sections) is copied first into a buffer that spills to a temporary file
    past `upload_buffer_memory_bytes_max`. Close it to release that buffer."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__()
        self._owned: BinaryIO | None = None
        if not raw.seekable():
            buffer = tempfile.SpooledTemporaryFile(max_size=upload_buffer_memory_bytes_max)
            shutil.copyfileobj(raw, buffer, copy_chunk_bytes)
            buffer.seek(0)
            raw = self._owned = cast(BinaryIO, buffer)
        self._raw = raw
        self._base = raw.tell()
        self.size = raw.seek(0, io.SEEK_END) - self._base
        raw.seek(self._base)

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()
        super().close()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._raw.tell() - self._base

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            target = self._base + offset
        elif whence == io.SEEK_CUR:
            target = self._raw.tell() + offset
        else:
            target = self._base + self.size + offset
        return self._raw.seek(max(target, self._base)) - self._base

    def readinto(self, buffer: Any) -> int:
        data = self._raw.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class _GCSReader(BlockingReader):
    """A BlobReader whose failures reach the caller as StoreErrors."""

    def __init__(self, raw: Any, store: GCSStore, key: str) -> None:
        super().__init__(raw)
        self._store = store
        self._key = key

    async def read(self, size: int = transfer_chunk_bytes) -> bytes:
        try:
            return await super().read(size)
        except _ERRORS as err:
            raise self._store._error("read", self._key, err) from err


def emulator_endpoint() -> str | None:
    """The emulator's base URL from STORAGE_EMULATOR_HOST (scheme added if missing)."""
    host = os.environ.get(EMULATOR_ENV, "").strip()
    if not host:
        return None
    return host if "://" in host else f"http://{host}"


def _new_client(url: str) -> tuple[Any, Any, str | None]:
    """(client, signing credentials or None, signed-URL endpoint or None for Google's)."""
    emulator = emulator_endpoint()
    if emulator is not None:
        # Emulators take no tokens: requests go unauthenticated. Signing needs a key, from
        # the key file only (looking further would probe a metadata server).
        key_file = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS", "")
        signer = None
        if key_file:
            try:
                signer = service_account.Credentials.from_service_account_file(key_file)
            except (OSError, ValueError, google.auth.exceptions.GoogleAuthError) as err:
                raise StoreURLError(
                    f"GOOGLE_APPLICATION_CREDENTIALS is not a service account key: {err}"
                    f" (got {url!r})"
                ) from None
        emulated_project = os.environ.get("GOOGLE_CLOUD_PROJECT") or "gazette"
        client = storage.Client(project=emulated_project, credentials=AnonymousCredentials())
        return client, signer, emulator
    try:
        credentials, project = google.auth.default(scopes=[_FULL_CONTROL_SCOPE])
    except google.auth.exceptions.DefaultCredentialsError as err:
        raise StoreURLError(f"no Google credentials found: {err} (got {url!r})") from None
    return storage.Client(project=project, credentials=credentials), credentials, None
