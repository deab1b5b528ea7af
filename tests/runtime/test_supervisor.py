"""Ordered start and reverse stop of the process's stages."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from cozygpu.runtime.process import Stage, StageRun, Supervisor


class Journal:
    def __init__(self) -> None:
        self.entries: list[str] = []

    def stage(self, name: str, *, fail_on_start: bool = False, fail_after_start: bool = False,
              never_ready: bool = False, slow_cleanup: float = 0.0, end_on_its_own: bool = False) -> Stage:
        async def run(ready: Callable[[], None]) -> None:
            self.entries.append(f"start {name}")
            try:
                if fail_on_start:
                    raise RuntimeError(f"{name} could not start")
                if never_ready:
                    await asyncio.Event().wait()
                ready()
                if fail_after_start:
                    await asyncio.sleep(0.05)
                    raise RuntimeError(f"{name} broke")
                if end_on_its_own:
                    return
                await asyncio.Event().wait()
            finally:
                if slow_cleanup:
                    await asyncio.sleep(slow_cleanup)
                self.entries.append(f"stop {name}")

        body: StageRun = run
        return Stage(name, body)


async def until(condition: Callable[[], bool], task: asyncio.Task[bool] | None = None) -> None:
    async with asyncio.timeout(5):
        while True:
            if condition() or (task is not None and task.done()):
                return
            await asyncio.sleep(0.01)


async def run_until(supervisor: Supervisor, condition: Callable[[], bool], *, then_stop: bool = True) -> bool:
    task = asyncio.create_task(supervisor.run())
    await until(condition, task)
    if then_stop:
        supervisor.stop("test")
    async with asyncio.timeout(5):
        return await task


async def test_stages_start_in_order_and_stop_in_reverse() -> None:
    journal = Journal()
    supervisor = Supervisor([journal.stage(n) for n in ("servers", "caches", "webhooks", "leader")], grace=5)
    clean = await run_until(supervisor, lambda: "start leader" in journal.entries)
    assert clean
    assert journal.entries == ["start servers", "start caches", "start webhooks", "start leader",
                               "stop leader", "stop webhooks", "stop caches", "stop servers"]


async def test_a_stage_starts_only_after_the_previous_one_is_ready() -> None:
    journal = Journal()
    supervisor = Supervisor([journal.stage("servers"), journal.stage("caches", never_ready=True),
                             journal.stage("leader")], grace=5)
    task = asyncio.create_task(supervisor.run())
    await asyncio.sleep(0.2)
    assert journal.entries == ["start servers", "start caches"]
    supervisor.stop("SIGTERM while the caches sync")
    assert await task
    assert journal.entries == ["start servers", "start caches", "stop caches", "stop servers"]


async def test_a_stage_that_fails_to_start_stops_the_started_ones_and_starts_no_more() -> None:
    journal = Journal()
    supervisor = Supervisor([journal.stage("servers"), journal.stage("caches", fail_on_start=True),
                             journal.stage("leader")], grace=5)
    clean = await run_until(supervisor, lambda: False, then_stop=False)
    assert not clean
    assert journal.entries == ["start servers", "start caches", "stop caches", "stop servers"]
    assert "caches could not start" in supervisor.failures[0]


async def test_a_stage_that_fails_later_stops_the_process_in_reverse_order() -> None:
    journal = Journal()
    supervisor = Supervisor([journal.stage("servers"), journal.stage("caches", fail_after_start=True),
                             journal.stage("leader")], grace=5)
    clean = await run_until(supervisor, lambda: False, then_stop=False)
    assert not clean
    assert journal.entries == ["start servers", "start caches", "start leader", "stop caches",
                               "stop leader", "stop servers"]


async def test_a_stage_that_ends_on_its_own_counts_as_a_failure() -> None:
    journal = Journal()
    supervisor = Supervisor([journal.stage("servers"), journal.stage("caches", end_on_its_own=True)], grace=5)
    clean = await run_until(supervisor, lambda: False, then_stop=False)
    assert not clean
    assert supervisor.failures == ["caches: ended on its own"]


async def test_a_stop_that_overruns_the_grace_period_is_cut_short_and_reported() -> None:
    journal = Journal()
    supervisor = Supervisor([journal.stage("servers"), journal.stage("leader", slow_cleanup=30)], grace=0.2)
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(supervisor.run())
    await until(lambda: "start leader" in journal.entries)
    asked = loop.time()
    supervisor.stop("SIGTERM")
    clean = await task
    assert loop.time() - asked < 1, "the 30 s cleanup was cut short at the 0.2 s grace"
    assert not clean
    assert "grace period" in supervisor.failures[0]
    assert "stop leader" not in journal.entries
    assert journal.entries[-1] == "stop servers"


async def test_cancelling_the_supervisor_still_stops_every_stage_in_reverse() -> None:
    journal = Journal()
    supervisor = Supervisor([journal.stage("servers"), journal.stage("caches")], grace=5)
    task = asyncio.create_task(supervisor.run())
    await until(lambda: "start caches" in journal.entries)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert journal.entries[-2:] == ["stop caches", "stop servers"]
