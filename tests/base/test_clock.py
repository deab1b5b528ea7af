"""The fake clock: sleeps and deadlines fire as the test moves time, never on their own."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from cozygpu.base.clock import START, FakeClock, LoopClock, settle
from cozygpu.base.deadline import deadline


async def test_a_sleep_ends_when_time_is_moved_past_it() -> None:
    clock = FakeClock()
    sleeper = asyncio.create_task(clock.sleep(5.0))
    await settle()
    clock.advance(4.9)
    await settle()
    assert not sleeper.done()
    clock.advance(0.1)
    await settle()
    assert sleeper.done()


async def test_wall_time_moves_with_the_monotonic_time() -> None:
    clock = FakeClock(start=100.0)
    clock.advance(90.0)
    assert clock.wall() == START + dt.timedelta(seconds=90)


async def test_a_deadline_cuts_the_block_off_when_its_time_passes() -> None:
    clock = FakeClock()

    async def wait_forever() -> None:
        async with deadline(clock, 3.0):
            await asyncio.Future()

    waiter = asyncio.create_task(wait_forever())
    await clock.run_for(3.0)
    with pytest.raises(TimeoutError):
        await waiter


async def test_the_real_clock_tells_utc() -> None:
    assert LoopClock().wall().utcoffset() == dt.timedelta(0)
