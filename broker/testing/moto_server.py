"""A real S3 endpoint for tests: moto's server mode, run as a child process on loopback.

The S3 store is tested against a real HTTP server rather than patched clients, so that request
signing, path-style addressing, presigned URLs, pagination and multipart uploads all run for
real. moto keeps objects in memory; each test makes its own bucket.

Usage (synchronous, so that a session-scoped fixture can share one server)::

    with MotoServer() as moto:
        moto.create_bucket("my-bucket")
        store_url = f"s3://my-bucket/prefix/?endpoint={moto.endpoint}&region={moto.region}"

Clients need credentials; any will do. `credentials_env()` returns an environment to apply
(e.g. with pytest's monkeypatch) that also hides the host's ~/.aws configuration.

An outage of the store, for soak tests: `pause()` stops the server with SIGSTOP (connections
are still accepted by the kernel, but no request is answered: clients time out, as against a
hung endpoint) and `resume()` continues it with its objects. `stop()` then `start()` would
lose every object (moto keeps them in memory) and move the server to another port, so it is no
way to simulate an outage of a store that keeps its data.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import boto3

from broker.testing.child_server import ChildServer, ChildServerError

REGION = "us-east-1"


class MotoServerError(ChildServerError):
    """The moto test server could not be started or did not become ready."""


def credentials_env() -> dict[str, str]:
    """Environment for S3 clients of the moto server: dummy credentials, the test region, and
    no shared config files (a developer's real profiles must never be picked up)."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }


class MotoServer(ChildServer):
    """One moto server process on 127.0.0.1 (started, probed, paused and stopped as a
    ChildServer)."""

    name = "moto"
    # moto's own API endpoint answers once the server is serving requests.
    probe_path = "/moto-api/"
    error = MotoServerError

    def command(self, port: int) -> Sequence[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]

    def env(self) -> Mapping[str, str]:
        return {**os.environ, **credentials_env()}

    @property
    def region(self) -> str:
        return REGION

    def client(self) -> Any:
        """A boto3 S3 client of this server (for test setup: buckets, raw objects)."""
        return boto3.session.Session(
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name=REGION,
        ).client("s3", endpoint_url=self.endpoint)

    def create_bucket(self, name: str) -> None:
        client = self.client()
        client.create_bucket(Bucket=name)
        client.close()

    def store_url(self, bucket: str, prefix: str = "") -> str:
        """An s3:// fragment store URL of `bucket` on this server."""
        return f"s3://{bucket}/{prefix}?endpoint={self.endpoint}&region={REGION}"
