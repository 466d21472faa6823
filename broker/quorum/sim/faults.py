"""The simulation's faults, the steps that the chaos (chaos.py) and the scenarios of two
faults (double_faults.py) are made of: a node crashed, a member's disk wiped with it now and
then, and restarted after a while; whether a disk may be lost now (one fault at a time); and
the end of the faults, everything healed and restarted (the LIVENESS phase, world.py).

Functions over the `World` (world.py), whose state they change: the counts a `SimResult`
reports are the world's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.quorum.sim.nodes import RESTART, CoordinatorNode, MemberNode

if TYPE_CHECKING:
    from broker.quorum.sim.world import World


def crash(world: World, name: str, wipe: bool = False, down_ticks_max: int = 0) -> None:
    """Crash `name` if it is a member or coordinator that is up, wiping a member's disk if
    `wipe`; it restarts within `down_ticks_max` ticks (0: the config's `down_ticks_max`)."""
    node = world.nodes[name]
    if not isinstance(node, (MemberNode, CoordinatorNode)) or not node.up:
        return
    if isinstance(node, MemberNode):
        node.crash(wipe)
        world.down_since[name] = world.net.now
        if wipe:
            world.logs[name] = node.log
            world.checker.on_disk_lost(name)
            world.wiped.add(name)
            world.disk_losses += 1
    else:
        node.crash()
    world.crashes += 1
    world.note(f"crash {name}" + (" and wipe its disk" if wipe else ""))
    world.net.timer(
        world.net.rng.randint(1, down_ticks_max or world.config.down_ticks_max),
        name,
        (RESTART, node.incarnation),
    )


def may_lose_a_disk(world: World) -> bool:
    """Never below the initial size, nor while a member wanted out is down or doubtful
    to the leader (it may be removed first, ensemble_step): an ensemble of two cannot
    spare a lost disk, and neither could the three it replaces with one member gone (the
    sim brings every member back, which a removed one no longer helps). One fault at a
    time, as for disk losses everywhere in the sim."""
    current = world.ensemble
    if len(current) < len(world.initial):
        return False
    wanted = world.wanted
    if wanted is None:
        return True
    leaving = {m for m in current if m not in wanted}
    doubtful = world.doubtful() or frozenset()
    return not leaving & doubtful and all(m.up for m in world.members if m.name in leaving)


def heal_all(world: World) -> None:
    net = world.net
    world.live_from = net.now
    net.groups = {}
    net.drop_p = 0.0
    net.dup_p = 0.0
    net.late_p = 0.0
    for node in world.startable:
        if not node.up:
            node.start()
    world.note("faults stop: healed, every node up")
