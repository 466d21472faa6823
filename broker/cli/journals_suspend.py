"""``gazctl journals suspend -l SELECTOR [--force]``: suspend idle journals (Gazette's command).

For each journal the selector matches that is not fully suspended already, an empty append with
SUSPEND_IF_FLUSHED (``--force``: SUSPEND_NOW) asks its primary to suspend it
(broker/append_suspend.py): a journal that never held content is suspended FULL (no broker keeps
it), one whose content is all persisted and idle PARTIAL (one replica keeps it), one with content
not yet persisted is left as it is unless forced. The next plain append to a suspended journal
resumes it. One line per journal says where it stands: ``suspended``, ``not suspended``, or
``not suspended (quorum)`` (quorum journals are not suspended: not built, and not asked).

Suspension is recorded in the JournalSpec's ``suspend`` field. Operators who apply specs while
journals are suspended should keep that field as they find it (``journals apply`` writes what
the YAML says).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, Final

from broker.cli.output import FORMAT_HELP, FORMATS, emit
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import is_quorum_journal
from broker.protocol.selector import parse_selector
from broker.protocol.status import JournalNotFoundError, SuspendedError

COLUMNS: Final = ("journal", "status")
# Journals asked to suspend at once (Gazette asks them all at once; a bound keeps a selector of
# thousands of journals from opening thousands of streams).
concurrent_suspends_max: Final = 16


def add_command(verbs: Any) -> None:
    """Register ``journals suspend`` on the ``journals`` subparsers."""
    cmd = verbs.add_parser("suspend", help="suspend idle journals (fewer or no broker replicas)")
    cmd.add_argument("-l", "--selector", required=True, help="label selector of journals")
    cmd.add_argument(
        "-f",
        "--force",
        action="store_true",
        help="suspend journals even if they hold content not yet persisted",
    )
    cmd.add_argument("--format", choices=FORMATS, default="table", help=FORMAT_HELP)


async def suspend_journal(c: Any, journal: str, *, force: bool) -> dict[str, Any]:
    """Ask ``journal``'s primary to suspend it; its record (status OK: it was left as it is)."""
    from broker import client

    control = pb.AppendRequest.SUSPEND_NOW if force else pb.AppendRequest.SUSPEND_IF_FLUSHED
    request = pb.AppendRequest(journal=journal, suspend=control)
    try:
        await client.append(c, request)
        status = pb.OK
    except SuspendedError:
        status = pb.SUSPENDED
    return {
        "journal": journal,
        "status": "suspended" if status == pb.SUSPENDED else "not suspended",
    }


async def run(args: argparse.Namespace) -> int:
    from broker import client

    parse_selector(args.selector)  # Refuse a malformed selector before any RPC.
    c = client.JournalClient(args.broker)
    try:
        listing = await client.list_journals(c, args.selector)
        if not listing.journals:
            raise JournalNotFoundError(f"no journals match selector {args.selector!r}")
        unsuspended = [
            j.spec for j in listing.journals if j.spec.suspend.level != pb.JournalSpec.Suspend.FULL
        ]
        # Quorum journals are not suspended (not built): reported, not asked (their leader
        # refuses with FAILED_PRECONDITION).
        names = [spec.name for spec in unsuspended if not is_quorum_journal(spec.labels)]
        quorum = [spec.name for spec in unsuspended if is_quorum_journal(spec.labels)]
        bound = asyncio.Semaphore(concurrent_suspends_max)

        async def one(name: str) -> dict[str, Any]:
            async with bound:
                return await suspend_journal(c, name, force=args.force)

        records = list(await asyncio.gather(*(one(name) for name in names)))
        records += [{"journal": name, "status": "not suspended (quorum)"} for name in quorum]
        records.sort(key=lambda r: str(r["journal"]))
    finally:
        await c.close()
    emit(sys.stdout, args.format, records, COLUMNS)
    return 0
