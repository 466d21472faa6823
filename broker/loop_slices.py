"""CPU work on the event loop, in slices: a request that walks many items (journals to list,
changes to validate) yields to the loop whenever it has run for a while, so that other requests
are served meanwhile. A broker's one event loop serves every RPC; an uninterrupted step of
seconds would stall them all (docs/limits.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

# The longest a request works on the event loop before it yields.
loop_hold_s_max: Final = 0.002


class LoopSlices:
    """Call `await next_item()` between items of a long walk: it yields to the event loop
    once `hold_s_max` has passed since the last yield (or the walk began)."""

    def __init__(
        self, hold_s_max: float = loop_hold_s_max, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._hold_s_max = hold_s_max
        self._clock = clock
        self._since = clock()
        self.yields = 0

    async def next_item(self) -> None:
        if self._clock() - self._since >= self._hold_s_max:
            await asyncio.sleep(0)
            self.yields += 1
            self._since = self._clock()
