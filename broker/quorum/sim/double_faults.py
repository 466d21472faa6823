"""Scenarios of two faults at once, which the chaos's single faults (chaos.py) reach too
rarely: a member fenced into a newer term losing its disk beside the deposed leader, the two
cut off from the rest; and a member losing its disk just as a remove-first ensemble change
reaches the term register. Each draws from a generator of its own (`World.deposed_rng`,
`World.double_rng`): a seed that never takes the path keeps the course it took before the
path existed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.quorum.sim.faults import crash, may_lose_a_disk

if TYPE_CHECKING:
    from broker.quorum.sim.world import World


def wipe_beside_a_deposed_leader(world: World) -> bool:
    """If a member still leads a term older than the register's, wipe the disk of a
    member fenced into the register's term and leave the two alone together (the rest
    on the other side of a partition): a fence the wiped member forgets would let the
    deposed leader commit with it. One lost disk at a time, as elsewhere."""
    term = world.register.read().record.term
    deposed = [
        m
        for m in world.members
        if m.member is not None and m.member.leader is not None and m.member.term < term
    ]
    fenced = [
        m
        for m in world.members
        if m.member is not None and m.member.leader is None and m.member.term == term
    ]
    if not deposed or not fenced or not all(m.voter for m in world.members):
        return False
    if not may_lose_a_disk(world):
        return False
    leader, victim = deposed[0], world.deposed_rng.choice(fenced)
    crash(world, victim.name, wipe=True, down_ticks_max=8)  # back while the leader leads
    world.deposed_wipes += 1
    names = (*world.pool, *world.coordinator_names, world.register_name)
    world.net.groups = {n: int(n in (leader.name, victim.name)) for n in names}
    world.note(f"partition {sorted((leader.name, victim.name))} (a deposed leader)")
    return True


def wipe_after_remove_first(world: World, ensemble: tuple[str, ...]) -> None:
    """Now and then, as a remove-first step ({A,B,C} -> {A,B}) reaches the register, wipe
    the disk of a member that remains: what happens on brokers when the leader decided
    the step before it knew (B had just crashed, or the claim reached the register long
    after it was decided). {A,B} then has one voter, and must go back to {A,B,C}
    (Rules.next_ensemble, blocked) to elect. A second fault on purpose, unlike the
    chaos's other disk losses: still one lost disk at a time, and the removed member
    comes back (else nothing could elect)."""
    if world.live_from >= 0 or not world.removed_then_lost_p:
        return
    if world.double_rng.random() >= world.removed_then_lost_p:
        return
    up = [m.name for m in world.members if m.name in ensemble and m.up]
    if not up or not all(m.voter for m in world.members):
        return
    crash(world, world.double_rng.choice(up), wipe=True, down_ticks_max=8)
    world.removed_then_lost += 1
