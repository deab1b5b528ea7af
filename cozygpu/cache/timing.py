"""Time, as the cache sees it: ``cozygpu.base``'s clock and backoff.

Every wait in the cache (backoff between failed attempts, the inactivity
watchdog of a watch, the periodic re-check of discovery) goes through a
``Clock``, so tests drive time by hand instead of sleeping; ``Backoff`` is
client-go's reflector backoff (see ``cozygpu.base.backoff``). Both live in the
bottom layer now; this module keeps the names for code that imports them from
here.
"""

from __future__ import annotations

from cozygpu.base.backoff import Backoff
from cozygpu.base.clock import Cancellable, Clock, LoopClock

__all__ = ["Backoff", "Cancellable", "Clock", "LoopClock"]
