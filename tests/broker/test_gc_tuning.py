"""freeze_startup_heap moves what exists at start-up out of the collector's generations;
YoungCollectionHold defers young collections within its bound and restores the threshold."""

from __future__ import annotations

import gc

import pytest

from broker.gc_tuning import (
    YOUNG_COLLECTIONS_DEFER_OBJECTS_MAX,
    YoungCollectionHold,
    freeze_startup_heap,
)


def test_objects_alive_at_freeze_are_frozen_and_later_ones_are_not() -> None:
    before = [object() for _ in range(1000)]  # Untracked themselves; the list is tracked.
    try:
        frozen = freeze_startup_heap()
        assert frozen > 0
        # Frozen objects may still be freed (another thread of the suite dropping one), so the
        # count can only have fallen since (CI once saw one fewer).
        assert 0 < gc.get_freeze_count() <= frozen
        # The list made before is frozen: no generation holds it any more.
        assert not any(obj is before for obj in gc.get_objects())
        later: list[object] = [before]
        assert any(obj is later for obj in gc.get_objects())
    finally:
        gc.unfreeze()


def test_young_collection_holds_raise_the_threshold_within_the_bound_and_restore_it() -> None:
    base = gc.get_threshold()
    one, two = YoungCollectionHold(1000), YoungCollectionHold(YOUNG_COLLECTIONS_DEFER_OBJECTS_MAX)
    try:
        one.acquire()
        one.acquire()  # Idempotent.
        assert gc.get_threshold() == (base[0] + 1000, *base[1:])
        two.acquire()  # Together: bounded.
        assert gc.get_threshold()[0] == base[0] + YOUNG_COLLECTIONS_DEFER_OBJECTS_MAX
        one.release()
        assert gc.get_threshold()[0] == base[0] + YOUNG_COLLECTIONS_DEFER_OBJECTS_MAX
        two.release()
        two.release()  # Idempotent.
        assert gc.get_threshold() == base
        assert not one.held and not two.held
    finally:
        one.release()
        two.release()
        gc.set_threshold(*base)


def test_a_threshold_set_by_someone_else_while_held_stands() -> None:
    base = gc.get_threshold()
    hold = YoungCollectionHold(500)
    try:
        hold.acquire()
        gc.set_threshold(1234, *base[1:])
        hold.release()
        assert gc.get_threshold()[0] == 1234
        hold.acquire()  # From what stands now.
        assert gc.get_threshold()[0] == 1234 + 500
        hold.release()
        assert gc.get_threshold()[0] == 1234
    finally:
        hold.release()
        gc.set_threshold(*base)


def test_a_hold_defers_young_collections_of_objects_that_die_together() -> None:
    base = gc.get_threshold()
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    kept_count = 20_000  # Tracked objects alive at once: far above the default threshold.
    gc.collect()
    gc.callbacks.append(count)
    hold = YoungCollectionHold(2 * kept_count)
    try:
        for held in (False, True):
            collections.clear()
            if held:
                hold.acquire()
            kept = [[i] for i in range(kept_count)]  # Tracked, alive until dropped.
            del kept
            hold.release()
            assert (len(collections) == 0) == held, collections
    finally:
        gc.callbacks.remove(count)
        hold.release()
        gc.set_threshold(*base)


def test_a_hold_of_nothing_changes_nothing() -> None:
    base = gc.get_threshold()
    hold = YoungCollectionHold(0)
    hold.acquire()
    assert not hold.held and gc.get_threshold() == base
    with pytest.raises(ValueError, match="objects"):
        YoungCollectionHold(-1)
