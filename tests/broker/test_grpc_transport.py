"""grpc's own failure to send on a broken connection is told apart from a peer's answers, and
retried by the append helper (found by the soak: a recorder's append on a connection a broker
kill had just broken failed its shard)."""

from __future__ import annotations

import grpc
import grpc.aio

from broker.client.appender import retriable
from broker.grpc_transport import CORE_SEND_FAILED, send_failed
from broker.protocol.status import NoJournalPrimaryBrokerError


def _rpc(code: grpc.StatusCode, details: str | None = None) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


def test_only_grpcs_send_failure_is_a_transport_failure() -> None:
    assert send_failed(_rpc(grpc.StatusCode.INTERNAL, CORE_SEND_FAILED))
    assert not send_failed(_rpc(grpc.StatusCode.INTERNAL, "the peer's own INTERNAL answer"))
    assert not send_failed(_rpc(grpc.StatusCode.UNKNOWN, CORE_SEND_FAILED))
    assert not send_failed(RuntimeError(CORE_SEND_FAILED))


def test_appends_retry_a_broken_connection_but_not_a_peers_internal_error() -> None:
    assert retriable(_rpc(grpc.StatusCode.INTERNAL, CORE_SEND_FAILED))
    assert retriable(_rpc(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    assert not retriable(_rpc(grpc.StatusCode.INTERNAL, "the peer's own INTERNAL answer"))
    assert not retriable(_rpc(grpc.StatusCode.INVALID_ARGUMENT, "bad request"))
    assert retriable(NoJournalPrimaryBrokerError())


def test_appends_retry_a_broker_that_cancelled_them() -> None:
    """Found by the soak: a broker back from SIGSTOP found its lease gone and stopped at once,
    cancelling the RPCs it served; a recorder's append failed with CANCELLED, and its shard
    with it."""
    assert retriable(_rpc(grpc.StatusCode.CANCELLED, "CANCELLED"))
    assert not retriable(_rpc(grpc.StatusCode.PERMISSION_DENIED, "no"))
