"""The watchdog that ends the process when leader work outlives its term: a thread, not a task."""

from __future__ import annotations

import threading
import time

import pytest

from cozygpu.runtime.process import HARD_EXIT_CODE, Watchdog


class Exit:
    """Stands in for ``os._exit``: records the code instead of ending the test run."""

    def __init__(self) -> None:
        self.codes: list[int] = []
        self.called = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.called.set()


def test_a_deadline_that_passes_ends_the_process_even_while_the_caller_blocks() -> None:
    exit = Exit()
    watchdog = Watchdog(exit=exit)
    watchdog.arm(0.05, "leader work outlived the lease")
    time.sleep(0.2)  # the caller blocks (as a wedged event loop would): the thread fires all the same
    assert exit.called.wait(timeout=30)
    assert exit.codes == [HARD_EXIT_CODE]
    assert watchdog.fired == "leader work outlived the lease"
    watchdog.close()


class FakeTime:
    """A monotonic clock that moves only when told (the watchdog is nudged to read it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("disarmed", [True, False], ids=["disarmed", "still-armed"])
def test_a_disarmed_watchdog_never_fires_once_its_deadline_has_passed(disarmed: bool) -> None:
    # On a fake clock the deadline passes for certain; the still-armed case shows the same steps fire.
    exit, clock = Exit(), FakeTime()
    watchdog = Watchdog(exit=exit, monotonic=clock)
    watchdog.arm(3600, "term")
    if disarmed:
        watchdog.disarm()
    clock.now += 7200
    watchdog.nudge()  # returns once the thread has read the clock after the move (or fired)
    watchdog.close()
    assert exit.codes == ([] if disarmed else [HARD_EXIT_CODE])
    assert watchdog.fired == (None if disarmed else "term")


def test_a_deadline_moved_later_by_arm_does_not_fire_at_the_earlier_one() -> None:
    exit, clock = Exit(), FakeTime()
    watchdog = Watchdog(exit=exit, monotonic=clock)
    watchdog.arm(10, "first")
    watchdog.arm(100, "renewed")
    clock.now += 50
    watchdog.nudge()
    assert watchdog.fired is None
    clock.now += 60
    watchdog.nudge()
    assert exit.called.wait(timeout=30)
    assert watchdog.fired == "renewed"
    watchdog.close()


def test_expire_replaces_a_later_deadline_and_ends_the_process_now() -> None:
    exit = Exit()
    watchdog = Watchdog(exit=exit)
    watchdog.arm(3600, "the lease's end")
    watchdog.expire("leader work overran its term: binder")
    assert exit.called.wait(timeout=30)
    assert watchdog.fired == "leader work overran its term: binder"
    watchdog.close()


def test_a_watchdog_never_armed_starts_no_thread() -> None:
    before = threading.active_count()
    watchdog = Watchdog(exit=Exit())
    assert threading.active_count() == before
    watchdog.close()
