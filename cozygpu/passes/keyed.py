"""``KeyQueue``: the keys a reconciler must look at, each once, with a backoff of its own.

controller-runtime's workqueue for one serial worker (the driver's lane):

- ``add(key)``: ready now. A key is in the queue at most once, however often
  it is added (de-duplication); added while its reconcile runs, it is ready
  again for the next pass.
- ``add_after(key, seconds)``: ready then (the earliest of two wins; a key
  ready now stays ready). When the first such time comes, ``on_ready`` is
  called (the work's lane asks the driver for a pass).
- ``retry(key)``: a refusal. Ready after ``base * 2**(failures - 1)``
  seconds, at most ``cap``: a key refused again and again waits longer each
  time, and holds up no other key.
- ``forget(key)``: a success, its failures forgotten.
- ``take()``: every key ready now, in the order they became ready, and out of
  the queue.

Time is the injected clock's; nothing here blocks or writes.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

from cozygpu.base.clock import Cancellable, Clock

K = TypeVar("K", bound=Hashable)

#: controller-runtime's per-item limiter starts at 5 ms; ours caps at a minute (its 1,000 s is for
#: external systems; ours are writes to the API server a later view makes right).
BASE = 0.005
CAP = 60.0


class KeyQueue(Generic[K]):
    def __init__(self, clock: Clock, *, base: float = BASE, cap: float = CAP) -> None:
        self._clock = clock
        self._base, self._cap = base, cap
        #: Ready keys, in the order they became ready (a dict keeps insertion order).
        self._ready: dict[K, None] = {}
        #: Key -> when it is ready (the earliest asked), and the heap of those times.
        self._later: dict[K, float] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._order = itertools.count()
        self._failures: dict[K, int] = {}
        self._reminder: Cancellable | None = None
        self._reminder_at: float | None = None
        self._on_ready: Callable[[], None] | None = None

    def on_ready(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when a key added for later becomes ready."""
        self._on_ready = callback

    def add(self, key: K) -> None:
        self._later.pop(key, None)  # its heap entry is skipped when it comes up
        self._ready[key] = None

    def add_all(self, keys: Iterable[K]) -> None:
        for key in keys:
            self.add(key)

    def add_after(self, key: K, seconds: float) -> None:
        if seconds <= 0:
            self.add(key)
            return
        if key in self._ready:
            return
        at = self._clock.now() + seconds
        found = self._later.get(key)
        if found is not None and found <= at:
            return
        self._later[key] = at
        heapq.heappush(self._heap, (at, next(self._order), key))
        self._remind()

    def retry(self, key: K) -> float:
        """A refusal: the key is ready again after its backoff; returns that delay."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = min(self._base * 2.0 ** (failures - 1), self._cap)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def take(self) -> list[K]:
        """Every key ready now (those added for a time now past too), out of the queue."""
        self._due()
        taken = list(self._ready)
        self._ready.clear()
        return taken

    def ready(self) -> bool:
        self._due()
        return bool(self._ready)

    def __len__(self) -> int:
        return len(self._ready) + len(self._later)

    def __contains__(self, key: object) -> bool:
        return key in self._ready or key in self._later

    def clear(self) -> None:
        """Nothing queued, nothing remembered (a term ends)."""
        self._ready.clear()
        self._later.clear()
        self._heap.clear()
        self._failures.clear()
        if self._reminder is not None:
            self._reminder.cancel()
        self._reminder = self._reminder_at = None

    def _due(self) -> None:
        now, heap, later = self._clock.now(), self._heap, self._later
        while heap and heap[0][0] <= now:
            at, _, key = heapq.heappop(heap)
            if later.get(key) == at:
                del later[key]
                self._ready[key] = None
        if len(heap) > 4 * len(later) + 64:  # superseded entries: drop them
            self._heap = [(at, next(self._order), key) for key, at in later.items()]
            heapq.heapify(self._heap)

    def _remind(self) -> None:
        """One reminder, for the earliest time a key becomes ready."""
        if not self._heap:
            return
        first = self._heap[0][0]
        if self._reminder_at is not None and self._reminder_at <= first:
            return
        if self._reminder is not None:
            self._reminder.cancel()
        self._reminder_at = first
        self._reminder = self._clock.call_later(max(first - self._clock.now(), 0.0), self._fire)

    def _fire(self) -> None:
        self._reminder = self._reminder_at = None
        self._due()
        if self._ready and self._on_ready is not None:
            self._on_ready()
        self._remind()
