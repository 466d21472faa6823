"""The simulated network and clock: one event queue of message deliveries and timers.

Time is an integer tick count; events at the same tick run in the order they were scheduled.
A message is dropped when its endpoints are on different sides of a partition (only nodes given
a partition group can be cut off) or at random (`drop_p`); otherwise it arrives after a random
delay of 1..`delay_max` ticks, so messages overtake one another; with `dup_p` it arrives twice.
All randomness comes from the one seeded generator, so a seed replays exactly.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

DELIVER = 0
TIMER = 1


@dataclass(slots=True)
class NetStats:
    sent: int = 0
    dropped: int = 0
    duplicated: int = 0


class Network:
    def __init__(self, rng: random.Random, delay_max: int, drop_p: float, dup_p: float) -> None:
        self.rng = rng
        self.now = 0
        self.delay_max = delay_max
        self.drop_p = drop_p
        self.dup_p = dup_p
        # Partition group of each partitionable node; nodes in different groups are cut off.
        self.groups: dict[str, int] = {}
        self.stats = NetStats()
        self._heap: list[tuple[int, int, int, str, object]] = []
        self._seq = 0

    def cut_off(self, src: str, dst: str) -> bool:
        groups = self.groups
        return src in groups and dst in groups and groups[src] != groups[dst]

    def send(self, src: str, dst: str, msg: object) -> None:
        stats, rng = self.stats, self.rng
        stats.sent += 1
        if self.cut_off(src, dst) or (self.drop_p and rng.random() < self.drop_p):
            stats.dropped += 1
            return
        self._push(self.now + rng.randint(1, self.delay_max), DELIVER, dst, (src, msg))
        if self.dup_p and rng.random() < self.dup_p:
            stats.duplicated += 1
            self._push(self.now + rng.randint(1, self.delay_max), DELIVER, dst, (src, msg))

    def timer(self, delay: int, node: str, payload: object) -> None:
        self._push(self.now + delay, TIMER, node, payload)

    def pop(self) -> tuple[int, int, int, str, object] | None:
        if not self._heap:
            return None
        event = heapq.heappop(self._heap)
        self.now = event[0]
        return event

    def _push(self, time: int, kind: int, node: str, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, kind, node, payload))
