"""The store registry imports a store's backend only when a URL of its scheme is first used:
opening a signed file:// URL (what a Spark worker does) imports no cloud SDK. Each check runs
in a fresh interpreter, as a worker starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

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


def _run(code: str, **env: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )
    return out.stdout.strip()


def test_opening_a_file_url_imports_no_cloud_store(tmp_path: Path) -> None:
    path = tmp_path / "fragment"
    path.write_bytes(b"hello, fragment\n")
    code = (
        "import asyncio, sys\n"
        "from broker.fragment.stores.registry import new_registry, open_url\n"
        "async def main():\n"
        f"    reader = await open_url({path.as_uri()!r})\n"
        "    try:\n"
        "        data = await reader.read()\n"
        "    finally:\n"
        "        await reader.aclose()\n"
        "    new_registry().get('file:///tmp/')\n"
        "    return data\n"
        "data = asyncio.run(main())\n"
        f"print(repr(data), ','.join(m for m in {CLOUD_MODULES!r} if m in sys.modules))\n"
    )
    assert _run(code) == "b'hello, fragment\\n'"  # and no module named after it


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
    assert _run(code, **keys) == "False S3Store True"
