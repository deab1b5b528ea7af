"""Backoff grows with jitter up to a cap and starts over after a quiet period or a success."""

from __future__ import annotations

from cozygpu.base.backoff import Backoff
from cozygpu.base.clock import FakeClock


def test_backoff_doubles_up_to_its_cap_without_jitter() -> None:
    backoff = Backoff(FakeClock(), initial=0.5, cap=3.0, jitter=0.0)
    assert [backoff.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_a_success_starts_the_next_failure_over_from_the_first_delay() -> None:
    backoff = Backoff(FakeClock(), initial=1.0, jitter=0.0)
    assert [backoff.next_delay() for _ in range(3)] == [1.0, 2.0, 4.0]
    backoff.reset()
    assert backoff.next_delay() == 1.0


def test_a_quiet_period_starts_over_too() -> None:
    clock = FakeClock()
    backoff = Backoff(clock, initial=1.0, jitter=0.0, reset_after=10.0)
    assert [backoff.next_delay() for _ in range(2)] == [1.0, 2.0]
    clock.advance(10.0)
    assert backoff.next_delay() == 1.0
