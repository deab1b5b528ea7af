"""The collector's pauses are timed per generation from its own callbacks, only while installed; what
survives a full collection is frozen."""

from __future__ import annotations

import gc

from prometheus_client import CollectorRegistry

from cozygpu.runtime.gcpauses import GcPauses


def test_a_full_collection_is_timed_under_generation_2_while_installed() -> None:
    registry = CollectorRegistry()
    ticks = iter(float(i) for i in range(0, 1000, 3))  # each read of the clock 3 s after the last
    pauses = GcPauses(registry, now=lambda: next(ticks), freeze=lambda: None)
    with pauses.installed():
        gc.collect(2)
    assert registry.get_sample_value("cozygpu_gc_pause_seconds_count", {"generation": "2"}) == 1
    assert registry.get_sample_value("cozygpu_gc_pause_seconds_sum", {"generation": "2"}) == 3.0
    assert pauses._callback not in gc.callbacks, "removed on the way out"
    gc.collect(2)
    assert registry.get_sample_value("cozygpu_gc_pause_seconds_count", {"generation": "2"}) == 1


def test_the_callback_is_removed_when_the_body_raises() -> None:
    pauses = GcPauses(CollectorRegistry())
    try:
        with pauses.installed():
            raise RuntimeError("the owner failed")
    except RuntimeError:
        pass
    assert pauses._callback not in gc.callbacks


def test_what_survives_a_full_collection_is_frozen_and_a_younger_one_freezes_nothing() -> None:
    froze: list[int] = []
    pauses = GcPauses(CollectorRegistry(), freeze=lambda: froze.append(1))
    with pauses.installed():
        gc.collect(0)
        gc.collect(1)
        assert froze == [], "only a full collection freezes"
        gc.collect(2)
    assert froze == [1]


def test_the_real_freeze_moves_the_survivors_out_of_the_collectors_sight() -> None:
    registry = CollectorRegistry()
    try:
        with GcPauses(registry).installed():
            gc.collect(2)
        assert gc.get_freeze_count() > 0
        assert registry.get_sample_value("cozygpu_gc_frozen_objects") == gc.get_freeze_count()
    finally:
        gc.unfreeze()  # the rest of the test run's heap is walked as before
