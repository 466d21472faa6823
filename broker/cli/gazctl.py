"""gazctl: the operator's command-line tool.

    gazctl journals apply -f specs.yaml [--dry-run]
    gazctl journals list [-l SELECTOR] [--format table|yaml|json]
    gazctl journals append -j JOURNAL [-f FILE]
    gazctl journals read -j JOURNAL [--offset N] [--block]
    gazctl journals fragments -j JOURNAL
    gazctl journals prune -l SELECTOR [--dry-run] [--file-root DIR]
    gazctl journals reset-head -l SELECTOR
    gazctl journals suspend -l SELECTOR [--force]
    gazctl journals store-health STORE_URL [--check-delete-prefix PREFIX]
    gazctl journals edit -l SELECTOR                  (see broker/cli/edit.py)
    gazctl shards list|apply|unassign|edit|prune|recover ...   (see broker/cli/shards.py)
    gazctl attach-uuids [FILE ...]                    (see broker/cli/attach_uuids.py)
    gazctl print-config                               (see broker/cli/print_config.py)

The broker is found through ``--broker`` or ``$BROKER_ADDRESS`` (default ``127.0.0.1:8080``;
``https://host:port`` for a broker serving TLS). Requests to brokers and consumers alike present
``--auth-token`` (``$GAZETTE_AUTH_TOKEN``) or a token signed per request with ``--auth-keys``
(``$GAZETTE_AUTH_KEYS``), and trust ``--tls-ca`` for https:// endpoints (presenting
``--tls-cert``/``--tls-key`` to servers that require a client certificate).
Errors are printed as one line naming what was wrong, with exit status 2 for bad input, 1 for
a failed request, and 3 for data loss (content of a journal that is lost or corrupt).

``journals list`` shows, for a quorum journal, its term, leader and election (a blocked
election with the lost members), and members kept for the term register outside the route: a
``QUORUM`` column, or a ``quorum`` mapping in YAML/JSON with the register's ensemble
(broker/cli/quorum_state.py).

``journals read`` exits 0 only once it has written everything up to the write head (a
non-blocking read; with --block it waits for more until interrupted). It exits 1 if a request
failed (retries are bounded: a broker or store unavailable for one to two minutes ends it) or
if the read stopped below the write head (a gap: content not yet persisted, or lost), and 3 if
the broker answered DATA_LOSS, a fragment failed verification, or the read jumped over a gap
after its first byte. Output written before the error is valid journal content.

Spec files are read strictly and boundedly (strict_yaml.py): a bad document is
one line naming its file, line and field. Whatever the input, gazctl prints no traceback: an
unexpected error (a bug) is one line too, with exit status 1; ``--debug`` (or
``$GAZCTL_DEBUG=1``) prints its traceback as well.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import grpc

from broker import logging as gazette_logging
from broker.cli import (
    attach_uuids,
    journals_store_health,
    journals_suspend,
    journalspace,
    print_config,
    shards,
)
from broker.cli.errors import CommandError
from broker.cli.output import FORMAT_HELP, FORMATS, emit
from broker.cli.strict_yaml import parse_file
from broker.flag_types import log_level
from broker.fragment.stores.base import StoreError
from broker.protocol.selector import parse_selector
from broker.protocol.status import StatusError
from broker.protocol.validate import ValidationError
from broker.security_flags import add_client_options, client_channels_of
from broker.tls import describe_failure

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1
EXIT_DATA_LOSS = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gazctl", description="Operate a gazette cluster.")
    parser.add_argument(
        "--broker",
        default=os.environ.get("BROKER_ADDRESS", "127.0.0.1:8080"),
        help="host:port of any broker of the cluster (default: $BROKER_ADDRESS or 127.0.0.1:8080)",
    )
    parser.add_argument(
        "--log-level",
        type=log_level,
        default="warning",
        help="debug, info, warning or error (default: warning)",
    )
    parser.add_argument(
        "--log-format",
        choices=("console", "json"),
        default="console",
        help="log lines for people (console) or machines (json)",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        default=os.environ.get("GAZCTL_DEBUG", "") not in ("", "0"),
        help="print the traceback of an unexpected error (also $GAZCTL_DEBUG=1)",
    )
    add_client_options(parser)  # --auth-token/--auth-keys, --tls-ca/--tls-cert/--tls-key.
    top = parser.add_subparsers(dest="noun", required=True)

    journals = top.add_parser("journals", help="journal specs, content and fragments")
    verbs = journals.add_subparsers(dest="verb", required=True)

    apply = verbs.add_parser("apply", help="create, update or delete journals from YAML")
    apply.add_argument("-f", "--file", required=True, help="journal-space YAML ('-' for stdin)")
    apply.add_argument("--dry-run", action="store_true", help="validate and print, change nothing")
    apply.add_argument("--format", choices=FORMATS, default="table", help=FORMAT_HELP)

    lst = verbs.add_parser("list", help="list journals matching a label selector")
    lst.add_argument("-l", "--selector", default="", help="label selector (default: every journal)")
    lst.add_argument("--format", choices=FORMATS, default="table", help=FORMAT_HELP)

    append = verbs.add_parser("append", help="append a file (or stdin) as one atomic append")
    append.add_argument("-j", "--journal", required=True, help="journal to append to")
    append.add_argument("-f", "--file", default="-", help="file to append (default: '-', stdin)")

    read = verbs.add_parser("read", help="read journal content to stdout")
    read.add_argument("-j", "--journal", required=True, help="journal to read")
    read.add_argument("--offset", type=int, default=0, help="byte offset to start at (default: 0)")
    read.add_argument("--block", action="store_true", help="wait for new content at the head")

    frags = verbs.add_parser("fragments", help="list a journal's fragments")
    frags.add_argument("-j", "--journal", required=True, help="journal whose fragments to list")
    frags.add_argument("--format", choices=FORMATS, default="table", help=FORMAT_HELP)

    prune = verbs.add_parser(
        "prune", help="delete persisted fragments older than each journal's retention"
    )
    prune.add_argument("-l", "--selector", required=True, help="label selector of journals")
    prune.add_argument("--dry-run", action="store_true", help="print what would be deleted")
    prune.add_argument(
        "--file-root", default="/", help="root directory of file:// stores (as the brokers')"
    )
    prune.add_argument("--format", choices=FORMATS, default="table", help=FORMAT_HELP)

    reset = verbs.add_parser(
        "reset-head",
        help="let appends continue at the fragment index's end (after INDEX_HAS_GREATER_OFFSET)",
    )
    reset.add_argument("-l", "--selector", required=True, help="label selector of journals")
    reset.add_argument("--format", choices=FORMATS, default="table", help=FORMAT_HELP)
    journals_suspend.add_command(verbs)
    journals_store_health.add_command(verbs)

    edit = verbs.add_parser("edit", help="edit journal specs in $EDITOR, applied on save")
    edit.add_argument("-l", "--selector", required=True, help="label selector of journals")
    edit.add_argument("--format", choices=FORMATS, default="table", help=FORMAT_HELP)
    shards.add_commands(top)

    uuids = top.add_parser("attach-uuids", help="prefix lines of text with message UUIDs")
    uuids.add_argument("paths", nargs="*", metavar="FILE", help="input files (default: stdin)")
    uuids.add_argument(
        "--template",
        default=attach_uuids.DEFAULT_TEMPLATE,
        help="output per line: {{.UUID}} and {{.Line}} replaced (default: {{.UUID}},{{.Line}})",
    )
    uuids.add_argument(
        "--max-length", type=int, default=attach_uuids.line_bytes_max_default, help="bytes"
    )
    uuids.add_argument("--skip-header", action="store_true", help="skip each file's first line")

    top.add_parser("print-config", help="print the configuration and where it comes from")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The parsed command line (argparse exits with status 2 on a malformed one)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.noun in ("journals", "shards"):
        # A malformed address is a usage error too, named by its flag (print-config, which
        # shows it, and attach-uuids, which has no use for it, take it as it is).
        from broker.client.route_cache import EndpointError, grpc_target

        for flag in ("--broker", "--consumer"):
            address = getattr(args, flag.removeprefix("--"), None)
            try:
                if address is not None:
                    grpc_target(address)
            except EndpointError as err:
                parser.error(f"argument {flag}: {err.rule}")
    args.argv = argv  # For print-config, which tells flags from defaults.
    return args


def _apply_records(nodes: Sequence[journalspace.JournalChange]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for spec, name, _ in nodes:
        if spec is None:
            records.append({"name": name, "action": "delete"})
            continue
        doc = journalspace.spec_to_yaml_dict(spec)
        frag = doc.get("fragment", {})
        records.append(
            {
                "name": name,
                "action": "upsert",
                "replication": spec.replication,
                "codec": frag.get("compression_codec", ""),
                "stores": ",".join(frag.get("stores", [])),
                "spec": doc,
            }
        )
    return records


async def _operate(args: argparse.Namespace) -> int:
    """prune and reset-head: operator commands over the journals a selector matches."""
    # Imported here: they load the gRPC client and the store backends (boto3).
    from broker import client
    from broker.cli import prune, reset_head
    from broker.fragment.stores.registry import new_registry

    parse_selector(args.selector)  # Refuse a malformed selector before any RPC.
    c = client.JournalClient(args.broker, channels=client_channels_of(args))
    try:
        if args.verb == "prune":
            registry = new_registry(file_root=args.file_root)
            try:
                records = await prune.prune_journals(
                    c, registry, args.selector, dry_run=args.dry_run, progress=sys.stderr
                )
            finally:
                await registry.close()
            columns: Sequence[str] = prune.COLUMNS
        else:
            records = await reset_head.reset_heads(c, args.selector, progress=sys.stderr)
            columns = reset_head.COLUMNS
    finally:
        await c.channels.close()
    emit(sys.stdout, args.format, records, columns)
    return 0


async def _run(args: argparse.Namespace) -> int:
    if args.noun == "shards":
        return await shards.run(args)
    if args.noun == "attach-uuids":
        return attach_uuids.run(args.paths, args.template, args.max_length, args.skip_header)
    if args.noun == "print-config":
        print_config.write(sys.stdout, args, args.argv)
        return 0
    if args.verb == "edit":
        from broker.cli import edit

        return await edit.journals_edit(args)
    if args.verb in ("prune", "reset-head"):
        return await _operate(args)
    if args.verb == "suspend":
        return await journals_suspend.run(args)
    if args.verb in journals_store_health.VERBS:
        return await journals_store_health.run(args)
    if args.verb == "apply":
        nodes = parse_file(args.file, journalspace.parse_journal_changes)
        records = _apply_records(nodes)
        if not args.dry_run:
            from broker.cli import remote

            await remote.apply_journals(args.broker, nodes, client_channels_of(args))
        if args.format == "table":
            emit(sys.stdout, "table", records, ["name", "action", "replication", "codec", "stores"])
        else:
            emit(sys.stdout, args.format, records, [])
        return 0
    from broker.cli import remote

    return await remote.run(args)


def _print_error(text: str) -> None:
    # One line, whatever the error's text holds.
    print("gazctl: " + " ".join(text.splitlines()), file=sys.stderr)


async def run(args: argparse.Namespace) -> int:
    """Run a parsed command on the current event loop; failures are printed as one line and
    returned as the exit status (see the module docstring)."""
    # Imported here, as _run imports the client: only for these exception classes.
    from broker.cli.remote import ReadGapError
    from broker.client.reader import DataLossError

    try:
        return await _run(args)
    except DataLossError as exc:
        _print_error(f"data loss: {exc}")
        return EXIT_DATA_LOSS
    except (ReadGapError, ConnectionError, CommandError) as exc:
        # A read short of the write head; retries of an unreachable broker exhausted.
        _print_error(str(exc))
        return EXIT_FAILED
    except (ValidationError, OSError) as exc:
        _print_error(str(exc))
        return EXIT_BAD_INPUT
    except (StatusError, StoreError) as exc:
        # A refusal by the broker (journal not found, wrong offset, ...), a failed store
        # operation, or nothing to act on: one line naming it.
        _print_error(str(exc))
        return EXIT_FAILED
    except grpc.aio.AioRpcError as exc:
        details = describe_failure(exc.details() or "")
        _print_error(f"broker {args.broker}: {exc.code().name}: {details}")
        return EXIT_FAILED
    except Exception as exc:
        # A bug, not the user's doing: still one line (the traceback on request).
        if getattr(args, "debug", False):
            traceback.print_exc(file=sys.stderr)
        _print_error(
            f"unexpected error: {type(exc).__name__}: {exc}"
            " (a bug in gazctl; --debug or GAZCTL_DEBUG=1 shows its traceback)"
        )
        return EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    gazette_logging.configure(args.log_format, args.log_level)
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
