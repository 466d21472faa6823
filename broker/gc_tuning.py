"""Keep the garbage collector's full collections short in long-running processes.

A broker or consumer process holds a few hundred thousand long-lived objects once started
(imported modules, protobuf descriptors, gRPC and SQLAlchemy machinery). CPython's oldest
generation is collected by walking every tracked object, so each full collection paused the
event loop for ~100 ms under load (seen with bench_limits.py: one pause of 123 ms). Freezing
the heap once start-up is done moves those objects to a permanent generation that collections
skip; objects created later are collected as usual. (The cost: frozen garbage is never freed,
which is nothing for objects that live as long as the process.)

`YoungCollectionHold` defers young collections, within a bound, while a component creates many
objects that live for a while and then die together (see its docstring).
"""

from __future__ import annotations

import gc
import threading


def freeze_startup_heap() -> int:
    """Collect once, then freeze what survived; returns the number of frozen objects. Call when
    a process has finished starting (it may be called again after a later phase)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


YOUNG_COLLECTIONS_DEFER_OBJECTS_MAX = 1 << 18
"""How far all `YoungCollectionHold`s of a process together may raise the collector's first
threshold (net new tracked objects): a young collection then scans at most this many more
objects, and garbage in reference cycles waits at most this many allocations longer."""

_lock = threading.Lock()
_held_objects = 0  # The sum of the holds held.
_base_threshold: int | None = None  # threshold0 before the first hold; None when none is held.
_set_threshold: int | None = None  # What the holds set it to.


class YoungCollectionHold:
    """Defers the garbage collector's young collections while objects that live for a while
    (e.g. a long transaction's messages kept until its ACK) are being created: held, the first
    generation's threshold is raised by `objects` (all holds of the process together by at most
    YOUNG_COLLECTIONS_DEFER_OBJECTS_MAX); released, restored once no hold is held.

    Why: each object a young collection finds alive is scanned again by every older
    generation's collection it reaches. Objects kept for a second and then dropped at once, in
    the tens of thousands, were scanned two or three times each (gc.callbacks measured 11-15 %
    of an exactly-once shard's CPU). Below the raised threshold they die, by reference counts,
    before a collection sees them. Nothing is leaked: cyclic garbage is collected once the
    raised threshold is reached, or at the next collection after the release. A threshold set
    by someone else meanwhile is left as they set it. Not for use across fork()."""

    __slots__ = ("_held", "objects")

    def __init__(self, objects: int) -> None:
        if objects < 0:
            raise ValueError(f"objects: must be >= 0 (got {objects})")
        self.objects = objects
        self._held = False

    @property
    def held(self) -> bool:
        return self._held

    def acquire(self) -> None:
        """Hold (idempotent)."""
        if self._held or not self.objects:
            return
        global _held_objects, _base_threshold, _set_threshold
        with _lock:
            self._held = True
            threshold = gc.get_threshold()
            if _base_threshold is None or threshold[0] != _set_threshold:
                _base_threshold = threshold[0]  # First hold, or changed by someone else.
            _held_objects += self.objects
            _set_threshold = _base_threshold + min(
                _held_objects, YOUNG_COLLECTIONS_DEFER_OBJECTS_MAX
            )
            gc.set_threshold(_set_threshold, *threshold[1:])

    def release(self) -> None:
        """Release (idempotent); the last release restores the threshold."""
        if not self._held:
            return
        global _held_objects, _base_threshold, _set_threshold
        with _lock:
            self._held = False
            _held_objects -= self.objects
            threshold = gc.get_threshold()
            if threshold[0] != _set_threshold or _base_threshold is None:
                if not _held_objects:  # Set by someone else since: theirs stands.
                    _base_threshold = _set_threshold = None
                return
            restored = _base_threshold + min(_held_objects, YOUNG_COLLECTIONS_DEFER_OBJECTS_MAX)
            if not _held_objects:
                _base_threshold = None
            _set_threshold = restored
            gc.set_threshold(restored, *threshold[1:])
