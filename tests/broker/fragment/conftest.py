"""Fixtures of the cloud fragment stores: real emulators started once per session on loopback
(gcp-storage-emulator for gs://; one Azurite over HTTPS with OAuth for azure:// and azure-ad://),
and a fresh bucket or container per test."""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from broker.fragment.stores.base import StoreURL
from broker.testing.azurite import (
    ACCOUNT,
    TENANT,
    Azurite,
    StaticTokenCredential,
    azurite_blob_bin,
    write_self_signed_cert,
)
from broker.testing.gcs_emulator import GCSEmulator


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GCSEmulator]:
    with GCSEmulator() as server:
        yield server


@pytest.fixture
def gcs_env(gcs_emulator: GCSEmulator, monkeypatch: pytest.MonkeyPatch) -> GCSEmulator:
    for key, value in gcs_emulator.client_env().items():
        monkeypatch.setenv(key, value)
    return gcs_emulator


@pytest.fixture
def gcs_bucket(gcs_env: GCSEmulator) -> str:
    name = f"test-{secrets.token_hex(6)}"
    gcs_env.create_bucket(name)
    return name


@pytest.fixture
async def gcs_store(gcs_bucket: str) -> AsyncIterator[object]:
    from broker.fragment.stores.gcs_store import GCSStore

    store = GCSStore(StoreURL.parse(f"gs://{gcs_bucket}/root/prefix/"))
    yield store
    await store.close()


@pytest.fixture(scope="session")
def azurite_cert() -> Iterator[tuple[Path, Path]]:
    with tempfile.TemporaryDirectory(prefix="gazette-azurite-cert-") as tmp:
        yield write_self_signed_cert(Path(tmp))


@pytest.fixture(scope="session")
def azurite(azurite_cert: tuple[Path, Path]) -> Iterator[Azurite]:
    if azurite_blob_bin() is None:
        pytest.skip("Azurite is not installed: run `make azurite`")
    with Azurite(oauth_cert=azurite_cert) as server:
        yield server


@pytest.fixture
def azure_env(
    azurite: Azurite, azurite_cert: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> Azurite:
    for key, value in azurite.client_env().items():
        monkeypatch.setenv(key, value)
    # Trust the emulator's certificate: requests (the SDK) and urllib (signed URL readers).
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(azurite_cert[0]))
    monkeypatch.setenv("SSL_CERT_FILE", str(azurite_cert[0]))
    return azurite


@pytest.fixture
def azure_container(azure_env: Azurite) -> str:
    name = f"test-{secrets.token_hex(6)}"
    azure_env.create_container(name)
    return name


@pytest.fixture
async def azure_store(azure_container: str) -> AsyncIterator[object]:
    from broker.fragment.stores.azure_store import AzureAccountStore

    store = AzureAccountStore(StoreURL.parse(f"azure://{azure_container}/root/prefix/"))
    yield store
    await store.close()


@pytest.fixture
async def azure_ad_store(azure_container: str) -> AsyncIterator[object]:
    from broker.fragment.stores.azure_store import AzureADStore

    url = f"azure-ad://{TENANT}/{ACCOUNT}/{azure_container}/root/prefix/"
    store = AzureADStore(StoreURL.parse(url), credential=StaticTokenCredential(TENANT))
    yield store
    await store.close()
