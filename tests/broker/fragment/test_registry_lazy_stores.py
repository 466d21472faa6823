"""The store registry imports a store's backend only when a URL of its scheme is first used:
opening a signed file:// URL (what a Spark worker does) imports no cloud SDK. Each check runs
in a fresh interpreter, as a worker starts."""

from __future__ import annotations

from pathlib import Path

from tests.fresh_interpreter import imported_of, run_fresh

# The cloud stores' modules and SDKs (each hundreds of modules, up to a second of imports).
CLOUD_MODULES = (
    "boto3",
    "botocore",
    "broker.fragment.stores.s3_store",
    "broker.fragment.stores.gcs_store",
    "broker.fragment.stores.azure_store",
    "google.cloud.storage",
    "azure.storage.blob",
    "azure.identity",
)


def test_opening_a_file_url_imports_no_cloud_store(tmp_path: Path) -> None:
    path = tmp_path / "fragment"
    path.write_bytes(b"hello, fragment\n")
    code = (
        "import asyncio\n"
        "from broker.fragment.stores.registry import new_registry, open_url\n"
        "async def main():\n"
        f"    reader = await open_url({path.as_uri()!r})\n"
        "    try:\n"
        "        data = await reader.read()\n"
        "    finally:\n"
        "        await reader.aclose()\n"
        "    new_registry().get('file:///tmp/')\n"
        "    return data\n"
        "print(repr(asyncio.run(main())))\n"
    )
    assert imported_of(code, CLOUD_MODULES) == ("b'hello, fragment\\n'", [])


def test_an_s3_url_imports_its_store_on_first_use() -> None:
    code = (
        "import sys\n"
        "from broker.fragment.stores.registry import new_registry\n"
        "registry = new_registry()\n"
        "before = 'broker.fragment.stores.s3_store' in sys.modules\n"
        "store = registry.get('s3://a-bucket/root/?region=us-east-1')\n"
        "again = registry.get('s3://a-bucket/root/?region=us-east-1')\n"
        "print(before, type(store).__name__, again is store)\n"
    )
    # Building the store makes a client (no request): any credentials will do.
    keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    assert run_fresh(code, **keys) == "False S3Store True"
