"""gazctl: the operator's command-line tool.

    gazctl journals apply -f specs.yaml [--dry-run]
    gazctl journals list [-l SELECTOR] [--format table|yaml|json]
    gazctl journals append -j JOURNAL [-f FILE]
    gazctl journals read -j JOURNAL [--offset N] [--block]
    gazctl journals fragments -j JOURNAL

The broker is found through ``--broker`` or ``$BROKER_ADDRESS`` (default ``127.0.0.1:8080``).
Errors are printed as one line naming what was wrong, with exit status 2 for bad input and 1 for
a failed request.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from typing import Any

import grpc

from broker import logging as gazette_logging
from broker.cli import journalspace
from broker.cli.output import FORMATS, emit
from broker.protocol.status import StatusError
from broker.protocol.validate import ValidationError

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gazctl", description="Operate a gazette cluster.")
    parser.add_argument("--broker", default=os.environ.get("BROKER_ADDRESS", "127.0.0.1:8080"))
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--log-format", choices=("console", "json"), default="console")
    top = parser.add_subparsers(dest="noun", required=True)

    journals = top.add_parser("journals", help="journal specs, content and fragments")
    verbs = journals.add_subparsers(dest="verb", required=True)

    apply = verbs.add_parser("apply", help="create, update or delete journals from YAML")
    apply.add_argument("-f", "--file", required=True, help="journal-space YAML ('-' for stdin)")
    apply.add_argument("--dry-run", action="store_true", help="validate and print, change nothing")
    apply.add_argument("--format", choices=FORMATS, default="table")

    lst = verbs.add_parser("list", help="list journals matching a label selector")
    lst.add_argument("-l", "--selector", default="")
    lst.add_argument("--format", choices=FORMATS, default="table")

    append = verbs.add_parser("append", help="append a file (or stdin) as one atomic append")
    append.add_argument("-j", "--journal", required=True)
    append.add_argument("-f", "--file", default="-")

    read = verbs.add_parser("read", help="read journal content to stdout")
    read.add_argument("-j", "--journal", required=True)
    read.add_argument("--offset", type=int, default=0)
    read.add_argument("--block", action="store_true", help="wait for new content at the head")

    frags = verbs.add_parser("fragments", help="list a journal's fragments")
    frags.add_argument("-j", "--journal", required=True)
    frags.add_argument("--format", choices=FORMATS, default="table")
    return parser


def _read_input(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def _apply_records(nodes: Sequence[tuple[Any, str]]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for spec, name in nodes:
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


async def _run(args: argparse.Namespace) -> int:
    if args.verb == "apply":
        nodes = journalspace.parse_journal_space(_read_input(args.file))
        records = _apply_records(nodes)
        if not args.dry_run:
            from broker.cli import remote

            await remote.apply_journals(args.broker, nodes)
        if args.format == "table":
            emit(sys.stdout, "table", records, ["name", "action", "replication", "codec", "stores"])
        else:
            emit(sys.stdout, args.format, records, [])
        return 0
    from broker.cli import remote

    return await remote.run(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    gazette_logging.configure(args.log_format, args.log_level)
    try:
        return asyncio.run(_run(args))
    except (ValidationError, OSError) as exc:
        print(f"gazctl: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except StatusError as exc:
        # A refusal by the broker (journal not found, wrong offset, ...): one line, its status.
        print(f"gazctl: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except grpc.aio.AioRpcError as exc:
        print(f"gazctl: broker {args.broker}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
