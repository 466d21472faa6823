"""An Append request's registers, for the quorum core: Gazette's semantics as the core's
check and update callables (leader.py), over the core's register values (entry.py).

The same rules as the all-replicas append (append_preconditions.py, append_rules.py): a check
against empty registers passes (Gazette treats an empty set as matching anything); an update
subtracts, then unions; the registers an update leaves are bounded by `labels_per_set_max`
(a ValidationError naming `union_registers`, nothing appended). The core applies them to the
registers as of the leader's head, and an entry carries the set it leaves.
"""

from __future__ import annotations

from broker.append_rules import apply_register_updates, has_register_updates
from broker.protocol import protocol_pb2 as pb
from broker.protocol.limits import labels_per_set_max
from broker.protocol.selector import matches
from broker.protocol.validate import ValidationError
from broker.quorum.entry import Registers
from broker.quorum.leader import RegisterCheck, RegisterUpdate


def registers_of(label_set: pb.LabelSet) -> Registers:
    return tuple((label.name, label.value) for label in label_set.labels)


def label_set_of(registers: Registers) -> pb.LabelSet:
    return pb.LabelSet(labels=[pb.Label(name=n, value=v) for n, v in registers])


def register_check(req: pb.AppendRequest) -> RegisterCheck | None:
    """The request's `check_registers` (None: no check)."""
    if not req.HasField("check_registers"):
        return None
    selector = pb.LabelSelector()
    selector.CopyFrom(req.check_registers)
    return lambda current: not current or matches(selector, label_set_of(current))


def register_update(req: pb.AppendRequest) -> RegisterUpdate | None:
    """The request's `subtract_registers` and `union_registers` (None: no update)."""
    if not has_register_updates(req):
        return None
    updates = pb.AppendRequest()
    updates.CopyFrom(req)

    def update(current: Registers) -> Registers:
        after = apply_register_updates(label_set_of(current), updates)
        if len(after.labels) > labels_per_set_max:
            raise ValidationError(
                f"the journal's registers would hold {len(after.labels)} labels, over"
                f" labels_per_set_max ({labels_per_set_max}): subtract some first",
                "union_registers",
            )
        return registers_of(after)

    return update
