"""The loop-lag ticker observes how much later than asked it woke, on the injected clock."""

from __future__ import annotations

import asyncio

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
