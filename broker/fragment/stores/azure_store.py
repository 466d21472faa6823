"""azure:// and azure-ad:// — fragment files in Azure Blob Storage (the `azure` extra:
azure-storage-blob, azure-identity).

URL forms, credentials and query arguments are Gazette's Azure stores':

    azure://<container>/<optional/prefix/>?find=&replace=
        Shared Key: the storage account and its key come from AZURE_ACCOUNT_NAME and
        AZURE_ACCOUNT_KEY. Signed URLs are service SAS signed with the key.
    azure-ad://<tenant-id>/<storage-account>/<container>/<optional/prefix/>?find=&replace=
        Azure AD (Entra ID): a client secret of an app registration in the tenant, from
        AZURE_CLIENT_ID and AZURE_CLIENT_SECRET. Signed URLs are user delegation SAS, signed
        with a user delegation key fetched with those credentials, kept for two hours and
        renewed when less than half of that remains.

Keys are `<prefix><journal>/<postfix>/<content name>` within the container, as for every store
(see `naming.py`); for azure-ad:// the prefix is what follows the container in the path.

The account's blob endpoint is `https://<account>.blob.core.windows.net`. GAZETTE_AZURE_BLOB_ENDPOINT
overrides it for emulators and sovereign clouds (e.g. `http://127.0.0.1:10000/{account}` for
Azurite; `{account}` is replaced by the account name). Signed URLs of an http:// endpoint allow
http, else only https, as Gazette's.

Reads return the stored bytes (no decoding of `Content-Encoding: gzip`). azure-storage-blob's
synchronous client is used; every call runs in a worker thread. Requests retry transient
failures with exponential backoff, at most `request_retries_max` times.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from azure.core import exceptions as azure_exceptions
from azure.core.credentials import AzureNamedKeyCredential, TokenCredential
from azure.storage.blob import (
    BlobSasPermissions,
    BlobServiceClient,
    ContentSettings,
    ExponentialRetry,
    UserDelegationKey,
    generate_blob_sas,
)

from broker.fragment.stores.base import (
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

QUERY_ARGS = ("find", "replace")
ENDPOINT_ENV = "GAZETTE_AZURE_BLOB_ENDPOINT"
_DEFAULT_ENDPOINT = "https://{account}.blob.core.windows.net"

request_retries_max = 5
retry_backoff_initial_s = 1
retry_backoff_increase_base = 3
connect_timeout_s = 10.0
read_timeout_s = 60.0
# Reads fetch ranges of at most this size; larger uploads go in blocks of it.
transfer_chunk_bytes = 16 << 20
# Parallel block uploads of one fragment.
upload_concurrency_max = 4
# User delegation keys are requested for this long and renewed at half of it.
delegation_key_ttl_s = 2 * 3600.0
_STORAGE_SCOPE = "https://storage.azure.com/.default"

_ERRORS = (azure_exceptions.AzureError, OSError, ValueError)


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def blob_endpoint(account: str) -> str:
    template = os.environ.get(ENDPOINT_ENV, "").strip() or _DEFAULT_ENDPOINT
    return template.replace("{account}", account).rstrip("/")


class AzureStore(FragmentStore):
    """What both Azure stores share: everything but credentials and signing. `chunk_bytes`:
    the largest single-request upload, the size of blocks above it, and of read ranges."""

    def __init__(
        self,
        url: StoreURL,
        *,
        account: str,
        container: str,
        prefix: str,
        credential: Any,
        chunk_bytes: int = transfer_chunk_bytes,
    ) -> None:
        args = url.take_args(QUERY_ARGS)
        if not container:
            raise StoreURLError(f"must name a storage container (got {url.url!r})")
        # Keys are rooted at the prefix within the container, not at the URL's whole path.
        keyed = StoreURL(url.url, url.scheme, url.host, prefix, url.args)
        super().__init__(keyed, find=args.get("find", ""), replace=args.get("replace", ""))
        self.account = account
        self.container = container
        self.endpoint = blob_endpoint(account)
        self._service = BlobServiceClient(
            self.endpoint,
            credential=credential,
            retry_policy=ExponentialRetry(
                initial_backoff=retry_backoff_initial_s,
                increment_base=retry_backoff_increase_base,
                retry_total=request_retries_max,
            ),
            connection_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            max_single_put_size=chunk_bytes,
            max_block_size=chunk_bytes,
            max_chunk_get_size=chunk_bytes,
            max_single_get_size=chunk_bytes,
        )
        self._container = self._service.get_container_client(container)

    def _error(self, op: str, key: str, err: Exception) -> StoreError:
        return StoreError(f"fragment store {self.url}: {op} of key {key!r}: {err}")

    def _sas_protocol(self) -> str:
        return "https,http" if self.endpoint.startswith("http://") else "https"

    async def _put(self, key: str, content: Content, content_encoding: str) -> None:
        blob = self._container.get_blob_client(key)

        def upload() -> None:
            # Overwriting is harmless: names are content addresses. Blocks are committed in
            # one step, so readers never see a partial blob.
            blob.upload_blob(
                as_bytes_io(content),
                overwrite=True,
                content_settings=ContentSettings(
                    content_type="application/octet-stream",
                    content_encoding=content_encoding or None,
                ),
                max_concurrency=upload_concurrency_max,
            )

        try:
            await run_blocking_put(upload)
        except _ERRORS as err:
            raise self._error("put", key, err) from err

    async def _open(self, key: str) -> FragmentReader:
        blob = self._container.get_blob_client(key)

        def download() -> Iterator[bytes]:
            # The first range is requested here, so a missing blob is told at open.
            return blob.download_blob(decompress=False).chunks()  # type: ignore[no-any-return]

        try:
            chunks = await run_to_completion(download)
        except azure_exceptions.ResourceNotFoundError:
            raise FragmentNotFoundError(self.url, key) from None
        except _ERRORS as err:
            raise self._error("get", key, err) from err
        return _ChunksReader(chunks, self, key)

    async def _exists(self, key: str) -> bool:
        try:
            exists: bool = await asyncio.to_thread(self._container.get_blob_client(key).exists)
        except _ERRORS as err:
            raise self._error("head", key, err) from err
        return exists

    async def _delete(self, key: str) -> None:
        try:
            await asyncio.to_thread(self._container.get_blob_client(key).delete_blob)
        except azure_exceptions.ResourceNotFoundError:
            return None
        except _ERRORS as err:
            raise self._error("delete", key, err) from err

    async def _sign(self, key: str, ttl_s: float) -> str:
        ttl = datetime.timedelta(seconds=max(1.0, ttl_s))
        try:
            sas = await asyncio.to_thread(self._sas, key, ttl)
        except _ERRORS as err:
            raise self._error("sign", key, err) from err
        return f"{self._container.get_blob_client(key).url}?{sas}"

    def _sas(self, key: str, ttl: datetime.timedelta) -> str:
        """The query of a read-only SAS of `key`, valid for `ttl` (blocking)."""
        raise NotImplementedError

    async def _list(self, prefix: str) -> list[ListedObject]:
        def list_all() -> list[ListedObject]:
            return [
                ListedObject(
                    item.name[len(prefix) :],
                    int(item.last_modified.timestamp()) if item.last_modified else 0,
                    int(item.size or 0),
                )
                for item in self._container.list_blobs(name_starts_with=prefix)
            ]

        try:
            return await asyncio.to_thread(list_all)
        except _ERRORS as err:
            raise self._error("list", prefix, err) from err

    async def close(self) -> None:
        await asyncio.to_thread(self._service.close)


class AzureAccountStore(AzureStore):
    """azure://<container>/<prefix/>, Shared Key authenticated (see the module docstring)."""

    def __init__(
        self,
        url: StoreURL,
        *,
        account: str | None = None,
        account_key: str | None = None,
        chunk_bytes: int = transfer_chunk_bytes,
    ) -> None:
        if url.scheme != "azure":
            raise StoreURLError(f"scheme must be 'azure' (got {url.url!r})")
        url.take_args(QUERY_ARGS)  # Bad arguments are told before missing credentials.
        if not url.host:
            raise StoreURLError(f"must name a storage container as the URL host (got {url.url!r})")
        account = account or os.environ.get("AZURE_ACCOUNT_NAME", "")
        account_key = account_key or os.environ.get("AZURE_ACCOUNT_KEY", "")
        if not account or not account_key:
            raise StoreURLError(
                f"AZURE_ACCOUNT_NAME and AZURE_ACCOUNT_KEY must be set for azure:// stores"
                f" (got {url.url!r})"
            )
        self._account_key = account_key
        super().__init__(
            url,
            account=account,
            container=url.host,
            prefix=url.prefix,
            credential=AzureNamedKeyCredential(account, account_key),
            chunk_bytes=chunk_bytes,
        )

    def _sas(self, key: str, ttl: datetime.timedelta) -> str:
        return generate_blob_sas(
            self.account,
            self.container,
            key,
            account_key=self._account_key,
            permission=BlobSasPermissions(read=True),
            expiry=_utc_now() + ttl,
            protocol=self._sas_protocol(),
        )


