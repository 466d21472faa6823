"""grpc's own failure to send on a broken connection is told apart from a peer's answers, and
retried by the append helper (found by the soak: a recorder's append on a connection a broker
kill had just broken failed its shard)."""

from __future__ import annotations

import grpc
import grpc.aio

from broker.append_api import _grpc_error as append_status
from broker.client.appender import retriable
from broker.grpc_transport import CORE_SEND_FAILED, send_failed
from broker.protocol.status import NoJournalPrimaryBrokerError
from broker.resolver import ReplicaNotReadyError, ResolveError, ResolverStoppedError


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


def test_a_broker_going_away_answers_appends_unavailable() -> None:
    """Found by the soak: a broker whose lease expired under load answered appends with
    FAILED_PRECONDITION ("resolver has stopped serving local replicas") while it stopped, and
    clients, which take FAILED_PRECONDITION as final, gave up on them."""
    for err in (
        ResolverStoppedError("resolver has stopped serving local replicas"),
        ReplicaNotReadyError("j: resolved to this broker without a replica"),
    ):
        code, _ = append_status(err)
        assert code == grpc.StatusCode.UNAVAILABLE
        assert retriable(_rpc(code, str(err)))
    # A request proxied from another cluster stays refused: no retry fixes it.
    code, _ = append_status(ResolveError("proxied request's etcd cluster ID 1 is not ours (2)"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert not retriable(_rpc(code, "x"))
