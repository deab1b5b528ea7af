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

``Watchdog`` is the one way out that nothing in the process can hold up: a
daemon thread with its own monotonic deadline that ends the process with
``os._exit``. Leader election arms it for the end of each term, so work that
ignores cancellation, or blocks the event loop, cannot outlive the lease beside
the next leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import logging.handlers
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final

import attrs

from cozygpu.base.clock import Clock, LoopClock
from cozygpu.base.deadline import deadline
from cozygpu.base.logging import get_logger
from cozygpu.runtime.metrics import ProcessMetrics

_log = get_logger("cozygpu.process")

#: The exit code of a process the watchdog ended: a part failed (see ``cozygpu.runtime.command``).
HARD_EXIT_CODE: Final = 1
#: How long the watchdog lets the log writer thread drain before it ends the process.
LOG_DRAIN: Final = 1.0

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


class Watchdog:
    """Ends the process once a deadline passes, whatever the event loop is doing.

    ``arm(seconds, reason)`` sets the deadline (replacing any earlier one) on
    ``monotonic`` (the host's clock; a test passes its own and calls
    ``nudge()`` after moving it); ``disarm()`` clears it; ``expire(reason)``
    ends the process now; ``close()`` stops the thread (started by the first
    ``arm``). When the deadline passes, the thread logs ``reason`` at critical
    level, lets the log writer drain for up to ``LOG_DRAIN`` seconds, and calls
    ``exit(HARD_EXIT_CODE)`` (``os._exit``: no cleanup runs, nothing can wedge
    it). Every method is safe from the loop and from other threads.
    """

    def __init__(self, *, exit: Callable[[int], object] = os._exit,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._exit = exit
        self._monotonic = monotonic
        self._changed = threading.Condition()
        self._deadline: float | None = None
        self._reason = ""
        self._closed = False
        self._thread: threading.Thread | None = None
        #: ``nudge`` calls asked, and the last one the thread has read the clock after.
        self._nudged = self._seen = 0
        #: Why the watchdog fired, once it has (tests inject an ``exit`` that returns).
        self.fired: str | None = None

    def arm(self, seconds: float, reason: str) -> None:
        with self._changed:
            self._deadline = self._monotonic() + max(0.0, seconds)
            self._reason = reason
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._watch, name="cozygpu watchdog", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def disarm(self) -> None:
        with self._changed:
            self._deadline = None
            self._changed.notify_all()

    def expire(self, reason: str) -> None:
        self.arm(0.0, reason)

    def nudge(self) -> None:
        """Have the thread read the clock again, and return once it has (fired or not): for a clock that
        moves by other means than time passing. Returns at once when no thread runs."""
        with self._changed:
            self._nudged += 1
            wanted = self._nudged
            self._changed.notify_all()
            while self._thread is not None and self._thread.is_alive() and self.fired is None \
                    and self._seen < wanted:
                self._changed.wait(0.1)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _watch(self) -> None:
        with self._changed:
            while not self._closed:
                nudged = self._nudged
                if self._deadline is not None and self._deadline - self._monotonic() <= 0:
                    self.fired = reason = self._reason
                    break
                self._seen = nudged
                self._changed.notify_all()
                self._changed.wait(None if self._deadline is None else self._deadline - self._monotonic())
            else:
                return
        _log.critical("ending the process hard", reason=reason, exit_code=HARD_EXIT_CODE)
        _drain_logs(LOG_DRAIN)
        self._exit(HARD_EXIT_CODE)


def _drain_logs(limit: float) -> None:
    """Wait (up to ``limit`` seconds) until the log queues are empty, then flush stderr.

    ``cozygpu.base.logging`` writes from a thread of its own; ``os._exit`` would
    drop what it has not written yet, and the line saying why is the one that matters.
    """
    queues = [h.queue for h in logging.getLogger().handlers if isinstance(h, logging.handlers.QueueHandler)]
    until = time.monotonic() + limit
    while any(not q.empty() for q in queues if hasattr(q, "empty")) and time.monotonic() < until:
        time.sleep(0.01)
    time.sleep(min(0.05, max(0.0, until - time.monotonic())))  # the writer may hold the last record
    for stream in (sys.stderr, sys.stdout):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
