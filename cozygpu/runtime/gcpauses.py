"""How long Python's cyclic garbage collector holds the process, per generation.

Why: the event loop's lag (``looplag``) says the loop was late, not why. A
full collection walks every tracked object: at 10,000 nodes the caches hold
millions of them, and one full pass can hold the loop for longer than any
slice of our own work. ``cozygpu_gc_pause_seconds{generation}`` times each
collection from the collector's own start and stop callbacks, so a lag that a
collection explains reads as such on the same scrape.

Contract: ``installed()`` adds the callback for the life of its ``with`` and
removes it on the way out (whatever raised); the callback costs two clock
reads per collection and never raises. ``now`` is injected (a test drives it).
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

from prometheus_client import CollectorRegistry, Histogram

#: Seconds: a young collection is well under a millisecond; a full one over a large heap takes seconds.
PAUSE_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class GcPauses:
    """The collector's pauses (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry, *, now: Callable[[], float] = time.perf_counter) -> None:
        self._now = now
        self._started: float | None = None
        self.pauses = Histogram("cozygpu_gc_pause_seconds", "How long each cyclic garbage collection held the "
                                "process, by generation (2 is a full collection)", ("generation",),
                                buckets=PAUSE_BUCKETS, registry=registry)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self._now()
        elif phase == "stop" and self._started is not None:
            self.pauses.labels(str(info.get("generation", "?"))).observe(max(self._now() - self._started, 0.0))
            self._started = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        gc.callbacks.append(self._callback)
        try:
            yield
        finally:
            gc.callbacks.remove(self._callback)
