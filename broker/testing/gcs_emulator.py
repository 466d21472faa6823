"""A real GCS endpoint for tests: gcp-storage-emulator (PyPI), run as a child process.

The gs:// store talks to it through google-cloud-storage over HTTP, with requests, uploads,
listings, ranged raw downloads and signed URLs all real. Objects are kept in memory.

    with GCSEmulator() as gcs:
        gcs.create_bucket("my-bucket")
        for key, value in gcs.client_env().items(): monkeypatch.setenv(key, value)
        store = new_registry().get("gs://my-bucket/prefix/")

`client_env()` points Google's SDKs at the emulator (STORAGE_EMULATOR_HOST) and supplies
application default credentials: a service-account key file made up for the test (a fresh
RSA key), which the store needs to sign URLs, as it would in production.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from broker.testing.child_server import ChildServer

PROJECT = "gazette-test"
_TOKEN_URI = "https://oauth2.googleapis.com/token"  # Written into the key file, never called.
request_timeout_s = 10.0


def write_service_account_key(
    path: Path, email: str = f"tester@{PROJECT}.iam.gserviceaccount.com"
) -> Path:
    """A service-account key file with a fresh private key, usable for local signing only."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    info = {
        "type": "service_account",
        "project_id": PROJECT,
        "private_key_id": "0" * 40,
        "private_key": pem,
        "client_email": email,
        "client_id": "1",
        "token_uri": _TOKEN_URI,
    }
    path.write_text(json.dumps(info))
    return path


class GCSEmulator(ChildServer):
    name = "gcs-emulator"
    probe_path = "/"

    def command(self, port: int) -> Sequence[str]:
        return [
            sys.executable,
            "-m",
            "gcp_storage_emulator",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--in-memory",
            "--quiet",
        ]

    def client_env(self) -> dict[str, str]:
        """Environment for clients of this emulator (see the module docstring)."""
        key_path = self.work_dir / "service-account.json"
        if not key_path.exists():
            write_service_account_key(key_path)
        return {
            "STORAGE_EMULATOR_HOST": self.endpoint,
            "GOOGLE_APPLICATION_CREDENTIALS": str(key_path),
            "GOOGLE_CLOUD_PROJECT": PROJECT,
        }

    def env(self) -> Mapping[str, str]:
        return {**os.environ, "PYTHONUNBUFFERED": "1"}

    def create_bucket(self, name: str) -> None:
        """Create a bucket through the JSON API."""
        req = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project={PROJECT}",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=request_timeout_s) as resp:
            resp.read()

    def object_metadata(self, bucket: str, key: str) -> dict[str, object]:
        """An object's JSON API resource (for tests checking what a store wrote)."""
        from urllib.parse import quote

        url = f"{self.endpoint}/storage/v1/b/{bucket}/o/{quote(key, safe='')}"
        with urllib.request.urlopen(url, timeout=request_timeout_s) as resp:
            data: dict[str, object] = json.loads(resp.read())
        return data
