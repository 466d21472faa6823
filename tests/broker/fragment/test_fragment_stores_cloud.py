"""gs://, azure:// and azure-ad:// fragment stores against real emulators (conftest.py): the
conformance suite, keys identical to Gazette's, content encodings, signed URLs, credentials
and the optional extras."""

from __future__ import annotations

import datetime
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from broker.fragment import naming
from broker.fragment.codecs import CompressionCodec, compress
from broker.fragment.store_health import CHECK_KEY, check_delete, run_check
from broker.fragment.stores.azure_store import AzureAccountStore, AzureADStore
from broker.fragment.stores.base import StoreError, StoreURL, StoreURLError
from broker.fragment.stores.conformance import check_blob_store
from broker.fragment.stores.gcs_store import GCSStore
from broker.fragment.stores.registry import new_registry
from broker.protocol import protocol_pb2 as pb
from broker.testing.azurite import ACCOUNT, TENANT, Azurite, StaticTokenCredential
from broker.testing.gcs_emulator import GCSEmulator

_REPO_ROOT = Path(__file__).resolve().parents[3]


def fragment(journal: str, begin: int, content: bytes, codec: CompressionCodec) -> pb.Fragment:
    return pb.Fragment(
        journal=journal,
        begin=begin,
        end=begin + len(content),
        sum=naming.content_sum(content),
        compression_codec=naming.pb_codec(codec),
    )


# --- gs:// ------------------------------------------------------------------------------------


async def test_gcs_store_conforms(gcs_store: GCSStore) -> None:
    await check_blob_store(gcs_store)


async def test_gcs_store_without_prefix_conforms(gcs_bucket: str) -> None:
    registry = new_registry()
    await check_blob_store(registry.get(f"gs://{gcs_bucket}/"))
    await registry.close()


async def test_gcs_keys_and_gzip_offload_encoding(
    gcs_store: GCSStore, gcs_bucket: str, gcs_env: GCSEmulator
) -> None:
    content = b"offloaded " * 100
    f = fragment("a/journal", 0, content, CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION)
    f.path_postfix = "date=2024-01-01"
    await gcs_store.put(f, compress(CompressionCodec.GZIP, content))
    key = f"root/prefix/a/journal/date=2024-01-01/{naming.content_name(f)}"
    assert gcs_store.key(f) == key
    meta = gcs_env.object_metadata(gcs_bucket, key)
    assert meta["contentEncoding"] == "gzip"
    # Stored bytes come back as stored: no transcoding of the gzip encoding.
    assert await gcs_store.read(f, 1 << 20) == compress(CompressionCodec.GZIP, content)


async def test_gcs_find_replace_rewrites_journal_names(gcs_bucket: str) -> None:
    store = GCSStore(StoreURL.parse(f"gs://{gcs_bucket}/p/?find=bar/v1/&replace=old/"))
    f = fragment("foo/bar/v1/part-000", 0, b"x", CompressionCodec.NONE)
    assert store.key(f) == f"p/foo/old/part-000/{naming.content_name(f)}"
    await store.put(f, b"x")
    assert [naming.content_name(g) for g in await store.list("foo/bar/v1/part-000")] == [
        naming.content_name(f)
    ]
    await store.close()


async def test_gcs_signed_url_is_a_v4_signature(gcs_store: GCSStore, gcs_bucket: str) -> None:
    f = fragment("a/journal", 0, b"x", CompressionCodec.NONE)
    url = urlsplit(await gcs_store.signed_url(f, 90))
    query = parse_qs(url.query)
    assert unquote(url.path) == f"/{gcs_bucket}/{gcs_store.key(f)}"
    assert query["X-Goog-Algorithm"] == ["GOOG4-RSA-SHA256"]
    assert query["X-Goog-Expires"] == ["90"]
    assert len(query["X-Goog-Signature"][0]) == 512  # RSA-2048, hex.


