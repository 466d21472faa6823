"""ReadChannel: chunks read from many journals, to one consumer, bounded.

Each source journal's reader task puts an item (ReadCommittedIter puts one undecoded chunk; a
`Batch` holds the envelopes of a decoded one) and waits while the channel holds `size` of them;
the one consuming task takes items without awaiting (`get_nowait`) and awaits only `wait()` for
more. Waiting and taking are separate steps, so a consumer cancelled while it waits loses
nothing. A reader that fails closes the channel with its error, behind the items it put before:
the consumer sees them, then the error, every time.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gazette_consumer.message.message import Envelope

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Batch:
    """The envelopes of one decoded chunk of `journal`, and the offset reading resumes from once
    all of them were consumed."""

    journal: str
    envelopes: list[Envelope[Any]]
    through: int


@dataclass(frozen=True, slots=True)
class _Failure:
    error: BaseException


class ReadChannel(Generic[T]):
    """A bounded queue of items from many readers to one consumer, which a failed reader
    closes with its error. `get_nowait` never loses an item to a cancelled waiter: waiting
    (`wait`) and taking are separate steps."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: deque[T | _Failure] = deque()
        self._ready = asyncio.Event()
        self._space = asyncio.Event()

    async def put(self, item: T) -> None:
        while len(self._items) >= self._size:
            self._space.clear()
            await self._space.wait()
        self._items.append(item)
        self._ready.set()

    def fail(self, error: BaseException) -> None:
        # Beyond the bound, but at most one per reader: a failed reader puts nothing else.
        self._items.append(_Failure(error))
        self._ready.set()

    def get_nowait(self) -> T | None:
        if not self._items:
            self._ready.clear()
            return None
        item = self._items[0]
        if isinstance(item, _Failure):
            raise item.error  # Left in place: every later call fails the same way.
        self._items.popleft()
        self._space.set()
        return item

    async def wait(self) -> None:
        await self._ready.wait()

    def wake(self) -> None:
        """Wake the consumer, to see that something other than the channel changed."""
        self._ready.set()
