"""``gazctl shards``: shard specs and assignments of a consumer group.

    gazctl shards list [-l SELECTOR] [--format table|yaml|json]
    gazctl shards apply -f SHARDS.yaml [--dry-run] [--format table|yaml|json]
    gazctl shards unassign -l SELECTOR [--failed] [--dry-run] [--format ...]
    gazctl shards edit -l SELECTOR [--format ...]                     (edit.py)
    gazctl shards prune -l SELECTOR [--dry-run] [--file-root DIR]     (shards_prune.py)
    gazctl shards recover --id SHARD -d DIR                           (shards_recover.py)

Any consumer process of the group answers; it is found through ``--consumer`` or
``$CONSUMER_ADDRESS`` (default ``127.0.0.1:9000``). ``list --format yaml`` writes the
hierarchical shard space (``shardspace``) that ``apply`` reads, revisions included, so that the
list-edit-apply cycle refuses to overwrite a concurrent change. ``unassign`` removes the primary
assignment (and any failed one) of each selected shard so the allocator re-assigns it; with
``--failed``, only failed assignments: the way to restart failed shards.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
import yaml

from broker.cli import shardspace
from broker.cli.output import FORMAT_HELP, FORMATS, emit
from broker.cli.strict_yaml import parse_file
from broker.protocol import consumer_pb2 as cpb
from broker.protocol.selector import parse_selector
from broker.security_flags import client_channels_of
from broker.tls import describe_failure

if TYPE_CHECKING:
    from gazette_consumer.shard_client import ShardClient

EXIT_FAILED = 1
LIST_COLUMNS = ("id", "status", "primary", "replicas", "revision")
APPLY_COLUMNS = ("id", "action", "revision", "hot_standbys", "sources")
UNASSIGN_COLUMNS = ("id", "action")
# Shards per Unassign request: each may remove a primary and failed standbys, and one request
# is one etcd transaction of at most 128 operations.
unassign_batch_max = 32


def add_commands(top: Any) -> None:
    """Add the ``shards`` noun to gazctl's sub-command parsers."""
    shards = top.add_parser("shards", help="consumer shard specs and assignments")
    shards.add_argument(
        "--consumer",
        default=os.environ.get("CONSUMER_ADDRESS", "127.0.0.1:9000"),
        help="address of any consumer process of the group",
    )
    verbs = shards.add_subparsers(dest="verb", required=True)

    lst = verbs.add_parser("list", help="list shards, their routes and replica statuses")
    lst.add_argument("-l", "--selector", default="", help="label selector (meta-label: id)")
    lst.add_argument("--format", choices=FORMATS, default="table", help=FORMAT_HELP)

    apply = verbs.add_parser("apply", help="create, update or delete shards from YAML")
    apply.add_argument("-f", "--file", required=True, help="shard-space YAML ('-' for stdin)")
    apply.add_argument("--dry-run", action="store_true", help="validate and print, change nothing")
    apply.add_argument("--format", choices=FORMATS, default="table", help=FORMAT_HELP)

    unassign = verbs.add_parser("unassign", help="remove shard assignments to re-assign them")
    unassign.add_argument("-l", "--selector", required=True, help="label selector of shards")
    unassign.add_argument("--failed", action="store_true", help="only failed assignments")
    unassign.add_argument("--dry-run", action="store_true", help="print, change nothing")
    unassign.add_argument("--format", choices=FORMATS, default="table", help=FORMAT_HELP)

    edit = verbs.add_parser("edit", help="edit shard specs in $EDITOR, applied on save")
    edit.add_argument("-l", "--selector", required=True, help="label selector of shards")
    edit.add_argument("--format", choices=FORMATS, default="table", help=FORMAT_HELP)

    prune = verbs.add_parser(
        "prune", help="delete recovery-log fragments no shard's hints still need"
    )
    prune.add_argument("-l", "--selector", required=True, help="label selector of shards")
    prune.add_argument("--dry-run", action="store_true", help="print what would be deleted")
    prune.add_argument(
        "--file-root", default="/", help="root directory of file:// stores (as the brokers')"
    )
    prune.add_argument("--format", choices=FORMATS, default="table", help=FORMAT_HELP)

    recover = verbs.add_parser("recover", help="play a shard's recovery log into a directory")
    recover.add_argument("--id", required=True, help="shard ID")
    recover.add_argument("-d", "--dir", required=True, help="directory to play the log into")
    recover.add_argument("--format", choices=FORMATS, default="table", help=FORMAT_HELP)


async def run(args: argparse.Namespace) -> int:
    """Run a parsed ``gazctl shards`` command. Bad input raises ValidationError and refusals
    their typed ShardStatusError (gazctl prints them); a consumer that cannot be reached, or
    fails the call, is reported here as one line (exit status 1)."""
    try:
        return await _run(args)
    except grpc.aio.AioRpcError as exc:
        details = describe_failure(exc.details() or "")
        print(f"gazctl: consumer {args.consumer}: {exc.code().name}: {details}", file=sys.stderr)
        return EXIT_FAILED


