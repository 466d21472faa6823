"""What bench_consumer.py's runs stand on: its journals, its databases (and the durability
settings they really run with, read back from them), the published input, a progress line."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import sqlalchemy as sa
from bench_messages import MESSAGE_POOL, TXN_MESSAGES, Rate, journal_spec, make_messages
from counting_app import CHAIN, OUTPUT, SOURCE, prepare
from sqlalchemy.engine import Engine

from broker import client
from broker.client.append_service import AppendService, AsyncAppend
from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES, Partition, Publisher

PROGRESS_EVERY_S = 0.5
# PostgreSQL settings that decide whether a commit is durable when it returns.
PG_DURABILITY_SETTINGS = ("fsync", "synchronous_commit", "full_page_writes", "wal_sync_method")


def consumer_journals() -> list[pb.JournalSpec]:
    """SOURCE, OUTPUT and CHAIN, with fragments so large that they never roll to a persisted
    one."""
    specs = [journal_spec(j, CONTENT_TYPE_JSON_LINES) for j in (SOURCE, OUTPUT, CHAIN)]
    for spec in specs:
        spec.fragment.length = 1 << 30
    return specs


@contextlib.asynccontextmanager
async def pg_database(pg_url: str) -> AsyncIterator[Engine]:
    """An engine on a database created for this run, dropped afterwards."""
    name = f"bench_consumer_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")

    def ddl(statement: str) -> None:
        with admin.connect() as connection:
            connection.exec_driver_sql(statement)

    await asyncio.to_thread(ddl, f'CREATE DATABASE "{name}"')
    engine = sa.create_engine(sa.make_url(pg_url).set(database=name))
    try:
        yield await prepare(engine)
    finally:
        engine.dispose()
        await asyncio.to_thread(ddl, f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.dispose()


def durability(engine: Engine) -> dict[str, str]:
    """The durability settings `engine`'s connections run with, as the database reports them
    (not as configured): SQLite's journal mode and synchronous level, PostgreSQL's fsync and
    commit settings."""
    with engine.connect() as connection:
        if engine.dialect.name == "sqlite":
            mode = connection.exec_driver_sql("PRAGMA journal_mode").scalar()
            level = connection.exec_driver_sql("PRAGMA synchronous").scalar()
            # PRAGMA synchronous answers a number: 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA.
            names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
            return {
                "journal_mode": str(mode),
                "synchronous": names.get(int(str(level)), str(level)),
            }
        return {
            name: str(connection.exec_driver_sql(f"SHOW {name}").scalar())
            for name in PG_DURABILITY_SETTINGS
        }


def durable_enough(dialect: str, settings: dict[str, str]) -> str | None:
    """Why `settings` are weaker than a user's default (None if they are not)."""
    if dialect == "sqlite":
        if settings["journal_mode"].lower() != "wal" or settings["synchronous"] != "FULL":
            return f"SQLite must run in WAL with synchronous=FULL (got {settings})"
        return None
    if settings["fsync"] != "on" or settings["synchronous_commit"] != "on":
        return f"PostgreSQL must run with fsync=on, synchronous_commit=on (got {settings})"
    return None


class Ticker:
    """A progress line on stderr, rewritten every PROGRESS_EVERY_S while a phase runs."""

    def __init__(self, label: str, total: int, done: Callable[[], int]) -> None:
        self._label, self._total, self._done = label, total, done
        self._task: asyncio.Task[None] | None = None
        self._enabled = sys.stderr.isatty() or os.environ.get("BENCH_PROGRESS") == "1"

    async def _tick(self) -> None:
        t0 = time.perf_counter()
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            done, elapsed = self._done(), time.perf_counter() - t0
            print(
                f"\r  {self._label}: {done:,}/{self._total:,} ({done / elapsed:,.0f}/s)   ",
                end="",
                file=sys.stderr,
                flush=True,
            )

    def __enter__(self) -> Ticker:
        if self._enabled:
            self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            print("\r" + " " * 78 + "\r", end="", file=sys.stderr, flush=True)


async def publish_input(
    c: client.JournalClient, count: int, transactions: bool
) -> tuple[Rate, int]:
    """Publish `count` Readings to SOURCE, every batch acknowledged: (Rate, the journal's
    head)."""
    messages = make_messages(MESSAGE_POOL)
    to_source = lambda _m: Partition(SOURCE, CONTENT_TYPE_JSON_LINES)  # noqa: E731
    done = [0]
    async with AppendService(c) as service:
        publisher = Publisher(service)
        t0, c0 = time.perf_counter(), time.process_time()
        batches: dict[int, AsyncAppend] = {}
        with Ticker("publishing", count, lambda: done[0]):
            for i in range(count):
                message = messages[i % MESSAGE_POOL]
                appended: Any
                if transactions:
                    await publisher.publish_uncommitted(to_source, message)
                    if (i + 1) % TXN_MESSAGES == 0 or i + 1 == count:
                        for ack in await publisher.write_ack_intents(publisher.build_ack_intents()):
                            batches.setdefault(id(ack), ack)
                else:
                    appended = await publisher.publish_committed(to_source, message)
                    batches.setdefault(id(appended), appended)
                done[0] = i + 1
            head = 0
            for batch in batches.values():
                head = max(head, int((await batch).commit.end))
        rate = Rate(count, time.perf_counter() - t0, time.process_time() - c0)
        if service.stats.failed:
            raise RuntimeError(f"{service.stats.failed} append batches failed")
    return rate, head


async def journal_head(c: client.JournalClient, journal: str) -> int:
    """The journal's write head: the end of a zero-byte append made now (a barrier)."""
    response = await client.append(c, pb.AppendRequest(journal=journal), b"")
    return int(response.commit.end)
