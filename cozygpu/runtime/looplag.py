"""How late the event loop runs: a cheap ticker that measures its own lateness.

Why: one loop serves watches, webhooks and the binder's passes, so a long
synchronous stretch (a rebuild over the fleet, a big list decoded) delays
every answer at once. The ticker sleeps ``interval`` and observes how much
later than asked it woke into ``cozygpu_event_loop_lag_seconds``: a stall of
half a second shows as one observation of about 0.5 s, whoever caused it.

Contract: ``run()`` lives until cancelled; it costs one wake-up per
``interval`` (0.1 s by default) and never raises. Time is the injected clock's.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Histogram

from cozygpu.base.clock import Clock, LoopClock

#: Seconds: from a millisecond (a loop that keeps up) to seconds (a loop held by one long stretch).
LAG_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class LoopLag:
    """The ticker (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry, *, interval: float = 0.1, clock: Clock | None = None) -> None:
        if interval <= 0:
            raise ValueError("the ticker's interval must be positive")
        self._interval = interval
        self._clock: Clock = clock if clock is not None else LoopClock()
        self.lag = Histogram("cozygpu_event_loop_lag_seconds", "How much later than asked the event loop woke a "
                             "ticker that sleeps 0.1 s", buckets=LAG_BUCKETS, registry=registry)

    async def run(self) -> None:
        clock, interval = self._clock, self._interval
        while True:
            due = clock.now() + interval
            await clock.sleep(interval)
            self.lag.observe(max(clock.now() - due, 0.0))
