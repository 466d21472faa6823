"""The chaos of the FAULTS phase: a timer that, every `chaos_every_ticks` or so, crashes a
member (the leader more often than others; now and then wiping its disk), crashes a
coordinator, partitions or heals the network, and in the seeds that change ensembles wants
another one now and then (the allocator moving a replica: `want_another_ensemble`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from broker.quorum.sim.double_faults import wipe_beside_a_deposed_leader
from broker.quorum.sim.faults import crash, may_lose_a_disk
from broker.quorum.sim.nodes import RESTART, MemberNode

if TYPE_CHECKING:
    from broker.quorum.sim.world import World

CHAOS = "chaos"  # the chaos timer's node name


def chaos(world: World) -> None:
    """One firing of the chaos timer (while the faults last): at most one fault, then the
    next firing scheduled."""
    net, rng, config = world.net, world.net.rng, world.config
    r = rng.random() / world.chaos_scale
    if world.deposed_wipe_p and world.deposed_rng.random() < world.deposed_wipe_p:
        if wipe_beside_a_deposed_leader(world):
            r = 1.0  # nothing else this time
    if world.change_p and world.change_rng.random() < world.change_p:
        want_another_ensemble(world)
    if r < 0.12:
        leader = world.register.read().record.leader
        crash(world, leader or rng.choice(world.ensemble))
    elif r < 0.27:
        name = rng.choice(world.ensemble)
        # Never below the initial size (a replacement that removed first): an ensemble
        # of two cannot spare a lost disk, and neither could the one it replaces.
        wipe = (
            rng.random() < world.disk_loss_p
            and all(m.voter for m in world.members)
            and may_lose_a_disk(world)
        )
        if wipe and world.wiped and world.deposed_rng.random() < world.rewipe_p:
            # The same member again: the alignment that brought it back after its first
            # loss may be re-delivered after its second (what its nonce is for).
            name = world.deposed_rng.choice(sorted(world.wiped))
        crash(world, name, wipe)
    elif r < 0.34:
        crash(world, rng.choice(world.coordinator_names))
    elif r < 0.46:
        names = (*world.pool, *world.coordinator_names, world.register_name)
        leader = world.register.read().record.leader
        if leader and rng.random() < 0.5:
            # The leader alone: clients still reach it, so it gathers entries no one
            # else holds while the others elect another leader.
            net.groups = {n: int(n == leader) for n in names}
        else:
            net.groups = {n: rng.randrange(2) for n in names}
        world.note(f"partition {sorted(n for n, g in net.groups.items() if g)}")
    elif r < 0.58:
        net.groups = {}
        world.note("heal partition")
    net.timer(rng.randint(1, 2 * config.chaos_every_ticks), CHAOS, None)


def want_another_ensemble(world: World) -> None:
    """Once the register settled on what was wanted: replace a member by one outside the
    ensemble (the allocator moving a replica), add one, or remove one added before.
    Never below the initial size: a smaller ensemble could not spare a lost disk."""
    record, rng = world.register.read().record, world.change_rng
    current = record.ensemble
    if (world.wanted is not None and world.wanted != current) or not record.settled:
        return  # a change is under way
    if not all(m.voter for m in world.members):
        # One fault at a time, as for disk losses: a member back from a lost disk and not
        # yet voting, and another replaced (dead: removed first, ensemble_step), leave
        # two members one of whom cannot vote until the other leads it. The sim restarts
        # every crashed member, so an order that depends on the dead one coming back would
        # pass here and fail on brokers, where a replaced broker does not come back.
        return
    outside = [m for m in world.pool if m not in current]
    r = rng.random()
    # Down as long as a leader takes to find it silent: as brokers replace a member only
    # after its lease expired, long after.
    since = world.net.now - world.config.quorum.silent_after_ticks
    down = [
        m.name
        for m in world.members
        if m.name in current and not m.up and world.down_since.get(m.name, since + 1) <= since
    ]
    if outside and down and r < 0.3:
        # A crashed member replaced (the allocator's usual move, after its lease expired):
        # kept down a while longer, so that the leader finds it silent and removes it
        # first (ensemble_step). Its pending restart is dropped (a new incarnation).
        out = rng.choice(down)
        node = cast(MemberNode, world.nodes[out])
        node.incarnation += 1
        world.net.timer(rng.randint(40, 120), out, (RESTART, node.incarnation))
        wanted = tuple(sorted((*(m for m in current if m != out), rng.choice(outside))))
    elif outside and r < 0.6:
        out = rng.choice(current)
        wanted = tuple(sorted((*(m for m in current if m != out), rng.choice(outside))))
    elif outside and r < 0.8:
        wanted = tuple(sorted((*current, rng.choice(outside))))
    elif len(current) > len(world.initial):
        out = rng.choice(current)
        wanted = tuple(m for m in current if m != out)
    else:
        return
    world.wanted = wanted
    world.note(f"want ensemble {wanted}")
