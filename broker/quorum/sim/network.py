"""The simulated network and clock: one event queue of message deliveries and timers.

Time is an integer tick count; events at the same tick run in the order they were scheduled.
A message is dropped when its endpoints are on different sides of a partition (only nodes given
a partition group can be cut off) or at random (`drop_p`); otherwise it arrives after a random
delay of 1..`delay_max` ticks, so messages overtake one another; with `dup_p` it arrives twice.
With `late_p` a copy also arrives much later (up to `late_ticks_max`), and when a node restarts
(`replay_to`) some of the last `history_max` messages of each type sent to it arrive again
(of each type: so that a term's first messages are among them, not only its heartbeats): messages
re-delivered after their receiver crashed and restarted, as a retrying proxy or a queue in a
shell could (what a member back from a lost disk must not trust). All randomness comes from seeded generators,
so a seed replays exactly; the late copies draw from their own (`late_rng`), so a seed without
them takes the same course as before they existed.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass

DELIVER = 0
TIMER = 1


@dataclass(slots=True)
class NetStats:
    sent: int = 0
    dropped: int = 0
    duplicated: int = 0
    late: int = 0


class Network:
    def __init__(
        self,
        rng: random.Random,
        delay_max: int,
        drop_p: float,
        dup_p: float,
        late_rng: random.Random | None = None,
        late_p: float = 0.0,
        late_ticks_max: int = 0,
    ) -> None:
        self.rng = rng
        self.late_rng = late_rng or random.Random(0)
        self.late_p = late_p
        self.late_ticks_max = late_ticks_max
        # The last messages of each type sent to each node (kept only with late_p): what
        # replay_to re-sends.
        self.history_max = 2
        self.history: dict[str, dict[str, deque[tuple[str, object]]]] = {}
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
        late = self.late_rng
        if self.late_p:
            kinds = self.history.setdefault(dst, {})
            kind = type(msg).__name__
            kinds.setdefault(kind, deque(maxlen=self.history_max)).append((src, msg))
        if self.late_p and late.random() < self.late_p:
            stats.late += 1
            delay = late.randint(self.delay_max, max(self.delay_max, self.late_ticks_max))
            self._push(self.now + delay, DELIVER, dst, (src, msg))

    def replay_to(self, dst: str) -> None:
        """`dst` restarted: each of the last messages sent to it arrives again, at random,
        soon (within two deliveries: before what its senders send it next, now and then)."""
        late = self.late_rng
        if not self.late_p:
            return
        kinds = self.history.get(dst, {})
        for src, msg in [sent for kind in sorted(kinds) for sent in kinds[kind]]:
            if late.random() < 0.5:
                self.stats.late += 1
                delay = late.randint(1, 2 * self.delay_max + 2)  # before the sender's retry
                self._push(self.now + delay, DELIVER, dst, (src, msg))

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
