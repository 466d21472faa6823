"""``gazctl journals edit`` and ``gazctl shards edit``: the selected specs in $EDITOR, applied
on save with the revisions they were listed at (editor.py has the loop).

    gazctl journals edit -l SELECTOR [--format table|yaml|json]
    gazctl shards edit -l SELECTOR [--format ...]

Journals are written as a journal space (journalspace.py) and shards as a shard space
(shardspace.py), each journal or shard with its etcd mod revision: the apply is one
transaction that fails, reopening the editor, if any of them changed since it was listed.
A selector matching nothing is an error (Gazette's too). The result is a table of the changes
applied (nothing is printed on stdout when the edit is cancelled).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from broker.cli import journalspace, shardspace
from broker.cli.editor import edit_loop
from broker.cli.errors import CommandError
from broker.cli.output import emit
from broker.protocol.selector import parse_selector

JOURNAL_COLUMNS = ("name", "action", "revision")
SHARD_COLUMNS = ("id", "action", "revision")


class NothingSelectedError(CommandError):
    """The selector matched no journal or shard: nothing to edit."""

    def __init__(self, what: str, selector: str) -> None:
        super().__init__(f"no {what} match selector {selector!r}; nothing to edit")


def _yaml(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


async def journals_edit(args: argparse.Namespace) -> int:
    from broker import client
    from broker.cli import remote

    selector = parse_selector(args.selector)
    c = client.JournalClient(args.broker)
    try:
        listing = await client.list_journals(c, selector)
    finally:
        await c.channels.close()
    if not listing.journals:
        raise NothingSelectedError("journals", args.selector)
    body = _yaml(
        journalspace.journal_space_doc([(j.spec, j.mod_revision) for j in listing.journals])
    )

    async def apply(text: str) -> list[journalspace.JournalChange]:
        changes = journalspace.parse_journal_changes(text)
        await remote.apply_journals(args.broker, changes)
        return changes

    edited = await edit_loop(
        "journal specs", body, apply, file_prefix="gazctl-journals-edit-", stderr=sys.stderr
    )
    if edited.applied is not None:
        records = [
            {
                "name": change.name,
                "action": "delete" if change.spec is None else "upsert",
                "revision": change.revision,
                "spec": None
                if change.spec is None
                else journalspace.spec_to_yaml_dict(change.spec),
            }
            for change in edited.applied
        ]
        emit(sys.stdout, args.format, records, JOURNAL_COLUMNS)
    return 0


async def shards_edit(args: argparse.Namespace) -> int:
    from gazette_consumer.shard_client import ShardClient

    selector = parse_selector(args.selector)
    async with ShardClient(args.consumer) as shards:
        listing = await shards.list_shards(selector)
        if not listing.shards:
            raise NothingSelectedError("shards", args.selector)
        body = _yaml(shardspace.shard_space_doc([(s.spec, s.mod_revision) for s in listing.shards]))

        async def apply(text: str) -> list[shardspace.ShardChange]:
            changes = shardspace.parse_shard_space(text)
            await shards.apply([c.to_change() for c in changes])
            return changes

        edited = await edit_loop(
            "shard specs", body, apply, file_prefix="gazctl-shards-edit-", stderr=sys.stderr
        )
    if edited.applied is not None:
        records = [
            {
                "id": change.id,
                "action": "delete" if change.spec is None else "upsert",
                "revision": change.revision,
                "spec": None if change.spec is None else shardspace.spec_to_yaml(change.spec),
            }
            for change in edited.applied
        ]
        emit(sys.stdout, args.format, records, SHARD_COLUMNS)
    return 0
