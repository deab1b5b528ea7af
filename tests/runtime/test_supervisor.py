"""Ordered start and reverse stop of the process's stages, on fake time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from cozygpu.base.clock import FakeClock, settle
from cozygpu.runtime.process import Stage, StageRun, Supervisor


class Journal:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
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
                    await self.clock.sleep(0.05)
                    raise RuntimeError(f"{name} broke")
                if end_on_its_own:
                    return
                await asyncio.Event().wait()
            finally:
                if slow_cleanup:
                    await self.clock.sleep(slow_cleanup)
                self.entries.append(f"stop {name}")

        body: StageRun = run
        return Stage(name, body)


def supervised(journal: Journal, stages: list[Stage], *, grace: float = 5) -> Supervisor:
    return Supervisor(stages, grace=grace, clock=journal.clock)


async def run_until(supervisor: Supervisor, clock: FakeClock, condition: Callable[[], bool], *,
                    then_stop: bool = True) -> bool:
    """Run the supervisor on fake time until ``condition`` holds (or it returns), then stop it."""
    task = asyncio.create_task(supervisor.run())
    await clock.run_for(1)
    assert condition() or task.done()
    if then_stop:
        supervisor.stop("test")
    await clock.run_for(1)
    assert task.done()
    return task.result()


async def test_stages_start_in_order_and_stop_in_reverse() -> None:
    journal = Journal(FakeClock())
    supervisor = supervised(journal, [journal.stage(n) for n in ("servers", "caches", "webhooks", "leader")])
    clean = await run_until(supervisor, journal.clock, lambda: "start leader" in journal.entries)
    assert clean
    assert journal.entries == ["start servers", "start caches", "start webhooks", "start leader",
                               "stop leader", "stop webhooks", "stop caches", "stop servers"]


async def test_a_stage_starts_only_after_the_previous_one_is_ready() -> None:
    journal = Journal(FakeClock())
    supervisor = supervised(journal, [journal.stage("servers"), journal.stage("caches", never_ready=True),
                                      journal.stage("leader")])
    task = asyncio.create_task(supervisor.run())
    await settle()  # everything that can run has run: the caches never become ready, whatever the time
    assert journal.entries == ["start servers", "start caches"]
    supervisor.stop("SIGTERM while the caches sync")
    assert await task
    assert journal.entries == ["start servers", "start caches", "stop caches", "stop servers"]


async def test_a_stage_that_fails_to_start_stops_the_started_ones_and_starts_no_more() -> None:
    journal = Journal(FakeClock())
    supervisor = supervised(journal, [journal.stage("servers"), journal.stage("caches", fail_on_start=True),
                                      journal.stage("leader")])
    clean = await run_until(supervisor, journal.clock, lambda: False, then_stop=False)
    assert not clean
    assert journal.entries == ["start servers", "start caches", "stop caches", "stop servers"]
    assert "caches could not start" in supervisor.failures[0]


async def test_a_stage_that_fails_later_stops_the_process_in_reverse_order() -> None:
    journal = Journal(FakeClock())
    supervisor = supervised(journal, [journal.stage("servers"), journal.stage("caches", fail_after_start=True),
                                      journal.stage("leader")])
    clean = await run_until(supervisor, journal.clock, lambda: False, then_stop=False)
    assert not clean
    assert journal.entries == ["start servers", "start caches", "start leader", "stop caches",
                               "stop leader", "stop servers"]


async def test_a_stage_that_ends_on_its_own_counts_as_a_failure() -> None:
    journal = Journal(FakeClock())
    supervisor = supervised(journal, [journal.stage("servers"), journal.stage("caches", end_on_its_own=True)])
    clean = await run_until(supervisor, journal.clock, lambda: False, then_stop=False)
    assert not clean
    assert supervisor.failures == ["caches: ended on its own"]


async def test_a_stop_that_overruns_the_grace_period_is_cut_short_and_reported() -> None:
    clock = FakeClock()
    journal = Journal(clock)
    supervisor = supervised(journal, [journal.stage("servers"), journal.stage("leader", slow_cleanup=30)],
                            grace=0.2)
    task = asyncio.create_task(supervisor.run())
    await settle()
    assert journal.entries == ["start servers", "start leader"]
    supervisor.stop("SIGTERM")
    await clock.run_for(0.19)
    assert not task.done(), "the grace has not run out yet"
    await clock.run_for(0.01)
    assert task.done(), "the 30 s cleanup was cut short at the 0.2 s grace"
    assert not task.result()
    assert "grace period" in supervisor.failures[0]
    assert "stop leader" not in journal.entries
    assert journal.entries[-1] == "stop servers"


async def test_cancelling_the_supervisor_still_stops_every_stage_in_reverse() -> None:
    journal = Journal(FakeClock())
    supervisor = supervised(journal, [journal.stage("servers"), journal.stage("caches")])
    task = asyncio.create_task(supervisor.run())
    await settle()
    assert journal.entries == ["start servers", "start caches"]
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert journal.entries[-2:] == ["stop caches", "stop servers"]