async def test_gcs_signing_without_a_key_is_a_store_error(
    gcs_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    store = GCSStore(StoreURL.parse(f"gs://{gcs_bucket}/"))
    f = fragment("a/journal", 0, b"x", CompressionCodec.NONE)
    await store.put(f, b"x")  # Everything else works.
    with pytest.raises(StoreError, match="service-account credentials with a private key"):
        await store.signed_url(f, 60)
    await store.close()


def _run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(_REPO_ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_gcs_without_credentials_is_a_url_error(tmp_path: Path) -> None:
    # In a child: google-auth reads its environment at import. NO_GCE_CHECK keeps it from
    # probing a metadata server; the empty HOME and CLOUDSDK_CONFIG hide any gcloud login.
    code = (
        "from broker.fragment.stores.registry import new_registry\n"
        "from broker.fragment.stores.base import StoreURLError\n"
        "try:\n"
        "    new_registry().get('gs://bucket/p/')\n"
        "except StoreURLError as err:\n"
        "    print('ERR', err)\n"
    )
    env = {"HOME": str(tmp_path), "CLOUDSDK_CONFIG": str(tmp_path), "NO_GCE_CHECK": "true"}
    out = _run_python(code, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ERR no Google credentials found"), out.stdout


@pytest.mark.parametrize(
    ("url", "blocked", "extra"),
    [
        ("gs://bucket/p/", "google.cloud.storage", "gcs"),
        ("azure://container/p/", "azure.storage.blob", "azure"),
        ("azure-ad://tenant/account/container/", "azure.storage.blob", "azure"),
    ],
)
def test_missing_extra_is_a_typed_error_naming_it(url: str, blocked: str, extra: str) -> None:
    # The SDK made unimportable, as if the extra were not installed.
    code = (
        "import sys\n"
        f"sys.modules[{blocked!r}] = None\n"
        "from broker.fragment.stores.registry import new_registry\n"
        "from broker.fragment.stores.extras import MissingStoreExtraError\n"
        "try:\n"
        f"    new_registry().get({url!r})\n"
        "except MissingStoreExtraError as err:\n"
        "    print(err.extra, '|', err)\n"
    )
    out = _run_python(code, {})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"{extra} | "), out.stdout
    assert f"pip install 'gazette-py[{extra}]'" in out.stdout


# --- azure:// and azure-ad:// -----------------------------------------------------------------


async def test_azure_store_conforms(azure_store: AzureAccountStore) -> None:
    await check_blob_store(azure_store)


async def test_azure_ad_store_conforms(azure_ad_store: AzureADStore) -> None:
    await check_blob_store(azure_ad_store)


async def test_azure_store_without_prefix_conforms(azure_container: str) -> None:
    registry = new_registry()
    await check_blob_store(registry.get(f"azure://{azure_container}/"))
    await registry.close()


def _blob_properties(azurite: Azurite, container: str, key: str) -> Any:
    from azure.storage.blob import BlobServiceClient

    client = azurite.service_client()
    assert isinstance(client, BlobServiceClient)
    with client:
        return client.get_blob_client(container, key).get_blob_properties()


async def test_azure_keys_and_gzip_offload_encoding(
    azure_store: AzureAccountStore, azure_container: str, azure_env: Azurite
) -> None:
    content = b"offloaded " * 100
    f = fragment("a/journal", 0, content, CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION)
    await azure_store.put(f, compress(CompressionCodec.GZIP, content))
    key = f"root/prefix/a/journal/{naming.content_name(f)}"
    assert azure_store.key(f) == key
    props = _blob_properties(azure_env, azure_container, key)
    assert props.content_settings.content_encoding == "gzip"
    assert await azure_store.read(f, 1 << 20) == compress(CompressionCodec.GZIP, content)


async def test_azure_ad_keys_are_rooted_after_the_container(
    azure_ad_store: AzureADStore, azure_container: str, azure_env: Azurite
) -> None:
    # azure-ad://<tenant>/<account>/<container>/root/prefix/: account and container are not
    # part of keys, as in Gazette.
    f = fragment("a/journal", 0, b"abc", CompressionCodec.NONE)
    await azure_ad_store.put(f, b"abc")
    key = f"root/prefix/a/journal/{naming.content_name(f)}"
    assert azure_ad_store.key(f) == key
    assert _blob_properties(azure_env, azure_container, key).size == 3
    assert (azure_ad_store.account, azure_ad_store.container) == (ACCOUNT, azure_container)
    assert azure_ad_store.tenant == TENANT


async def test_azure_ad_health_check_objects_are_rooted_after_the_container(
    azure_ad_store: AzureADStore, azure_container: str, azure_env: Azurite
) -> None:
    # The health check and the delete probe write under the store's key root, as fragments
    # do: not under "<account>/<container>/..." inside the container.
    await run_check(azure_ad_store)
    assert _blob_properties(azure_env, azure_container, "root/prefix/" + CHECK_KEY).size > 0
    await check_delete(azure_ad_store, "recovery/")


def _sas(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


async def test_azure_shared_key_sas_reads_only_one_blob(azure_store: AzureAccountStore) -> None:
    f = fragment("a/journal", 0, b"x", CompressionCodec.NONE)
    sas = _sas(await azure_store.signed_url(f, 60))
    assert (sas["sp"], sas["sr"], sas["spr"]) == ("r", "b", "https")
    assert "skoid" not in sas  # Signed with the account key, not a delegation key.


async def test_azure_ad_delegation_key_is_reused_then_renewed(azure_container: str) -> None:
    now = [datetime.datetime.now(datetime.UTC)]
    url = f"azure-ad://{TENANT}/{ACCOUNT}/{azure_container}/"
    credential = StaticTokenCredential(TENANT)
    store = AzureADStore(StoreURL.parse(url), credential=credential, clock=lambda: now[0])
    f = fragment("a/journal", 0, b"x", CompressionCodec.NONE)
    first = _sas(await store.signed_url(f, 60))
    assert (first["sp"], first["spr"], first["sktid"]) == ("r", "https", TENANT)
    assert first["skoid"] == credential.object_id

    now[0] += datetime.timedelta(minutes=59)  # More than half of the key's 2 hours left.
    assert _sas(await store.signed_url(f, 60))["skt"] == first["skt"]

    now[0] += datetime.timedelta(minutes=2)  # Less than half left: a new key.
    renewed = _sas(await store.signed_url(f, 60))
    assert renewed["skt"] != first["skt"]
    await store.close()


async def test_azure_ad_sas_never_outlives_its_key(azure_ad_store: AzureADStore) -> None:
    f = fragment("a/journal", 0, b"x", CompressionCodec.NONE)
    sas = _sas(await azure_ad_store.signed_url(f, 7 * 24 * 3600))
    assert sas["se"] <= sas["ske"]


def test_azure_credentials_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in (
        "AZURE_ACCOUNT_NAME",
        "AZURE_ACCOUNT_KEY",
        "AZURE_CLIENT_ID",
        "AZURE_CLIENT_SECRET",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("GAZETTE_AZURE_BLOB_ENDPOINT", raising=False)
    with pytest.raises(StoreURLError, match="AZURE_ACCOUNT_NAME and AZURE_ACCOUNT_KEY"):
        new_registry().get("azure://container/p/")
    with pytest.raises(StoreURLError, match="AZURE_CLIENT_ID and AZURE_CLIENT_SECRET"):
        new_registry().get("azure-ad://tenant/account/container/p/")

    # Built without any request: the endpoint is Azure's, the credential a client secret's.
    monkeypatch.setenv("AZURE_ACCOUNT_NAME", "myaccount")
    monkeypatch.setenv("AZURE_ACCOUNT_KEY", "a2V5")
    store = new_registry().get("azure://container/p/")
    assert isinstance(store, AzureAccountStore)
    assert store.endpoint == "https://myaccount.blob.core.windows.net"
    monkeypatch.setenv("AZURE_CLIENT_ID", "client")
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "secret")
    ad = new_registry().get("azure-ad://tenant/other/container/p/")
    assert isinstance(ad, AzureADStore)
    assert ad.endpoint == "https://other.blob.core.windows.net"


# --- Large files: chunked uploads and ranged reads --------------------------------------------

_CHUNK_BYTES = 256 << 10  # GCS's chunk granularity.


@pytest.mark.parametrize(
    ("backend", "size"),
    [
        # Above the GCS SDK's 8 MiB limit of single-request uploads: a resumable upload.
        ("gcs", (8 << 20) + 3 * _CHUNK_BYTES + 12345),
        # Above the store's single-request limit: blocks, then a commit.
        ("azure", 3 * _CHUNK_BYTES + 12345),
    ],
)
async def test_large_put_from_a_stream_position_and_chunked_read(
    backend: str, size: int, request: pytest.FixtureRequest
) -> None:
    content = os.urandom(size)
    if backend == "gcs":
        bucket = request.getfixturevalue("gcs_bucket")
        store: Any = GCSStore(StoreURL.parse(f"gs://{bucket}/"), chunk_bytes=_CHUNK_BYTES)
    else:
        container = request.getfixturevalue("azure_container")
        store = AzureAccountStore(StoreURL.parse(f"azure://{container}/"), chunk_bytes=_CHUNK_BYTES)
    f = fragment("big/journal", 0, content, CompressionCodec.NONE)
    src = io.BytesIO(b"HEADER" + content)
    src.seek(6)  # Content is what follows the position, as with a spool file's.
    await store.put(f, src)
    (listed,) = await store.list("big/journal")
    assert (listed.begin, listed.end) == (0, len(content))
    async with await store.open(f) as reader:
        pieces = []
        while piece := await reader.read(1 << 20):
            pieces.append(piece)
    assert b"".join(pieces) == content
    await store.close()


# --- Through a broker -------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["gcs", "azure"])
async def test_a_broker_persists_to_and_reads_back_from_the_store(
    backend: str, request: pytest.FixtureRequest
) -> None:
    # Brokers build these stores from journal specs, through the registry: appends roll and
    # persist fragments there; once those brokers are gone, a fresh one reads it all back
    # from the store alone, and signed URLs (do_not_proxy) read it directly.
    import contextlib

    from broker import client
    from broker.protocol.status import OffsetNotYetAvailableError
    from tests.broker.broker_testkit import Cluster, journal_spec, replica_of

    if backend == "gcs":
        url = f"gs://{request.getfixturevalue('gcs_bucket')}/e2e/"
    else:
        url = f"azure://{request.getfixturevalue('azure_container')}/e2e/"
    journal = f"e2e/{backend}"
    registry = new_registry()
    cluster = Cluster(stores=registry)
    try:
        first = await cluster.start_broker("zone-a", "broker-a")
        await cluster.create(
            journal_spec(journal, length=1024, codec=pb.GZIP, stores=[url]), [first]
        )
        appended = b""
        for i in range(6):
            chunk = b"".join(
                b"%s append %d line %d\n" % (journal.encode(), i, j) for j in range(12)
            )
            assert (await cluster.append(first, journal, [chunk])).status == pb.OK
            appended += chunk
        await cluster.stop_broker(first)  # Persists what it holds, then leaves.

        stored = await registry.get(url).list(journal)
        assert len(stored) >= 2 and sorted((f.begin, f.end) for f in stored)[-1][1] == len(appended)

        second = await cluster.start_broker("zone-b", "broker-b")
        await cluster.assign(journal, [second])
        await replica_of(second, journal).index.wait_first_refresh(30.0)
        for do_not_proxy in (False, True):
            c = client.JournalClient(second.endpoint)
            req = pb.ReadRequest(journal=journal, offset=0, block=False, do_not_proxy=do_not_proxy)
            reader = client.RetryReader(c, req)
            out = b""
            try:
                with contextlib.suppress(OffsetNotYetAvailableError):
                    while chunk := await reader.read():
                        out += chunk
            finally:
                await reader.close()
                await c.channels.close()
            assert out == appended, f"do_not_proxy={do_not_proxy}"
    finally:
        await cluster.close()
        await registry.close()
