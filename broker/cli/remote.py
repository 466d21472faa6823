"""gazctl commands that talk to a broker (``gazctl.py`` parses; this module does the RPCs)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import Any

from broker import client
from broker.cli.journalspace import JournalChange, spec_to_yaml_dict
from broker.cli.output import emit
from broker.cli.quorum_state import quorum_states, state_text
from broker.client.reader import DataLossError
from broker.client.route_cache import ChannelPool
from broker.fragment.naming import content_name
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import OffsetNotYetAvailableError
from broker.protocol.validate import ValidationError
from broker.security_flags import client_channels_of
from broker.topology import format_id

# An append from gazctl is read into memory first: it must be one atomic append, and a size
# above this is better done with a program using the Appender directly.
append_bytes_max = 64 << 20


async def apply_journals(
    broker: str,
    nodes: Sequence[JournalChange],
    channels: ChannelPool | None = None,
) -> None:
    """Upsert or delete every node in one transaction, expecting each node's revision, or the
    current mod revision for nodes without one (so a concurrent change makes the whole apply
    fail with ETCD_TRANSACTION_FAILED)."""
    c = client.JournalClient(broker, channels=channels)
    try:
        current = {j.spec.name: j.mod_revision for j in (await client.list_journals(c)).journals}
        changes = []
        for spec, name, revision in nodes:
            if spec is None:
                if revision is not None:
                    changes.append(client.delete(name, revision))
                elif name in current:
                    changes.append(client.delete(name, current[name]))
            else:
                expect = current.get(name, 0) if revision is None else revision
                changes.append(client.upsert(spec, expect))
        if changes:
            await client.apply_journals(c, changes)
    finally:
        await c.channels.close()


async def run(args: argparse.Namespace) -> int:
    c = client.JournalClient(args.broker, channels=client_channels_of(args))
    try:
        if args.verb == "list":
            return await _list(c, args)
        if args.verb == "append":
            return await _append(c, args)
        if args.verb == "read":
            return await _read(c, args)
        if args.verb == "fragments":
            return await _fragments(c, args)
        raise ValidationError(f"unknown command {args.verb!r}", "journals")
    finally:
        await c.channels.close()


async def _list(c: client.JournalClient, args: argparse.Namespace) -> int:
    listing = await client.list_journals(c, args.selector or None)
    # Quorum journals also show their term, leader and election (quorum_state.py).
    quorum = await quorum_states(c.channels, c.default_endpoint(), listing.journals)
    records: list[dict[str, Any]] = []
    for j in listing.journals:
        doc = spec_to_yaml_dict(j.spec)
        record: dict[str, Any] = {
            "name": j.spec.name,
            "replication": j.spec.replication,
            "route": _route_text(j.route),
            "mod_revision": j.mod_revision,
        }
        state = quorum.get(j.spec.name)
        if state is not None:
            record["quorum"] = state_text(state) if args.format == "table" else state
        record["spec"] = doc
        records.append(record)
    columns = ["name", "replication", "route", "mod_revision"] + (["quorum"] if quorum else [])
    emit(sys.stdout, args.format, records, columns)
    return 0


def _route_text(route: pb.Route) -> str:
    """Members of a route, the primary marked with a '*'."""
    return ",".join(
        format_id(m) + ("*" if i == route.primary else "") for i, m in enumerate(route.members)
    )


def _read_input(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read(append_bytes_max + 1)
    with open(path, "rb") as f:
        return f.read(append_bytes_max + 1)


async def _append(c: client.JournalClient, args: argparse.Namespace) -> int:
    data = await asyncio.to_thread(_read_input, args.file)
    if len(data) > append_bytes_max:
        raise ValidationError(f"must be at most {append_bytes_max} bytes", "append")
    response = await client.append(c, pb.AppendRequest(journal=args.journal), data)
    print(f"appended {args.journal} [{response.commit.begin}, {response.commit.end})")
    return 0


class ReadGapError(Exception):
    """A non-blocking `journals read` stopped below the write head: content there is not
    available (not yet persisted by a previous primary, or lost)."""


async def _read(c: client.JournalClient, args: argparse.Namespace) -> int:
    """Write the journal's content from `--offset` to stdout. Succeeds only once everything up
    to the write head is written (or, with --block, never: it waits for more). Raises
    DataLossError for lost or corrupt content, including a jump over a gap after the first
    byte (the bytes between would be missing from the output), and ReadGapError for a
    non-blocking read that stops below the write head."""
    reader = client.RetryReader(
        c, pb.ReadRequest(journal=args.journal, offset=args.offset, block=args.block)
    )
    out = sys.stdout.buffer
    expected: int | None = None  # Offset the next chunk must begin at.
    try:
        while (chunk := await reader.read_chunk()).content:
            if expected is None and chunk.offset > args.offset >= 0:
                # Where the content the journal still has begins (retention, or a gap).
                print(
                    f"gazctl: {args.journal}: reading from offset {chunk.offset}: no content"
                    f" is available at {args.offset}",
                    file=sys.stderr,
                )
            elif expected is not None and chunk.offset != expected:
                raise DataLossError(
                    args.journal,
                    f"reading {args.journal}: content [{expected}, {chunk.offset}) is missing"
                    f" (the broker jumped over a gap); output stops at offset {expected}",
                )
            out.write(chunk.content)
            out.flush()
            expected = chunk.offset + len(chunk.content)
    except OffsetNotYetAvailableError:
        # A non-blocking read stopped: done if at the write head, else short of it.
        head = reader.response.write_head
        if reader.offset < head:
            raise ReadGapError(
                f"reading {args.journal}: no content is available at offset {reader.offset},"
                f" below the write head {head} (not yet persisted, or lost); output stops there"
            ) from None
    finally:
        await reader.close()
    return 0


async def _fragments(c: client.JournalClient, args: argparse.Namespace) -> int:
    response = await client.list_all_fragments(c, pb.FragmentsRequest(journal=args.journal))
    records = [
        {
            "begin": f.spec.begin,
            "end": f.spec.end,
            "name": content_name(f.spec),
            "store": f.spec.backing_store or "(local)",
            "mod_time": f.spec.mod_time,
        }
        for f in response.fragments
    ]
    emit(sys.stdout, args.format, records, ["begin", "end", "store", "name"])
    return 0
