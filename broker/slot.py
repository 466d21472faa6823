"""A one-value hand-off (a replica's pipeline, its spool), and the signal that invalidates a wait
for it.

``Slot.take`` waits for the value under a resolution and gives up when the resolution is
invalidated (``Signal``, or any ``asyncio.Event``). Every append of a busy journal waits in
its pipeline slot for the append before it, so the wait is on the append path: it is one
future, woken by ``put`` (the value handed straight to the longest waiter) or by the signal,
without tasks of its own. (It was ``asyncio.Queue.get`` and ``Event.wait`` as two tasks under
``asyncio.wait``: two tasks, a wait and their cancellations per waiting append, about a tenth
of a small append's event-loop work in a profile of 64 appenders.)
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Final, Generic, TypeVar, cast

T = TypeVar("T")


class SlotInvalidatedError(Exception):
    """The resolution a caller waited under was invalidated before it could take the value."""


class SlotStateError(RuntimeError):
    """A value was put by a non-owner (into a full slot, or while on its way to a waiter): two
    owners at once, a bug."""


class Signal(asyncio.Event):
    """An ``asyncio.Event`` that also calls back, on ``set``, whoever listens: a waiter can be
    woken without a task blocked in ``wait()``. A resolution's ``invalidated`` is one."""

    def __init__(self) -> None:
        super().__init__()
        # Insertion-ordered, and removal is O(1): many appends listen and stop listening.
        self._listeners: dict[int, Callable[[], None]] = {}
        self._next_id = 0

    def listen(self, callback: Callable[[], None]) -> int:
        """Call ``callback`` (once, synchronously) when the signal is set; a handle for
        ``unlisten``. Not called if the signal is already set: check ``is_set`` first."""
        self._next_id += 1
        self._listeners[self._next_id] = callback
        return self._next_id

    def unlisten(self, handle: int) -> None:
        self._listeners.pop(handle, None)

    def set(self) -> None:
        super().set()
        listeners, self._listeners = self._listeners, {}
        for callback in listeners.values():
            callback()


# What an invalidation wakes a waiter with: never a value (values are handed over as such).
_INVALIDATED: Final = object()


class Slot(Generic[T]):
    """A one-value hand-off: ``take`` waits for the value and makes the caller its owner; the
    owner gives it back with ``put``, which hands it to the longest waiter if there is one."""

    __slots__ = ("_full", "_name", "_owned", "_value", "_waiters")

    def __init__(self, name: str, value: T) -> None:
        self._name = name
        self._value: T | None = value
        self._full = True
        # Whether an owner holds the value (took it, or is to hand it over): only then may it
        # be put. Neither in the slot nor owned, it is on its way to a waiter (handed by put,
        # that waiter not yet resumed): a put then is a second owner, a bug.
        self._owned = False
        self._waiters: deque[asyncio.Future[object]] = deque()

    @classmethod
    def empty(cls, name: str) -> Slot[T]:
        """A slot whose value is handed over later, with ``put``."""
        slot: Slot[T] = cls.__new__(cls)
        slot._name = name
        slot._value = None
        slot._full = False
        slot._owned = True  # By whoever hands it over.
        slot._waiters = deque()
        return slot

    @property
    def name(self) -> str:
        return self._name

    def available(self) -> bool:
        return self._full

    def take_nowait(self) -> T | None:
        """The value if it is there now (the caller owns it), else None."""
        if not self._full:
            return None
        value = self._value
        self._value, self._full, self._owned = None, False, True
        return value

    async def take(self, invalidated: asyncio.Event) -> T:
        """Wait for the value; raise SlotInvalidatedError if ``invalidated`` is set first.

        The value is never lost: if it arrives in the same instant as the invalidation, or as
        a cancellation of the caller, it is put back (to the next waiter, or into the slot)
        before this returns or raises.
        """
        if invalidated.is_set():
            raise SlotInvalidatedError(f"{self._name}: resolution invalidated")
        if self._full:
            value = cast(T, self._value)  # A full slot holds a T.
            self._value, self._full, self._owned = None, False, True
            return value
        waiter: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)

        def wake() -> None:
            if not waiter.done():
                waiter.set_result(_INVALIDATED)

        signal = invalidated if isinstance(invalidated, Signal) else None
        watcher: asyncio.Task[bool] | None = None
        if signal is not None:
            handle = signal.listen(wake)
        else:
            # Any other event (a replica's own waits use a fresh one) costs a task.
            watcher = asyncio.ensure_future(invalidated.wait())
            watcher.add_done_callback(lambda _: wake())
        try:
            got = await waiter
        except BaseException:
            # Cancelled: a value handed over meanwhile goes back (to the next waiter).
            self._abandon(waiter)
            raise
        finally:
            if signal is not None:
                signal.unlisten(handle)
            elif watcher is not None:
                watcher.cancel()
        # Nothing awaits from here on: the value, once returned, is the caller's. As Gazette
        # does, an invalidation visible in the same instant wins, so that the caller
        # re-resolves: the value goes back.
        if got is _INVALIDATED or invalidated.is_set():
            self._abandon(waiter)
            raise SlotInvalidatedError(f"{self._name}: resolution invalidated")
        self._owned = True
        return cast(T, got)  # put() hands waiters a T.

    def _abandon(self, waiter: asyncio.Future[object]) -> None:
        """``waiter`` no longer waits: off the queue, and any value it was handed put back."""
        if not waiter.done():
            waiter.cancel()
        elif not waiter.cancelled() and waiter.result() is not _INVALIDATED:
            self._give(cast(T, waiter.result()))  # put() hands waiters a T.
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass  # Already taken off by put().

    def put(self, value: T) -> None:
        """Give the value back (or hand a new one over): to the longest waiter still waiting,
        else into the slot."""
        if not self._owned:
            raise SlotStateError(
                f"{self._name}: put without owning the value (in the slot, or on its way to"
                " a waiter): two owners"
            )
        self._owned = False
        self._give(value)

    def _give(self, value: T) -> None:
        """The value to the longest waiter still waiting (handed: on its way), else into the
        slot."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(value)
                return
        self._value, self._full = value, True
