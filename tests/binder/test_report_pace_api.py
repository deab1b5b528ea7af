"""A GPUClass or GPUNode report is written at most once per ``report_every``; the last state still lands.

Under a stream of orders a report per order doubled the binder's writes.
Here the class's first report goes out at once, the next one within the
interval is held back, and the report pass the reminder asks for writes it.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from cozygpu import keys
from cozygpu.binder import reconciler
from cozygpu.kube import Client, resource_path
from cozygpu.views import specs
from tests.binder.world import GPUNODES, World, running_binder, seen_by

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


async def test_a_report_pass_cut_at_its_slice_is_run_again_until_every_report_is_written(
        admin: Client, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that judges keys past its slice leaves the rest for the next (``Progress.MORE``), as under a
    loaded machine: the harness runs the lane again, as the driver does, so one ``each_lane`` writes them all."""
    monkeypatch.setattr(reconciler, "SLICE", 0.0)  # every pass judges one key and leaves the rest
    async with running_binder(admin) as binder:
        names = [await world.node(short, 4) for short in ("n-a", "n-b", "n-c")]
        await seen_by(binder, specs.GPU_DEVICES.key, await world.order("one", 1))
        await binder.each_lane()
        assert await class_held(admin, world) == 1
        for name in names:
            report = await admin.get(f"{GPUNODES}/{name}")
            assert (report.get("status") or {}).get("conditions"), f"{name}'s report was not judged"
