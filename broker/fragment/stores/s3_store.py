"""s3:// — fragment files in Amazon S3 or an S3-compatible service (MinIO, Ceph, moto, ...).

URL form and query arguments are Gazette's S3 store's (names matched case-insensitively):

    s3://<bucket>/<optional/prefix/>?profile=&endpoint=&region=&acl=&storageclass=&sse=&ssekmskeyid=&find=&replace=

- profile: shared-credentials profile; default credentials when empty.
- endpoint: e.g. `http://127.0.0.1:9000`; path-style addressing is used with an explicit
  endpoint, since bucket-named virtual hosts do not exist on S3-compatible services.
- region: required, here or through the profile / environment: S3 requests cannot be signed
  without one, so a store without it fails at construction rather than on its first put.
- acl, storageclass, sse, ssekmskeyid: applied to every put.
- find, replace: Gazette's journal-name rewriting of keys.

boto3 is blocking; every call runs in a worker thread. Uploads go through boto3's managed
transfer, which switches to multipart uploads for large fragments.
"""

from __future__ import annotations

import asyncio
from typing import Any

import boto3
import boto3.exceptions
import boto3.s3.transfer
import boto3.session
import botocore.config
import botocore.exceptions

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

SCHEME = "s3"
QUERY_ARGS = (
    "profile",
    "endpoint",
    "region",
    "acl",
    "storageclass",
    "sse",
    "ssekmskeyid",
    "find",
    "replace",
)

# Attempts per request (first try included), with botocore's "standard" backoff.
request_attempts_max = 5
connect_timeout_s = 10.0
read_timeout_s = 60.0
# Fragments above this size are uploaded in parts of this size.
multipart_chunk_bytes = 64 << 20
# Parallel part uploads of one fragment.
upload_concurrency_max = 4
# Keys per listing page (S3's own maximum).
list_page_keys_max = 1000

_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})


class S3Store(FragmentStore):
    def __init__(self, url: StoreURL) -> None:
        if url.scheme != SCHEME:
            raise StoreURLError(f"scheme must be {SCHEME!r} (got {url.url!r})")
        if not url.host:
            raise StoreURLError(f"must name a bucket as the URL host (got {url.url!r})")
        args = url.take_args(QUERY_ARGS)
        super().__init__(url, find=args.get("find", ""), replace=args.get("replace", ""))
        self._bucket = url.host
        self._args = args
        self._client = _new_client(url.url, args)
        self._transfer = boto3.s3.transfer.TransferConfig(
            multipart_threshold=multipart_chunk_bytes,
            multipart_chunksize=multipart_chunk_bytes,
            max_concurrency=upload_concurrency_max,
        )

    def _error(self, op: str, key: str, err: Exception) -> StoreError:
        return StoreError(f"fragment store {self.url}: {op} of key {key!r}: {err}")

    def _put_args(self, content_encoding: str) -> dict[str, str]:
        extra: dict[str, str] = {}
        for arg, field in (
            ("acl", "ACL"),
            ("storageclass", "StorageClass"),
            ("sse", "ServerSideEncryption"),
            ("ssekmskeyid", "SSEKMSKeyId"),
        ):
            if self._args.get(arg):
                extra[field] = self._args[arg]
        if content_encoding:
            extra["ContentEncoding"] = content_encoding
        return extra

    async def _put(self, key: str, content: Content, content_encoding: str) -> None:
        def upload() -> None:
            self._client.upload_fileobj(
                as_bytes_io(content),
                self._bucket,
                key,
                ExtraArgs=self._put_args(content_encoding),
                Config=self._transfer,
            )

        try:
            await run_blocking_put(upload)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as err:
            raise self._error("put", key, err) from err
        except boto3.exceptions.S3UploadFailedError as err:
            raise self._error("put", key, err) from err

    async def _open(self, key: str) -> FragmentReader:
        try:
            # Cancelled meanwhile, the response body (a connection) is closed, not leaked.
            resp = await run_to_completion(
                lambda: self._client.get_object(Bucket=self._bucket, Key=key),
                discard=lambda r: r["Body"].close(),
            )
        except botocore.exceptions.ClientError as err:
            if _is_not_found(err):
                raise FragmentNotFoundError(self.url, key) from None
            raise self._error("get", key, err) from err
        except botocore.exceptions.BotoCoreError as err:
            raise self._error("get", key, err) from err
        return BlockingReader(resp["Body"])

    async def _exists(self, key: str) -> bool:
        try:
            await asyncio.to_thread(self._client.head_object, Bucket=self._bucket, Key=key)
        except botocore.exceptions.ClientError as err:
            if _is_not_found(err):
                return False
            raise self._error("head", key, err) from err
        except botocore.exceptions.BotoCoreError as err:
            raise self._error("head", key, err) from err
        return True

    async def _delete(self, key: str) -> None:
        try:
            await asyncio.to_thread(self._client.delete_object, Bucket=self._bucket, Key=key)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as err:
            raise self._error("delete", key, err) from err

    async def _sign(self, key: str, ttl_s: float) -> str:
        def sign() -> str:
            url: str = self._client.generate_presigned_url(
                "get_object",
                Params={"Bucket": self._bucket, "Key": key},
                ExpiresIn=max(1, int(ttl_s)),
            )
            return url

        try:
            return await asyncio.to_thread(sign)
        except botocore.exceptions.BotoCoreError as err:
            raise self._error("sign", key, err) from err

    async def _list(self, prefix: str) -> list[ListedObject]:
        def list_all() -> list[ListedObject]:
            out: list[ListedObject] = []
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self._bucket,
                Prefix=prefix,
                PaginationConfig={"PageSize": list_page_keys_max},
            )
            for page in pages:
                for obj in page.get("Contents", ()):
                    out.append(
                        ListedObject(
                            obj["Key"][len(prefix) :],
                            int(obj["LastModified"].timestamp()),
                            int(obj["Size"]),
                        )
                    )
            return out

        try:
            return await asyncio.to_thread(list_all)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as err:
            raise self._error("list", prefix, err) from err

    async def close(self) -> None:
        await asyncio.to_thread(self._client.close)


def _is_not_found(err: botocore.exceptions.ClientError) -> bool:
    code = str(err.response.get("Error", {}).get("Code", ""))
    status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in _NOT_FOUND_CODES or status == 404


def _new_client(url: str, args: dict[str, str]) -> Any:
    try:
        session = boto3.session.Session(
            profile_name=args.get("profile") or None, region_name=args.get("region") or None
        )
    except botocore.exceptions.ProfileNotFound as err:
        raise StoreURLError(f"{err} (got {url!r})", "profile") from None
    if not session.region_name:
        raise StoreURLError(
            f"missing AWS region: set ?region= or configure one for the profile (got {url!r})",
            "region",
        )
    if session.get_credentials() is None:
        raise StoreURLError(
            f"no AWS credentials found for profile {args.get('profile', '')!r} (got {url!r})",
            "profile",
        )
    endpoint = args.get("endpoint") or None
    config = botocore.config.Config(
        retries={"max_attempts": request_attempts_max, "mode": "standard"},
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        signature_version="s3v4",
        # Path style with explicit endpoints: S3-compatible services have no per-bucket hosts.
        s3={"addressing_style": "path" if endpoint else "auto"},
        # Checksums only where S3 requires them: older S3-compatible services reject the
        # trailing-checksum uploads newer SDKs send by default.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return session.client("s3", endpoint_url=endpoint, config=config)
