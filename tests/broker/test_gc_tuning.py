"""freeze_startup_heap moves what exists at start-up out of the collector's generations."""

from __future__ import annotations

import gc

from broker.gc_tuning import freeze_startup_heap


def test_objects_alive_at_freeze_are_frozen_and_later_ones_are_not() -> None:
    before = [object() for _ in range(1000)]  # Untracked themselves; the list is tracked.
    try:
        frozen = freeze_startup_heap()
        assert frozen > 0
        assert gc.get_freeze_count() == frozen
        # The list made before is frozen: no generation holds it any more.
        assert not any(obj is before for obj in gc.get_objects())
        later: list[object] = [before]
        assert any(obj is later for obj in gc.get_objects())
    finally:
        gc.unfreeze()
