"""``gazette-consumer``: the consumer process runner.

The consumer framework (Application, shards, transactions) is being built; until it lands this
runner only validates its arguments and says so, rather than pretending to serve shards.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

EXIT_UNAVAILABLE = 3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gazette-consumer", description="Run consumer shards.")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the shards of an Application")
    serve.add_argument("--app", required=True, help="module:Class of the Application")
    serve.add_argument("--etcd", action="append", default=[])
    serve.add_argument("--zone", default="local")
    serve.add_argument("--id", default="consumer")
    serve.add_argument("--port", type=int, default=9000)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    print(
        f"gazette-consumer: cannot serve {args.app}: consumer shards are not available in this "
        "version yet (the consumer framework is in progress)",
        file=sys.stderr,
    )
    return EXIT_UNAVAILABLE


if __name__ == "__main__":
    sys.exit(main())