class AzureADStore(AzureStore):
    """azure-ad://<tenant>/<account>/<container>/<prefix/>, Azure AD authenticated (see the
    module docstring). `credential` replaces the client secret credential of the environment
    (another azure-identity credential, or a test's); `clock` tells the time of delegation key
    renewals."""

    def __init__(
        self,
        url: StoreURL,
        *,
        credential: TokenCredential | None = None,
        clock: Callable[[], datetime.datetime] = _utc_now,
        chunk_bytes: int = transfer_chunk_bytes,
    ) -> None:
        if url.scheme != "azure-ad":
            raise StoreURLError(f"scheme must be 'azure-ad' (got {url.url!r})")
        url.take_args(QUERY_ARGS)
        segments = url.prefix.split("/")
        if not url.host or len(segments) < 3 or not segments[0] or not segments[1]:
            raise StoreURLError(
                "must be azure-ad://<tenant-id>/<storage-account>/<container>/<prefix/>"
                f" (got {url.url!r})"
            )
        self.tenant = url.host
        if credential is None:
            credential = _client_secret_credential(url.url, self.tenant)
        self._credential = credential
        self._clock = clock
        self._key_lock = threading.Lock()
        self._key: UserDelegationKey | None = None
        self._key_expiry = datetime.datetime.min.replace(tzinfo=datetime.UTC)
        super().__init__(
            url,
            account=segments[0],
            container=segments[1],
            prefix="/".join(segments[2:]),
            credential=credential,
            chunk_bytes=chunk_bytes,
        )

    def _delegation_key(self) -> UserDelegationKey:
        """The cached user delegation key, renewed once less than half its life remains."""
        with self._key_lock:
            now = self._clock()
            half = datetime.timedelta(seconds=delegation_key_ttl_s / 2)
            if self._key is None or self._key_expiry - now < half:
                expiry = now + datetime.timedelta(seconds=delegation_key_ttl_s)
                self._key = self._service.get_user_delegation_key(now, expiry)
                self._key_expiry = expiry
            return self._key

    def _sas(self, key: str, ttl: datetime.timedelta) -> str:
        delegation = self._delegation_key()
        # A SAS cannot outlive the key that signs it.
        expiry = min(self._clock() + ttl, self._key_expiry)
        return generate_blob_sas(
            self.account,
            self.container,
            key,
            user_delegation_key=delegation,
            permission=BlobSasPermissions(read=True),
            expiry=expiry,
            protocol=self._sas_protocol(),
        )

    async def close(self) -> None:
        await super().close()
        closer = getattr(self._credential, "close", None)
        if closer is not None:
            await asyncio.to_thread(closer)


