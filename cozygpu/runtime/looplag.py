"""How late the event loop runs: a cheap ticker that measures its own lateness.

Why: one loop serves watches, webhooks and the binder's passes, so a long
synchronous stretch (a rebuild over the fleet, a big list decoded) delays
every answer at once. The ticker sleeps ``interval`` and observes how much
later than asked it woke into ``cozygpu_event_loop_lag_seconds``: a stall of
half a second shows as one observation of about 0.5 s, whoever caused it.

A loop is also late when its thread is ready to run but the machine's CPUs are
busy with other processes. Where the kernel tells (Linux: the thread's
run-queue wait in ``/proc/thread-self/schedstat``), each tick also observes
that wait from just before the tick was due to its wake-up
(``cozygpu_event_loop_cpu_wait_seconds``) and the lag less it
(``cozygpu_event_loop_busy_lag_seconds``): the loop's own lateness, what this
process's work caused, which is never more than the thread ran on a CPU since
the last tick (the kernel's on-CPU time, the same file).

Contract: ``run()`` lives until cancelled; it costs one wake-up per
``interval`` (0.1 s by default), and where the kernel keeps the counter one
more wake-up just before and two reads of it (about 2 µs each; procfs never
waits on a disk); it never raises. Time is the injected clock's; so are the thread's times (``times``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Histogram

from cozygpu.base.clock import Clock, LoopClock

#: Seconds: from a millisecond (a loop that keeps up) to seconds (a loop held by one long stretch).
LAG_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
SCHEDSTAT: Final = "/proc/thread-self/schedstat"
#: Seconds before a tick is due at which the thread's run-queue wait is read.
PRE_TICK: Final = 0.002


#: (seconds on a CPU, seconds ready but waiting for one) of the loop's thread so far.
ThreadTimes = Callable[[], tuple[float, float]]


def schedstat(line: bytes) -> tuple[float, float]:
    """(seconds on a CPU, seconds ready but waiting for one) from a thread's ``schedstat`` line
    ("<on-CPU ns> <run-queue wait ns> <timeslices>")."""
    on_cpu, waiting = line.split()[:2]
    return int(on_cpu) / 1e9, int(waiting) / 1e9


@contextlib.contextmanager
def thread_times() -> Iterator[ThreadTimes | None]:
    """A reader of the calling thread's times on a CPU and waiting for one, for the life of the ``with``, or
    None where the kernel does not tell. The counters are the thread's that enters (enter on the loop's)."""
    try:
        fd = os.open(SCHEDSTAT, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        yield None
        return

    def read() -> tuple[float, float]:
        return schedstat(os.pread(fd, 64, 0))

    try:
        try:
            read()
        except (OSError, IndexError, ValueError):
            yield None
        else:
            yield read
    finally:
        os.close(fd)


class LoopLag:
    """The ticker (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry, *, interval: float = 0.1, clock: Clock | None = None,
                 times: ThreadTimes | None = None) -> None:
        if interval <= 0:
            raise ValueError("the ticker's interval must be positive")
        self._interval = interval
        self._clock: Clock = clock if clock is not None else LoopClock()
        #: The loop thread's times so far; None: read the kernel's from ``run()``'s thread.
        self._times = times
        self.lag = Histogram("cozygpu_event_loop_lag_seconds", "How much later than asked the event loop woke a "
                             "ticker that sleeps 0.1 s", buckets=LAG_BUCKETS, registry=registry)
        self.cpu_wait = Histogram(
            "cozygpu_event_loop_cpu_wait_seconds", "How long the event loop's thread was ready to run but waited "
            "for a CPU, from just before each tick of the lag ticker was due to its wake-up (Linux)",
            buckets=LAG_BUCKETS, registry=registry)
        self.busy_lag = Histogram(
            "cozygpu_event_loop_busy_lag_seconds", "The lag ticker's lateness less the time the loop's thread "
            "waited for a CPU meanwhile, and at most its time on a CPU since the last tick: the loop's own lateness "
            "(Linux)", buckets=LAG_BUCKETS, registry=registry)

    async def run(self) -> None:
        given = self._times
        with contextlib.nullcontext(given) if given is not None else thread_times() as times:
            await self._ticks(times)

    async def _ticks(self, times: ThreadTimes | None) -> None:
        clock, interval = self._clock, self._interval
        ahead = min(PRE_TICK, interval / 2)
        last = times() if times is not None else (0.0, 0.0)
        while True:
            due = clock.now() + interval
            if times is None:
                await clock.sleep(interval)
                self.lag.observe(max(clock.now() - due, 0.0))
                continue
            # The wait is read just before the tick is due (a second, short sleep): it covers the tick's late
            # part, not the thread's waits earlier in the interval. The loop's own lateness is the rest of the
            # lag, and never more than the thread ran since the last tick (which bounds a stall that began before
            # the wait was read: the figure errs high, never low).
            await clock.sleep(interval - ahead)
            _, waited = times()
            if (rest := due - clock.now()) > 0:
                await clock.sleep(rest)
            now = times()
            late, wait, ran = max(clock.now() - due, 0.0), max(now[1] - waited, 0.0), max(now[0] - last[0], 0.0)
            last = now
            self.lag.observe(late)
            self.cpu_wait.observe(wait)
            self.busy_lag.observe(max(min(late - wait, ran), 0.0))
