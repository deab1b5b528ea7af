"""Time, as the cache sees it: a clock it can be handed, and backoff with jitter.

Every wait in the cache (backoff between failed attempts, the inactivity
watchdog of a watch, the periodic re-check of discovery) goes through a
``Clock``, so tests drive time by hand instead of sleeping. ``LoopClock`` is
the event loop's monotonic clock.

``Backoff`` follows client-go's reflector: the first delay is ``initial``, each
failure doubles it up to ``cap``, each delay gets up to ``jitter`` times itself
added at random, and a run of ``reset_after`` seconds without a failure starts
over from ``initial``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Protocol


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    def call_later(self, seconds: float, callback: Callable[[], None]) -> Cancellable:
        """Run ``callback`` on the loop after ``seconds``; the handle cancels it."""
        ...


class LoopClock:
    """The running event loop's clock."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def call_later(self, seconds: float, callback: Callable[[], None]) -> Cancellable:
        return asyncio.get_running_loop().call_later(seconds, callback)


class Backoff:
    """Exponential backoff with jitter and a reset after a quiet period (not shared between tasks)."""

    def __init__(
        self,
        clock: Clock,
        *,
        initial: float = 0.8,
        factor: float = 2.0,
        cap: float = 30.0,
        jitter: float = 1.0,
        reset_after: float = 120.0,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if initial <= 0 or factor < 1 or cap < initial or jitter < 0:
            raise ValueError("backoff needs initial > 0, factor >= 1, cap >= initial, jitter >= 0")
        self._clock = clock
        self.initial = initial
        self.factor = factor
        self.cap = cap
        self.jitter = jitter
        self.reset_after = reset_after
        self._rng = rng
        self._current = 0.0
        self._last_failure: float | None = None

    def next_delay(self) -> float:
        """Record a failure and return how long to wait before the next attempt."""
        now = self._clock.now()
        if self._last_failure is None or now - self._last_failure >= self.reset_after:
            self._current = self.initial
        else:
            self._current = min(self._current * self.factor, self.cap)
        self._last_failure = now
        return self._current * (1.0 + self.jitter * self._rng())

    async def wait(self) -> float:
        """Record a failure and sleep for the next delay; returns the delay slept."""
        delay = self.next_delay()
        await self._clock.sleep(delay)
        return delay
