"""``gazctl shards recover``: play a shard's recovery log into a local directory.

    gazctl shards recover --id SHARD -d DIR [--format table|yaml|json]

As Gazette's: the shard's hints are fetched from the consumer (its primary hints, else the
newest backup that exists, else none: the whole log is played) and its recovery log is played
from them up to the log's write head, into DIR, with the recovery-log player consumers use
(gazette_consumer/recoverylog/player.py). Nothing is appended to the log: the shard's primary
keeps recording, undisturbed. DIR then holds the store's files as of that head (a checkpoint a
store can be opened on, e.g. for inspection or a backup).

DIR must be absent or empty: the player clears the directory it plays into, and a mistyped
path must never cost a directory of files. A failed playback removes DIR.

The result lists the files recovered (path and size), and the offset played through.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from broker.cli.errors import CommandError
from broker.protocol import consumer_pb2 as cpb
from broker.protocol import protocol_pb2 as pb
from broker.protocol.recorded_op_pb2 import FSMHints
from broker.protocol.validate import ValidationError

COLUMNS = ("path", "bytes", "played_through")


def pick_hints(response: cpb.GetHintsResponse, log: str) -> FSMHints:
    """The hints a shard recovers from: its primary hints, else the newest backup that
    exists, else empty hints of `log` (the whole log is played)."""
    for held in [response.primary_hints, *response.backup_hints]:
        if held.HasField("hints"):
            if held.hints.log != log:
                raise CommandError(
                    f"hints are of log {held.hints.log!r}, not of the shard's log {log!r}"
                )
            return held.hints
    return FSMHints(log=log)


def check_directory(directory: str) -> Path:
    path = Path(directory)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ValidationError(
            f"must be an empty directory or not exist (got {directory!r})", "--dir"
        )
    return path


async def recover(args: argparse.Namespace) -> list[dict[str, Any]]:
    from broker import client
    from gazette_consumer.recoverylog.player import PlaybackError, Player
    from gazette_consumer.recoverylog.segments import InvalidHintsError
    from gazette_consumer.shard_client import ShardClient
    from gazette_consumer.shard_spec import recovery_log

    directory = check_directory(args.dir)
    async with ShardClient(args.consumer) as shards:
        by_id = pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name="id", value=args.id)]))
        listing = await shards.list_shards(by_id)
        if len(listing.shards) != 1:
            raise CommandError(f"no shard has id {args.id!r}")
        spec = listing.shards[0].spec
        log = recovery_log(spec)
        if not log:
            raise CommandError(f"shard {args.id!r} has no recovery log (no recovery_log_prefix)")
        hints = pick_hints(await shards.get_hints(args.id), log)
    journals = client.JournalClient(args.broker)
    try:
        try:
            player = Player(journals, hints, directory)
        except InvalidHintsError as err:
            raise CommandError(f"hints of shard {args.id!r} are invalid: {err}") from None
        player.finish_at_write_head()
        try:
            recovered = await player.play()
        except PlaybackError as err:
            raise CommandError(f"playing recovery log {log}: {err}") from None
    finally:
        await journals.channels.close()
    records: list[dict[str, Any]] = []
    for root, _, files in sorted(os.walk(recovered.directory)):
        for name in sorted(files):
            path = Path(root) / name
            records.append(
                {
                    "path": str(path.relative_to(recovered.directory)),
                    "bytes": path.stat().st_size,
                    "played_through": recovered.write_head,
                }
            )
    return records
