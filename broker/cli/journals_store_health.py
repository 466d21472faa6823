"""``gazctl journals store-health STORE_URL [--check-delete-prefix PREFIX]`` (Gazette's command;
also ``journals fragment-store-health``): the health of a fragment store, as the broker checks it.

The broker (``--broker``) answers from its background checks of the store (put, get, list and
signed-URL fetch of a test object: broker/fragment/store_health.py), waiting for the first
check if it had not checked that store yet. ``--check-delete-prefix`` also verifies delete
permission, by putting and removing a throwaway object under that prefix ("" for the store's
root; otherwise ending in '/', e.g. ``recovery/``). Prints ``Fragment store URL is healthy``
and exits 0, or exits 1 with one line naming the store and its error.
"""

from __future__ import annotations

import argparse
from typing import Any, Final

from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import raise_for_status

VERBS: Final = ("store-health", "fragment-store-health")
# How long the broker may take to answer (its first check of a store is bounded by a minute).
health_rpc_timeout_s: Final = 90.0


def add_command(verbs: Any) -> None:
    """Register ``journals store-health`` on the ``journals`` subparsers."""
    cmd = verbs.add_parser(
        VERBS[0], aliases=list(VERBS[1:]), help="check the health of a fragment store"
    )
    cmd.add_argument("store_url", metavar="STORE_URL", help="e.g. s3://bucket/prefix/")
    cmd.add_argument(
        "--check-delete-prefix",
        default=None,
        help="also verify delete permission by writing and removing a probe object under this"
        " prefix (ending in '/', e.g. recovery/; '' probes the store root)",
    )


async def run(args: argparse.Namespace) -> int:
    from broker import client

    request = pb.FragmentStoreHealthRequest(fragment_store=args.store_url)
    if args.check_delete_prefix is not None:
        request.check_delete = True
        request.check_delete_prefix = args.check_delete_prefix
    c = client.JournalClient(args.broker)
    try:
        response = await c.default_stub().FragmentStoreHealth(request, timeout=health_rpc_timeout_s)
    finally:
        await c.close()
    # FRAGMENT_STORE_UNHEALTHY (its error names the store and the failed step), or a status
    # no broker answers this RPC with: a typed error, printed as one line.
    raise_for_status(
        response.status, response.store_health_error or f"fragment store {args.store_url}"
    )
    print(f"Fragment store {args.store_url} is healthy", flush=True)
    return 0
