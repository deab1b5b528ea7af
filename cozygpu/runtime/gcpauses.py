"""How long Python's cyclic garbage collector holds the process, per generation.

Why: the event loop's lag (``looplag``) says the loop was late, not why. A
full collection walks every tracked object: at 10,000 nodes the caches hold
millions of them, and one full pass can hold the loop for longer than any
slice of our own work. ``cozygpu_gc_pause_seconds{generation}`` times each
collection from the collector's own start and stop callbacks, so a lag that a
collection explains reads as such on the same scrape.

What survives a full collection is frozen (``gc.freeze``): the caches' objects,
the model's tables, the process's own machinery. The next full collection
walks only what came after, not the whole fleet again: without it, at 5,000
nodes one full collection in the side-by-side bench's run held the loop for
0.44 s, at 10,000 for 1.45 s. The cost: an object frozen that later dies in a
reference cycle is never collected (the cache's objects and the model's
tables hold no cycles; they are freed by their reference counts);
``cozygpu_gc_frozen_objects`` shows how many are frozen.

Contract: ``installed()`` adds the callback for the life of its ``with`` and
removes it on the way out (whatever raised); the callback costs two clock
reads per collection, a freeze after a full one, and never raises. ``now``
and ``freeze`` are injected (a test drives them).
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

from prometheus_client import CollectorRegistry, Gauge, Histogram

#: Seconds: a young collection is well under a millisecond; a full one over a large heap takes seconds.
PAUSE_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class GcPauses:
    """The collector's pauses (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry, *, now: Callable[[], float] = time.perf_counter,
                 freeze: Callable[[], None] = gc.freeze) -> None:
        self._now = now
        self._freeze = freeze
        self._started: float | None = None
        self.pauses = Histogram("cozygpu_gc_pause_seconds", "How long each cyclic garbage collection held the "
                                "process, by generation (2 is a full collection)", ("generation",),
                                buckets=PAUSE_BUCKETS, registry=registry)
        frozen = Gauge("cozygpu_gc_frozen_objects", "Objects that survived a full collection, out of the "
                       "collector's sight since (gc.freeze): a full collection no longer walks them", registry=registry)
        frozen.set_function(gc.get_freeze_count)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self._now()
        elif phase == "stop" and self._started is not None:
            generation = info.get("generation", "?")
            self.pauses.labels(str(generation)).observe(max(self._now() - self._started, 0.0))
            self._started = None
            if generation == 2:
                self._freeze()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        gc.callbacks.append(self._callback)
        try:
            yield
        finally:
            gc.callbacks.remove(self._callback)
