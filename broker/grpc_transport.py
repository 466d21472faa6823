"""gRPC failures of the transport, as opposed to answers of the peer.

grpc.aio reports a message it could not send on a stream whose connection just broke (a peer
killed or restarting) as INTERNAL with the details "Internal error from Core" — not UNAVAILABLE.
No server sends that: it is the local transport failing, and retrying on a new connection is as
safe as after UNAVAILABLE (an append that was not acknowledged is sent again whole)."""

from __future__ import annotations

from typing import Final

import grpc
import grpc.aio

CORE_SEND_FAILED: Final = "Internal error from Core"


def send_failed(err: BaseException) -> bool:
    """Whether ``err`` is grpc's own failure to send a message on a broken connection."""
    return (
        isinstance(err, grpc.aio.AioRpcError)
        and err.code() == grpc.StatusCode.INTERNAL
        and err.details() == CORE_SEND_FAILED
    )
