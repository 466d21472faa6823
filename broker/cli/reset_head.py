"""``gazctl journals reset-head``: the operator's explicit recovery from INDEX_HAS_GREATER_OFFSET.

Appends are transactions whose offsets every broker of the route agrees on; a broker joining a
route learns the journal's head by taking part in one. If every broker that took part is lost
at once (as many failures as the replication factor), the brokers now serving the journal
start from offset zero, below what the fragment store holds. They cannot tell whether some
broker cut off from etcd still holds committed content beyond the store, and moving on from the
store's end by themselves could write those offsets twice. So they refuse every append with
INDEX_HAS_GREATER_OFFSET until an operator confirms where the journal continues.

This command is that confirmation. For each journal the selector matches, it asks the
journal's brokers for the largest offset their fragment index knows (ListFragments, which waits
for the index's first store listing), then sends a zero-byte append with that explicit offset.
The primary accepts an explicit offset equal to the index's end, synchronises every replica's
spool to it, and appends go on from there. Nothing in the store is written or overwritten.

As Gazette's, the append is SUSPEND_KEEP: a partially suspended journal is reset through its one
replica and stays suspended (a plain append would resume it); a fully suspended journal has no
replica to reset and is skipped (outcome "suspended").

Run it only once every earlier broker of the journal has exited (their last fragments
persisted). It is harmless on a consistent journal that is being appended to: the append
either lands at the head (a no-op) or races a concurrent append and is refused with
WRONG_APPEND_OFFSET, reported as "raced" (the head had already moved on, so nothing needed
resetting).
"""

from __future__ import annotations

from typing import Any, TextIO

from broker import client
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import JournalNotFoundError, WrongAppendOffsetError

COLUMNS = ("journal", "head", "outcome")


async def head_offset(c: client.JournalClient, journal: str) -> int:
    """The largest offset the journal's fragment index knows (0 for an empty journal)."""
    response = await client.list_all_fragments(c, pb.FragmentsRequest(journal=journal))
    return max((f.spec.end for f in response.fragments), default=0)


async def reset_head(c: client.JournalClient, journal: str) -> tuple[int, str]:
    """Reset one journal's append offset to its indexed head: (head, outcome)."""
    head = await head_offset(c, journal)
    if head == 0:
        # Offset 0 on the wire means "no explicit offset": there is nothing to confirm anyway.
        return head, "empty"
    request = pb.AppendRequest(journal=journal, offset=head, suspend=pb.AppendRequest.SUSPEND_KEEP)
    appender = client.Appender(c, request)
    try:
        await appender.commit()
    except WrongAppendOffsetError:
        return head, "raced"
    return head, "reset"


async def reset_heads(
    c: client.JournalClient, selector: str, *, progress: TextIO
) -> list[dict[str, Any]]:
    """Reset every journal matching `selector`, one after the other; a record per journal.
    Failures other than a raced append (e.g. no primary broker) stop the command."""
    listing = await client.list_journals(c, selector)
    if not listing.journals:
        raise JournalNotFoundError(f"no journals match selector {selector!r}")
    records: list[dict[str, Any]] = []
    for journal in listing.journals:
        name = journal.spec.name
        if journal.spec.suspend.level == pb.JournalSpec.Suspend.FULL:
            head, outcome = journal.spec.suspend.offset, "suspended"
        else:
            head, outcome = await reset_head(c, name)
        print(f"{name}: {outcome} at offset {head}", file=progress, flush=True)
        records.append({"journal": name, "head": head, "outcome": outcome})
    return records
