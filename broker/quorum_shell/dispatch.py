"""Where a quorum-mode journal leaves the all-replicas path, when no quorum shell is there.

A journal labelled `gazette.dev/replication-mode=quorum` must never be served by the
all-replicas pipeline: its spec promises majority commits with terms and fencing, and silently
replicating it the other way would acknowledge appends under the wrong guarantees. A broker
(`server.Broker`) serves such appends through its `QuorumJournals` (append.py); an `AppendApi`
built without one (an embedder's, a test's) refuses them with this typed error naming the
label, writing nothing."""

from __future__ import annotations

from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb


class QuorumModeNotServedError(Exception):
    """An append to a quorum-mode journal, which this broker does not serve yet."""


def quorum_mode_refusal(
    journal: str, spec: pb.JournalSpec | None
) -> QuorumModeNotServedError | None:
    """The error refusing an append to `journal`, or None to run the all-replicas path (the
    default, and every journal without the label or labelled all-replicas)."""
    if spec is None or not gl.is_quorum_journal(spec.labels):
        return None
    return QuorumModeNotServedError(
        f"journal {journal!r} has label {gl.REPLICATION_MODE}={gl.REPLICATION_MODE_QUORUM},"
        " which this broker does not serve yet: appends are refused rather than replicated in"
        f" the all-replicas mode (remove the label, or set it to {gl.REPLICATION_MODE_ALL_REPLICAS})"
    )
