"""A GPUClass or GPUNode report is written at most once per ``report_every``; the last state still lands.

Under a stream of orders a report per order doubled the binder's writes.
Here the class's first report goes out at once, the next one within the
interval is held back, and the report pass the reminder asks for writes it.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from cozygpu import keys
from cozygpu.kube import Client, resource_path
from cozygpu.views import specs
from tests.binder.world import World, running_binder, seen_by

EVERY = 5.0


async def class_held(admin: Client, world: World) -> Any:
    found = await admin.get(resource_path(keys.GROUP, keys.VERSION, keys.GPUCLASS_PLURAL, name=world.gpu_class))
    return (found.get("status") or {}).get("held")


async def test_a_report_within_the_interval_is_held_back_and_the_reminder_writes_it(
        admin: Client, world: World) -> None:
    async with running_binder(admin, report_every=timedelta(seconds=EVERY)) as binder:
        reminded = asyncio.Event()
        binder.binder.reports.queue.on_ready(reminded.set)
        await world.node("n-a", 4)
        await seen_by(binder, specs.GPU_DEVICES.key, await world.order("one", 1))
        await binder.each_lane()  # binds it; the class's first report (after the placement) goes out at once
        assert (await world.device("one"))["status"]["phase"] == "Bound"
        assert await class_held(admin, world) == 1

        await seen_by(binder, specs.GPU_DEVICES.key, await world.order("two", 1))
        await binder.each_lane()  # binds the second: a new report, within the interval
        assert (await world.device("two"))["status"]["phase"] == "Bound"
        assert await class_held(admin, world) == 1, "a second report within the interval was written"
        assert not reminded.is_set()

        async with asyncio.timeout(EVERY * 3):
            await reminded.wait()
        await binder.each_lane()
        assert await class_held(admin, world) == 2, "the held-back report never landed"

