"""Ordered start, reverse stop: the process as a list of stages (R-RUN-5).

A ``Stage`` is a coroutine function ``run(ready)`` that starts something,
calls ``ready()`` once it is up (servers listening, caches synced), then runs
until cancelled and cleans up in its ``finally``. ``Supervisor.run()``:

- starts the stages one at a time, in order: a stage starts only after the
  previous one called ``ready()``;
- runs until ``stop()`` is called (SIGTERM) or a stage fails or ends on its
  own, which also stops the process (a replica with a dead part must not
  keep answering as if whole);
- stops the started stages in reverse order, each cancelled and awaited
  before the next, all within ``grace`` seconds; stages still running when the
  grace runs out are cancelled together;
- returns whether the process stopped cleanly (no stage failed, grace kept).

Structured concurrency: every stage runs in a task of one TaskGroup owned by
``run()``; when ``run()`` returns, no stage task is left. Stage failures never
escape into the TaskGroup (they would cancel every stage at once, in no
order); they are recorded and turn into an ordered stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import attrs

from cozygpu.base.clock import Clock, LoopClock
from cozygpu.base.deadline import deadline
from cozygpu.base.logging import get_logger
from cozygpu.runtime.metrics import ProcessMetrics

_log = get_logger("cozygpu.process")

StageRun = Callable[[Callable[[], None]], Coroutine[Any, Any, None]]


@attrs.frozen
class Stage:
    name: str
    run: StageRun


class Supervisor:
    def __init__(self, stages: Sequence[Stage], *, grace: float, metrics: ProcessMetrics | None = None,
                 clock: Clock | None = None) -> None:
        if len({s.name for s in stages}) != len(stages):
            raise ValueError("stage names must be unique")
        self._stages = list(stages)
        self._grace = grace
        self._clock: Clock = clock if clock is not None else LoopClock()
        self._metrics = metrics
        self._stop = asyncio.Event()
        self._stop_reason = ""
        self._failures: list[str] = []

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def failures(self) -> list[str]:
        return list(self._failures)

    def stop(self, reason: str) -> None:
        """Ask the process to stop (idempotent; safe from a signal handler)."""
        if self._stop.is_set():
            _log.info("already stopping", reason=reason)
            return
        self._stop_reason = reason
        _log.info("stopping", reason=reason)
        self._stop.set()

    async def run(self) -> bool:
        started: list[tuple[Stage, asyncio.Task[None]]] = []
        async with asyncio.TaskGroup() as group:
            try:
                await self._start_in_order(group, started)
                await self._stop.wait()
            finally:
                await self._stop_in_reverse(started)
        return not self._failures

    async def _start_in_order(self, group: asyncio.TaskGroup,
                              started: list[tuple[Stage, asyncio.Task[None]]]) -> None:
        stop_requested = asyncio.ensure_future(self._stop.wait())
        try:
            for stage in self._stages:
                if self._stop.is_set():
                    return
                up = asyncio.Event()
                task = group.create_task(self._guard(stage, up.set), name=f"stage {stage.name}")
                started.append((stage, task))
                became_ready = asyncio.ensure_future(up.wait())
                try:
                    await asyncio.wait({became_ready, task, stop_requested}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    became_ready.cancel()
                if not up.is_set():
                    return
                _log.info("stage started", stage=stage.name)
                if self._metrics is not None:
                    self._metrics.stage_up.labels(stage.name).set(1)
        finally:
            stop_requested.cancel()

    async def _guard(self, stage: Stage, ready: Callable[[], None]) -> None:
        try:
            await stage.run(ready)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # an ExceptionGroup from a stage's own task group included
            self._failures.append(f"{stage.name}: {err!r}")
            _log.error("stage failed", stage=stage.name, exc_info=err)
            self.stop(f"stage {stage.name} failed")
        else:
            if not self._stop.is_set():
                self._failures.append(f"{stage.name}: ended on its own")
                _log.error("stage ended on its own", stage=stage.name)
                self.stop(f"stage {stage.name} ended")

    async def _stop_in_reverse(self, started: list[tuple[Stage, asyncio.Task[None]]]) -> None:
        if not self._stop.is_set():
            self._stop.set()  # cancelled from outside: still stop in order
        try:
            async with deadline(self._clock, self._grace):
                for stage, task in reversed(started):
                    task.cancel()
                    await asyncio.wait({task})
                    _log.info("stage stopped", stage=stage.name)
                    if self._metrics is not None:
                        self._metrics.stage_up.labels(stage.name).set(0)
        except TimeoutError:
            left = [stage.name for stage, task in started if not task.done()]
            self._failures.append(f"stopping took longer than the grace period ({self._grace:g}s): {left}")
            _log.error("grace period exceeded; cancelling what is left", stages=left)
            for _, task in started:
                task.cancel()
