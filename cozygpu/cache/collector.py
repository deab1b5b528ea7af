"""Pausing Python's cyclic garbage collector around bursts of long-lived allocations.

Why: decoding a list of 20,000 pods, or building a model snapshot of tens of
thousands of views, allocates objects that all outlive the burst and hold no
reference cycles. The collector, counting allocations, runs dozens of young
collections and often a full one over the whole cache (50-60 ms at the
benchmarks' scale) during such a burst and finds nothing. Paused, the new
objects are looked at once, by the first young collection afterwards.

Contract: ``collector_paused`` is reentrant and may span awaits (several
informers can decode lists at once): the first pause records whether the
collector was on, the last one out restores exactly that, even when the body
raises. It never turns on a collector that someone else turned off.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

_pauses = 0
_was_enabled = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    global _pauses, _was_enabled
    if _pauses == 0:
        _was_enabled = gc.isenabled()
        gc.disable()
    _pauses += 1
    try:
        yield
    finally:
        _pauses -= 1
        if _pauses == 0 and _was_enabled:
            gc.enable()
