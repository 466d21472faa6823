"""Where a quorum-mode journal leaves the all-replicas path.

The broker's RPC handlers ask `quorum_mode_refusal` about a journal before running Gazette's
all-replicas machinery on it. A journal labelled `gazette.dev/replication-mode=quorum` must
never be served by the all-replicas pipeline: its spec promises majority commits with terms and
fencing, and silently replicating it the other way would acknowledge appends under the wrong
guarantees. Until the quorum shell serves appends (docs/design/quorum.md, "part two: built /
remaining"), such appends are refused with a typed error naming the label, and nothing is
written; reads of the (empty) journal are unaffected. This function is the hook the shell's
append path replaces.
"""

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
