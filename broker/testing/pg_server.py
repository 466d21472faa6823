"""A PostgreSQL cluster of its own for soak tests: durable, and restartable like a crashed server.

The unit tests' cluster (scripts/pg_cluster.sh) runs with ``fsync=off`` for speed: a crash of it
may lose committed transactions, which would make a soak's exactly-once checks meaningless.
``PgServer`` runs a throwaway cluster with ``fsync=on`` and ``synchronous_commit=on`` (a commit
returns once its WAL is on disk), on a loopback port of its own, in a directory of its own, so
that a soak may crash it (``crash``: ``pg_ctl stop -m immediate``, no shutdown checkpoint, as
after a power cut minus the unsynced writes) and start it again with its data.

initdb refuses to run as root, so as root the cluster belongs to the ``postgres`` system user
(created if need be), as in scripts/pg_cluster.sh.

Usage::

    async with PgServer() as pg:
        engine = sqlalchemy.create_engine(pg.url)
        await pg.crash()
        await pg.start()
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Final

from broker.testing.lifecycle import AsyncLifecycle
from broker.testing.ports import reserve_port

BIN_DIR: Final = Path("/usr/lib/postgresql/15/bin")
# How long initdb, a start or a stop may take (pg_ctl -t).
ctl_timeout_s: Final = 60
# The cluster's owner when running as root.
PG_SYSTEM_USER: Final = "postgres"
DATABASE: Final = "gazette"
USER: Final = "gazette"
log_tail_bytes: Final = 4000


class PgServerError(RuntimeError):
    """The PostgreSQL cluster could not be created, started or stopped."""


class PgServer(AsyncLifecycle):
    """One durable PostgreSQL cluster on 127.0.0.1 (see the module docstring)."""

    def __init__(self, data_dir: Path | None = None, *, max_connections: int = 200) -> None:
        if not (BIN_DIR / "initdb").exists():
            raise PgServerError(
                f"PostgreSQL 15 binaries not found in {BIN_DIR}: run `make system-deps`"
            )
        self._owns_dir = data_dir is None
        self.root = (
            Path(tempfile.mkdtemp(prefix="gazette-soak-pg-")) if data_dir is None else data_dir
        )
        self.max_connections = max_connections
        self.port = 0
        self.starts = 0

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of the cluster's database (psycopg 3)."""
        if not self.port:
            raise PgServerError("postgres: the URL is unknown until start()")
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{DATABASE}"

    async def start(self) -> None:
        """Create the cluster on the first call; start it (same port and data) on every call.
        Returns once it accepts connections."""
        fresh = not self.data_dir.exists()
        if fresh:
            self.port = reserve_port()
            await self._initdb()
        await self._ctl(
            "start",
            "-l",
            str(self.log_path),
            "-o",
            f"-h 127.0.0.1 -p {self.port} -k {self.data_dir}"
            f" -c max_connections={self.max_connections}"
            # Durable, on purpose (the module docstring says why): these are the defaults,
            # spelled out so that no configuration change can turn them off unnoticed.
            " -c fsync=on -c synchronous_commit=on -c full_page_writes=on",
        )
        self.starts += 1
        if fresh:
            await self._run(
                BIN_DIR / "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, DATABASE
            )

    async def stop(self) -> None:
        """A clean shutdown (``-m fast``: sessions are disconnected, a checkpoint is written)."""
        if self._running():
            await self._ctl("stop", "-m", "fast")

    async def crash(self) -> None:
        """``-m immediate``: every server process exits at once, without a checkpoint; the
        next start recovers from the WAL, as after a crash."""
        if self._running():
            await self._ctl("stop", "-m", "immediate")

    async def close(self) -> None:
        try:
            if self._running():
                await self._ctl("stop", "-m", "immediate")
        finally:
            if self._owns_dir:
                shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self) -> str:
        try:
            return self.log_path.read_bytes()[-log_tail_bytes:].decode(errors="replace")
        except OSError as err:
            return f"(no postgres log: {err})"

    # --- Internals ---

    def _running(self) -> bool:
        return (self.data_dir / "postmaster.pid").exists()

    async def _initdb(self) -> None:
        self.data_dir.mkdir(parents=True)
        if os.getuid() == 0:
            await _ensure_system_user()
            shutil.chown(self.root, PG_SYSTEM_USER)
            shutil.chown(self.data_dir, PG_SYSTEM_USER)
        # No --no-sync: the data directory itself is synced, as a real cluster's is.
        await self._run(
            BIN_DIR / "initdb", "-D", str(self.data_dir), "-U", USER, "--auth=trust", "-E", "UTF8"
        )

    async def _ctl(self, *args: str) -> None:
        await self._run(
            BIN_DIR / "pg_ctl", "-D", str(self.data_dir), "-w", "-t", str(ctl_timeout_s), *args
        )

    async def _run(self, binary: Path, *args: str) -> None:
        argv = [str(binary), *args]
        if os.getuid() == 0:
            argv = ["runuser", "-u", PG_SYSTEM_USER, "--", *argv]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=self.root,
        )
        try:
            async with asyncio.timeout(ctl_timeout_s + 10):
                out, _ = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise PgServerError(f"{binary.name} {' '.join(args)}: timed out") from None
        if proc.returncode != 0:
            raise PgServerError(
                f"{binary.name} {' '.join(args)} exited with {proc.returncode}:\n"
                f"{out.decode(errors='replace')}\n{self.log_tail()}"
            )


async def _ensure_system_user() -> None:
    try:
        pwd.getpwnam(PG_SYSTEM_USER)
        return
    except KeyError:
        pass
    result = await asyncio.to_thread(
        subprocess.run,
        ["useradd", "--system", "--no-create-home", PG_SYSTEM_USER],
        capture_output=True,
        check=False,
    )
    if result.returncode not in (0, 9):  # 9: created meanwhile by someone else.
        raise PgServerError(f"useradd {PG_SYSTEM_USER}: {result.stderr.decode(errors='replace')}")
