"""Stopping leader work when a term ends: bounded by the time before another replica may lead."""

from __future__ import annotations

import asyncio

import pytest

from cozygpu.base.clock import FakeClock, settle
from cozygpu.runtime.controller import stop_leader_work


async def well_behaved() -> None:
    await asyncio.Event().wait()


async def slow_to_stop(release: asyncio.Event) -> None:
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        await release.wait()  # cleanup that awaits something slow
        raise


async def test_work_that_stops_at_once_is_awaited_and_no_overrun_is_reported() -> None:
    clock = FakeClock()
    tasks = [asyncio.create_task(well_behaved(), name="publisher")]
    await settle()
    overruns: list[list[str]] = []
    await stop_leader_work(tasks, limit=1.0, on_overrun=overruns.append, clock=clock)
    assert all(task.cancelled() for task in tasks)
    clock.advance(10)
    assert overruns == [], "the overrun timer was left behind"
    assert clock.sleeping == 0


async def test_work_still_unwinding_past_the_limit_is_reported_once_and_still_awaited() -> None:
    clock = FakeClock()
    release = asyncio.Event()
    tasks = [asyncio.create_task(well_behaved(), name="publisher"),
             asyncio.create_task(slow_to_stop(release), name="binder")]
    await settle()
    overruns: list[list[str]] = []
    stopper = asyncio.create_task(stop_leader_work(tasks, limit=5, on_overrun=overruns.append, clock=clock))
    await clock.run_for(4.9)
    assert overruns == []
    await clock.run_for(0.1)
    assert overruns == [["binder"]]
    await clock.run_for(60)
    assert overruns == [["binder"]], "reported once"
    assert not stopper.done(), "the owner must not return while its work still runs"
    release.set()  # the owner reacts (ends the process); here the work finishes instead
    await stopper
    assert all(task.done() for task in tasks), "no task outlives its owner"


async def test_a_second_cancellation_still_waits_for_the_work_then_propagates() -> None:
    clock = FakeClock()
    release = asyncio.Event()
    work = [asyncio.create_task(slow_to_stop(release), name="binder")]
    await settle()
    stopper = asyncio.create_task(stop_leader_work(work, limit=60, on_overrun=lambda names: None, clock=clock))
    await settle()
    stopper.cancel()
    await settle()
    assert not stopper.done(), "the owner must not return while its work still runs"
    release.set()
    with pytest.raises(asyncio.CancelledError):  # the second cancellation is not swallowed
        await stopper
    assert work[0].done()
