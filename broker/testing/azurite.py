"""A real Azure Blob Storage endpoint for tests: Azurite (npm), run as a child process.

The azure:// store talks to it through azure-storage-blob over HTTP: Shared Key signing,
block uploads, listings, downloads and SAS URLs all run for real. Blobs are kept in memory.

Azurite is an npm package: `make azurite` installs it under `.tools/azurite` of the repository
(Node.js from the system); `azurite_blob_bin()` finds it there or on PATH, or returns None.

    with Azurite() as azure:
        azure.create_container("fragments")
        for key, value in azure.client_env().items(): monkeypatch.setenv(key, value)
        store = new_registry().get("azure://fragments/prefix/")

The account is Azurite's well-known development account; its endpoint is path-style,
`http://127.0.0.1:<port>/devstoreaccount1`.
"""

from __future__ import annotations

import shutil
import ssl
from collections.abc import Sequence
from pathlib import Path

from broker.testing.child_server import ChildServer

ACCOUNT = "devstoreaccount1"
# The Azure AD tenant of tests' azure-ad:// stores (Azurite takes any).
TENANT = "72f988bf-0000-0000-0000-00000000beef"
# Azurite's published development key: not a secret.
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
_REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_DIR = _REPO_ROOT / ".tools" / "azurite"


def azurite_blob_bin() -> str | None:
    """The azurite-blob executable: the repository's `.tools` install, else PATH."""
    local = INSTALL_DIR / "node_modules" / ".bin" / "azurite-blob"
    if local.exists():
        return str(local)
    return shutil.which("azurite-blob")


class Azurite(ChildServer):
    name = "azurite"
    probe_path = f"/{ACCOUNT}?comp=properties&restype=service"

    def __init__(self, *, oauth_cert: tuple[Path, Path] | None = None) -> None:
        """`oauth_cert`: (certificate, key) PEM files; serves HTTPS and accepts OAuth bearer
        tokens (Azurite's "basic" check: issuer, audience and expiry, not the signature)."""
        super().__init__()
        self._oauth_cert = oauth_cert

    @property
    def endpoint(self) -> str:
        scheme = "https" if self._oauth_cert else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def command(self, port: int) -> Sequence[str]:
        binary = azurite_blob_bin()
        if binary is None:
            raise FileNotFoundError("azurite-blob is not installed: run `make azurite`")
        cmd = [
            binary,
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(port),
            "--inMemoryPersistence",
            "--disableTelemetry",
            "--skipApiVersionCheck",
            "--silent",
        ]
        if self._oauth_cert:
            cert, key = self._oauth_cert
            cmd += ["--oauth", "basic", "--cert", str(cert), "--key", str(key)]
        return cmd

    def probe_ssl_context(self) -> ssl.SSLContext | None:
        if not self._oauth_cert:
            return None
        return ssl.create_default_context(cafile=str(self._oauth_cert[0]))

    @property
    def account_endpoint(self) -> str:
        return f"{self.endpoint}/{ACCOUNT}"

    def client_env(self) -> dict[str, str]:
        """Environment for azure:// stores of this server (see the module docstring)."""
        return {
            "AZURE_ACCOUNT_NAME": ACCOUNT,
            "AZURE_ACCOUNT_KEY": ACCOUNT_KEY,
            "GAZETTE_AZURE_BLOB_ENDPOINT": f"{self.endpoint}/{{account}}",
        }

    def service_client(self) -> object:
        """An azure-storage-blob BlobServiceClient of the development account (test setup)."""
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient(
            self.account_endpoint, credential={"account_name": ACCOUNT, "account_key": ACCOUNT_KEY}
        )

    def create_container(self, name: str) -> None:
        from azure.storage.blob import BlobServiceClient

        client = self.service_client()
        assert isinstance(client, BlobServiceClient)
        with client:
            client.create_container(name)


def write_self_signed_cert(directory: Path, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """(certificate, key) PEM files of a fresh self-signed certificate for `host` (an IP)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "azurite-cert.pem", directory / "azurite-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class StaticTokenCredential:
    """An azure-core TokenCredential handing out a made-up Azure AD access token of `tenant`,
    in the shape Azurite's "basic" OAuth check accepts (it does not verify signatures). It
    stands in for the client-secret login, which needs Microsoft's login servers."""

    token_ttl_s = 3600

    def __init__(
        self, tenant: str, object_id: str = "00000000-0000-0000-0000-00000000c0de"
    ) -> None:
        self.tenant = tenant
        self.object_id = object_id
        self.scopes_requested: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str, **kwargs: object) -> object:
        import time

        import jwt
        from azure.core.credentials import AccessToken

        self.scopes_requested.append(scopes)
        now = int(time.time())
        claims = {
            "aud": "https://storage.azure.com",
            "iss": f"https://sts.windows.net/{self.tenant}/",
            "tid": self.tenant,
            "oid": self.object_id,
            "iat": now,
            "nbf": now - 60,
            "exp": now + self.token_ttl_s,
        }
        token = jwt.encode(claims, "not-a-real-signing-key-of-32-bytes!", algorithm="HS256")
        return AccessToken(token, now + self.token_ttl_s)
