"""Backoff grows with jitter up to a cap and starts over after a quiet period."""

from __future__ import annotations

import asyncio

import pytest

from cozygpu.cache.timing import Backoff
from tests.cache.fakes import FakeClock


def test_backoff_doubles_up_to_its_cap_without_jitter() -> None:
    clock = FakeClock()
    backoff = Backoff(clock, initial=0.8, cap=30.0, jitter=0.0)
    assert [backoff.next_delay() for _ in range(8)] == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]


def test_jitter_adds_at_most_the_delay_again() -> None:
    clock = FakeClock()
    assert Backoff(clock, initial=1.0, rng=lambda: 0.0).next_delay() == 1.0
    assert Backoff(clock, initial=1.0, rng=lambda: 0.999).next_delay() == pytest.approx(1.999)
    assert Backoff(clock, initial=1.0, jitter=0.5, rng=lambda: 1.0).next_delay() == 1.5


def test_backoff_starts_over_after_a_quiet_period() -> None:
    clock = FakeClock()
    backoff = Backoff(clock, initial=1.0, jitter=0.0, reset_after=120.0)
    assert [backoff.next_delay() for _ in range(3)] == [1.0, 2.0, 4.0]
    clock.advance(119.0)
    assert backoff.next_delay() == 8.0
    clock.advance(120.0)
    assert backoff.next_delay() == 1.0


async def test_waiting_sleeps_on_the_given_clock() -> None:
    clock = FakeClock()
    backoff = Backoff(clock, initial=2.0, jitter=0.0)
    task = asyncio.create_task(backoff.wait())
    await asyncio.sleep(0)
    assert clock.sleeps == [2.0]
    assert not task.done()
    clock.advance(2.0)
    assert await task == 2.0


def test_nonsense_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="initial"):
        Backoff(FakeClock(), initial=0)
    with pytest.raises(ValueError, match="cap"):
        Backoff(FakeClock(), initial=5, cap=1)
