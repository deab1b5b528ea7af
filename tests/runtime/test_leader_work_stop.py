"""Stopping leader work when a term ends: bounded by the time before another replica may lead."""

from __future__ import annotations

import asyncio

import pytest

from cozygpu.runtime.controller import stop_leader_work


async def well_behaved() -> None:
    await asyncio.sleep(3600)


async def slow_to_stop(release: asyncio.Event) -> None:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await release.wait()  # cleanup that awaits something slow
        raise


async def test_work_that_stops_at_once_is_awaited_and_no_overrun_is_reported() -> None:
    tasks = [asyncio.create_task(well_behaved(), name="publisher")]
    await asyncio.sleep(0)
    overruns: list[list[str]] = []
    await stop_leader_work(tasks, limit=1.0, on_overrun=overruns.append)
    assert overruns == []
    assert all(task.cancelled() for task in tasks)


async def test_work_still_unwinding_past_the_limit_is_reported_once_and_still_awaited() -> None:
    release = asyncio.Event()
    tasks = [asyncio.create_task(well_behaved(), name="publisher"),
             asyncio.create_task(slow_to_stop(release), name="binder")]
    await asyncio.sleep(0)
    overruns: list[list[str]] = []

    def overrun(names: list[str]) -> None:
        overruns.append(names)
        release.set()  # the owner reacts (stops the process); the work then finishes

    await stop_leader_work(tasks, limit=0.05, on_overrun=overrun)
    assert overruns == [["binder"]]
    assert all(task.done() for task in tasks), "no task outlives its owner"


async def test_a_second_cancellation_still_waits_for_the_work_then_propagates() -> None:
    release = asyncio.Event()
    work = [asyncio.create_task(slow_to_stop(release), name="binder")]
    await asyncio.sleep(0)
    stopper = asyncio.create_task(stop_leader_work(work, limit=60, on_overrun=lambda names: None))
    await asyncio.sleep(0.01)
    stopper.cancel()
    await asyncio.sleep(0.01)
    assert not stopper.done(), "the owner must not return while its work still runs"
    release.set()
    with pytest.raises(asyncio.CancelledError):  # the second cancellation is not swallowed
        await stopper
    assert work[0].done()