def _client(args: argparse.Namespace) -> ShardClient:
    """A client of ``--consumer``, authorized and secured as gazctl's options say."""
    from gazette_consumer.shard_client import ShardClient

    return ShardClient(args.consumer, channels=client_channels_of(args, channels_max=1))


async def _run(args: argparse.Namespace) -> int:
    if args.verb == "edit":
        from broker.cli import edit

        return await edit.shards_edit(args)
    if args.verb == "prune":
        return await _prune(args)
    if args.verb == "recover":
        from broker.cli import shards_recover

        records = await shards_recover.recover(args)
        emit(sys.stdout, args.format, records, shards_recover.COLUMNS)
        return 0

    if args.verb == "apply":
        changes = parse_file(args.file, shardspace.parse_shard_space)
        if not args.dry_run:
            async with _client(args) as client:
                await client.apply([c.to_change() for c in changes])
        _emit_apply(args, changes)
        return 0
    selector = parse_selector(args.selector)  # Refuse a malformed selector before any RPC.
    async with _client(args) as client:
        listing = await client.list_shards(selector)
        if args.verb == "list":
            _emit_list(args, listing)
            return 0
        ids = [s.spec.id for s in listing.shards]
        done: list[str] = []
        for start in range(0, len(ids), unassign_batch_max):
            batch = ids[start : start + unassign_batch_max]
            done += await client.unassign(batch, only_failed=args.failed, dry_run=args.dry_run)
    action = "would unassign" if args.dry_run else "unassigned"
    emit(sys.stdout, args.format, [{"id": s, "action": action} for s in done], UNASSIGN_COLUMNS)
    if not done:
        print("gazctl: no assignment matched; nothing changed", file=sys.stderr)
    return 0


async def _prune(args: argparse.Namespace) -> int:
    from broker import client
    from broker.cli import shards_prune
    from broker.fragment.stores.registry import new_registry
    from gazette_consumer.shard_client import ShardClient

    parse_selector(args.selector)  # Refuse a malformed selector before any RPC.
    journals = client.JournalClient(args.broker)
    registry = new_registry(file_root=args.file_root)
    try:
        async with ShardClient(args.consumer) as shard_client:
            try:
                records = await shards_prune.prune_shards(
                    shard_client,
                    journals,
                    registry,
                    args.selector,
                    dry_run=args.dry_run,
                    progress=sys.stderr,
                )
            except shards_prune.PruneFailedError as err:
                emit(sys.stdout, args.format, err.records, shards_prune.COLUMNS)
                raise
    finally:
        await registry.close()
        await journals.channels.close()
    emit(sys.stdout, args.format, records, shards_prune.COLUMNS)
    return 0


# --- Output -----------------------------------------------------------------------------------


def _status_code(status: cpb.ReplicaStatus) -> str:
    return str(cpb.ReplicaStatus.Code.Name(status.code))


def list_records(listing: cpb.ListResponse) -> list[dict[str, Any]]:
    """One record per shard: its reduced status, primary and replicas (``suffix:STATUS``),
    revision, and the full spec and statuses (for yaml/json)."""
    records: list[dict[str, Any]] = []
    for shard in listing.shards:
        primary = "<none>"
        replicas: list[str] = []
        worst = cpb.ReplicaStatus.IDLE
        for index, member in enumerate(shard.route.members):
            status = shard.status[index] if index < len(shard.status) else cpb.ReplicaStatus()
            worst = max(worst, status.code)
            text = f"{member.suffix}:{_status_code(status)}"
            if index == shard.route.primary:
                primary = text
            else:
                replicas.append(text)
        records.append(
            {
                "id": shard.spec.id,
                "status": cpb.ReplicaStatus.Code.Name(worst),
                "primary": primary,
                "replicas": ",".join(replicas),
                "revision": shard.mod_revision,
                "errors": [e for s in shard.status for e in s.errors],
                "spec": shardspace.spec_to_yaml(shard.spec),
            }
        )
    return records


def _emit_list(args: argparse.Namespace, listing: cpb.ListResponse) -> None:
    if args.format == "yaml":
        # The shard space `apply` reads, with revisions: Gazette's list-edit-apply cycle.
        doc = shardspace.shard_space_doc([(s.spec, s.mod_revision) for s in listing.shards])
        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))
        return
    emit(sys.stdout, args.format, list_records(listing), LIST_COLUMNS)


def _emit_apply(args: argparse.Namespace, changes: Sequence[shardspace.ShardChange]) -> None:
    records = [
        {
            "id": c.id,
            "action": "delete" if c.spec is None else "upsert",
            "revision": c.revision,
            "hot_standbys": c.spec.hot_standbys if c.spec is not None else "",
            "sources": ",".join(s.journal for s in c.spec.sources) if c.spec is not None else "",
            "spec": shardspace.spec_to_yaml(c.spec) if c.spec is not None else None,
        }
        for c in changes
    ]
    emit(sys.stdout, args.format, records, APPLY_COLUMNS)
