"""``Backoff``: exponential delays with jitter, reset by a quiet period or by hand (client-go's wait.Backoff);
and the project's only randomness: every jitter and spread draws from a ``Random`` handed in (``new_random``
when none is: a test hands in a seeded one).

The first delay is ``initial``, each failure multiplies it by ``factor`` up
to ``cap``, each delay gets up to ``jitter`` times itself added at random,
and a run of ``reset_after`` seconds without a failure (or ``reset()``)
starts over from ``initial``. One instance per task; it is not shared.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Final, Protocol

from cozygpu.base.clock import Clock

#: client-go's JitterFactor for leader election: a retry period may stretch by this much.
JITTER_FACTOR: Final = 1.2


class Random(Protocol):
    def random(self) -> float: ...


def new_random() -> Random:
    """A generator seeded from the system: where no test hands one in."""
    return random.Random()


def jittered(period: float, rng: Random, factor: float = JITTER_FACTOR) -> float:
    """``period`` stretched by up to ``factor`` times itself (client-go's wait.Jitter)."""
    return period + rng.random() * factor * period


def spread(low: int, high: int, rng: Random) -> int:
    """A whole number from ``low`` to ``high``, each as likely (a watch's timeout, so watches do not end together)."""
    return min(low + int(rng.random() * (high - low + 1)), high)


class Backoff:
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

    def reset(self) -> None:
        """A success: the next failure waits ``initial`` again."""
        self._current = 0.0
        self._last_failure = None

    async def wait(self) -> float:
        """Record a failure and sleep for the next delay; returns the delay slept."""
        delay = self.next_delay()
        await self._clock.sleep(delay)
        return delay
