"""The loop-lag ticker observes how much later than asked it woke, on the injected clock."""

from __future__ import annotations

import asyncio
import os

from prometheus_client import CollectorRegistry

from cozygpu.base.clock import FakeClock
from cozygpu.runtime.looplag import LoopLag
from tests.support.clock import settle


def observed(registry: CollectorRegistry) -> tuple[float, float]:
    count = registry.get_sample_value("cozygpu_event_loop_lag_seconds_count")
    total = registry.get_sample_value("cozygpu_event_loop_lag_seconds_sum")
    assert count is not None
    assert total is not None
    return count, total


async def test_a_loop_that_keeps_up_shows_no_lag_and_a_stall_shows_as_its_length() -> None:
    clock, registry = FakeClock(), CollectorRegistry()
    ticker = asyncio.create_task(LoopLag(registry, interval=0.1, clock=clock).run())
    try:
        await clock.run_for(1.0)  # every wake-up on time
        count, total = observed(registry)
        assert count == 10
        assert total == 0.0
        await settle()
        clock.advance(0.6)  # the loop held for 0.6 s: the ticker asked for 0.1
        await settle()
        count, total = observed(registry)
        assert count == 11
        assert abs(total - 0.5) < 1e-9
        assert registry.get_sample_value("cozygpu_event_loop_lag_seconds_bucket", {"le": "0.25"}) == 10
    finally:
        ticker.cancel()


async def test_the_time_spent_waiting_for_a_cpu_is_told_apart_from_the_loops_own_lateness() -> None:
    clock, registry = FakeClock(), CollectorRegistry()
    ran, waited = [100.0], [5.0]  # times before the ticker started are nobody's lateness
    ticker = asyncio.create_task(LoopLag(registry, interval=0.1, clock=clock,
                                         times=lambda: (ran[0], waited[0])).run())

    def seconds(name: str) -> float:
        value = registry.get_sample_value(f"cozygpu_event_loop_{name}_seconds_sum")
        assert value is not None
        return round(value, 9)

    try:
        await settle()
        clock.advance(0.05)
        waited[0] += 0.04  # the thread waited early in the interval, the tick still on time: no lateness
        await clock.run_for(0.05)
        assert (seconds("lag"), seconds("cpu_wait"), seconds("busy_lag")) == (0.0, 0.0, 0.0)
        # Late by 0.5 s, of which the thread waited 0.3 s for a CPU: the loop itself held it 0.2 s.
        clock.advance(0.099)
        await settle()  # the wait read just before the tick is due
        waited[0] += 0.3
        ran[0] += 0.25
        clock.advance(0.501)
        await settle()
        assert (seconds("lag"), seconds("cpu_wait"), seconds("busy_lag")) == (0.5, 0.3, 0.2)
        # A stall from before the wait was read: the loop's own share is at most what the thread ran.
        waited[0] += 0.2
        ran[0] += 0.1
        clock.advance(0.6)
        await settle()
        assert (seconds("lag"), seconds("cpu_wait"), seconds("busy_lag")) == (1.0, 0.3, 0.3)
        # The thread ran the whole stall: all of it is the loop's own.
        ran[0] += 0.6
        clock.advance(0.6)
        await settle()
        assert (seconds("lag"), seconds("cpu_wait"), seconds("busy_lag")) == (1.5, 0.3, 0.8)
    finally:
        ticker.cancel()


def test_the_reader_gives_this_threads_times_in_seconds() -> None:
    import threading

    from cozygpu.runtime.looplag import thread_times

    task = f"/proc/self/task/{threading.get_native_id()}/schedstat"

    def field(index: int) -> float:
        with open(task) as stats:
            return int(stats.read().split()[index]) / 1e9

    with thread_times() as times:
        if times is None:  # only where the kernel keeps scheduler statistics (Linux)
            assert not os.path.exists(task)
            return
        before, told, after = (field(0), field(1)), times(), (field(0), field(1))
    assert before[0] <= told[0] <= after[0], "the time on a CPU (the first field), in seconds, of the calling thread"
    assert before[1] <= told[1] <= after[1], "the wait (the second field), in seconds, of the calling thread"