def _client_secret_credential(url: str, tenant: str) -> TokenCredential:
    from azure.identity import ClientSecretCredential

    client_id = os.environ.get("AZURE_CLIENT_ID", "")
    client_secret = os.environ.get("AZURE_CLIENT_SECRET", "")
    if not client_id or not client_secret:
        raise StoreURLError(
            f"AZURE_CLIENT_ID and AZURE_CLIENT_SECRET must be set for azure-ad:// stores"
            f" (got {url!r})"
        )
    return ClientSecretCredential(tenant, client_id, client_secret, disable_instance_discovery=True)


class _ChunksReader(FragmentReader):
    """A download's chunk iterator as a FragmentReader: chunks are fetched in a worker thread
    and handed out in pieces of at most the size asked for."""

    def __init__(self, chunks: Iterator[bytes], store: AzureStore, key: str) -> None:
        self._chunks = chunks
        self._pending = b""
        self._done = False
        self._store = store
        self._key = key

    async def read(self, size: int = transfer_chunk_bytes) -> bytes:
        while not self._pending and not self._done:
            try:
                chunk = await asyncio.to_thread(next, self._chunks, None)
            except _ERRORS as err:
                raise self._store._error("read", self._key, err) from err
            if chunk is None:
                self._done = True
            else:
                self._pending = chunk
        out, self._pending = self._pending[:size], self._pending[size:]
        return out

    async def aclose(self) -> None:
        self._done = True
        self._pending = b""
