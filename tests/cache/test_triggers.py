"""Triggers coalesce many events into one wake-up without losing any."""

from __future__ import annotations

import asyncio

from cozygpu.cache.triggers import Trigger
from tests.cache.fakes import until
from tests.support.clock import settle


async def test_many_fires_before_a_wait_make_one_wake_up_with_every_reason() -> None:
    trigger = Trigger("binder")
    for i in range(10_000):
        trigger.fire("pods" if i % 2 else "gpudevices")
    assert await trigger.wait() == {"pods", "gpudevices"}
    assert trigger.poll() is None
    assert trigger.woken == 1


async def test_a_wait_blocks_until_the_next_fire() -> None:
    trigger = Trigger()
    waiter = asyncio.create_task(trigger.wait())
    await settle()  # long enough for a wrong early return to show
    assert not waiter.done()
    trigger.fire("nodes")
    assert await waiter == {"nodes"}


async def test_a_fire_while_the_consumer_works_makes_the_next_wait_return_at_once() -> None:
    trigger = Trigger()
    passes: list[frozenset[str]] = []

    async def consumer() -> None:
        while len(passes) < 2:
            reasons = await trigger.wait()
            passes.append(reasons)
            if len(passes) == 1:
                trigger.fire("during-the-pass")  # an event that lands while the pass runs
                await asyncio.sleep(0)

    trigger.fire("first")
    task = asyncio.create_task(consumer())
    await until(lambda: len(passes) == 2)
    await task
    assert passes == [frozenset({"first"}), frozenset({"during-the-pass"})]


async def test_a_fire_without_a_reason_still_wakes() -> None:
    trigger = Trigger()
    trigger.fire()
    assert trigger.is_set()
    assert await trigger.wait() == frozenset()
