"""Time, as every part sees it: one ``Clock`` it can be handed, the loop's real one and a fake.

Contract:
- ``now()`` is monotonic seconds (validity, deadlines, backoff); ``wall()`` is
  the UTC time, timezone-aware, only ever written or shown, never compared
  with ``now()``.
- ``sleep`` and ``call_later`` wait on the same time as ``now()``.
- ``LoopClock`` is the running event loop's clock and the UTC time of the host.
- ``FakeClock`` moves only when a test says so; sleeps and timers fire in time
  order as it passes them. ``advance`` fires the due callbacks at once (the
  test then lets the loop run), ``run_for`` also lets every runnable task run
  after each firing, for code whose next timer depends on what the woken task does.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import heapq
import itertools
from collections.abc import Callable
from typing import Final, Protocol

#: Where a ``FakeClock``'s wall time starts unless told otherwise.
START: Final = dt.datetime(2026, 12, 2, 12, 0, 0, tzinfo=dt.UTC)


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    def wall(self) -> dt.datetime:
        """The time in UTC, timezone-aware."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    def call_later(self, seconds: float, callback: Callable[[], None]) -> Cancellable:
        """Run ``callback`` on the loop after ``seconds``; the handle cancels it."""
        ...


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class LoopClock:
    """The running event loop's clock, and the host's UTC time."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def wall(self) -> dt.datetime:
        return utc_now()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def call_later(self, seconds: float, callback: Callable[[], None]) -> Cancellable:
        return asyncio.get_running_loop().call_later(seconds, callback)


async def settle(rounds: int = 30) -> None:
    """Let every task that can run without time passing run."""
    for _ in range(rounds):
        await asyncio.sleep(0)


class _Handle:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback: Callable[[], None] | None = callback

    def cancel(self) -> None:
        self.callback = None


class FakeClock:
    """Hand-moved time for tests (see the module docstring)."""

    def __init__(self, *, start: float = 0.0, wall_start: dt.datetime = START) -> None:
        self._t = start
        self._origin = start
        self._wall_start = wall_start
        self._timers: list[tuple[float, int, _Handle]] = []
        self._seq = itertools.count()
        #: Every sleep asked for, in order.
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self._t

    def wall(self) -> dt.datetime:
        return self._wall_start + dt.timedelta(seconds=self._t - self._origin)

    def call_later(self, seconds: float, callback: Callable[[], None]) -> _Handle:
        handle = _Handle(callback)
        heapq.heappush(self._timers, (self._t + max(0.0, seconds), next(self._seq), handle))
        return handle

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        handle = self.call_later(seconds, wake)
        try:
            await future
        finally:
            handle.cancel()

    @property
    def sleeping(self) -> int:
        """How many sleeps and timers are pending."""
        return sum(1 for _, _, handle in self._timers if handle.callback is not None)

    def _fire_due(self) -> None:
        while self._timers and self._timers[0][0] <= self._t:
            _, _, handle = heapq.heappop(self._timers)
            if handle.callback is not None:
                handle.callback()

    def advance(self, seconds: float) -> None:
        """Move time forward, firing every timer that falls due on the way, in order."""
        target = self._t + seconds
        while self._timers and self._timers[0][0] <= target:
            self._t = max(self._t, self._timers[0][0])
            self._fire_due()
        self._t = target

    async def run_for(self, seconds: float, *, step: float | None = None) -> None:
        """Move time forward, letting tasks run after each firing (and at least every ``step``)."""
        target = self._t + seconds
        await settle()
        while True:
            nxt = self._timers[0][0] if self._timers else None
            if step is not None:
                nxt = min(nxt, self._t + step) if nxt is not None else self._t + step
            if nxt is None or nxt > target:
                break
            self._t = max(self._t, nxt)
            self._fire_due()
            await settle()
        self._t = target
        await settle()
