"""The figures of every pass loop, labelled by loop and lane.

``PassMetrics.on(registry)`` registers the families once per registry and
hands the same ones to every later caller, so every driver of a process
shares them and differs by the ``loop`` label.
"""

from __future__ import annotations

import weakref
from typing import Final

import attrs
from prometheus_client import CollectorRegistry, Counter, Histogram

#: Seconds; a full pass over a large cluster may take tens of them.
_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

_REGISTERED: weakref.WeakKeyDictionary[CollectorRegistry, PassMetrics] = weakref.WeakKeyDictionary()


@attrs.frozen
class PassMetrics:
    duration: Histogram
    passes: Counter
    queue_wait: Histogram
    sync_wait: Histogram
    sync_timeouts: Counter

    @classmethod
    def on(cls, registry: CollectorRegistry) -> PassMetrics:
        """The families on ``registry``, registered by the first call."""
        metrics = _REGISTERED.get(registry)
        if metrics is None:
            metrics = _REGISTERED[registry] = cls._register(registry)
        return metrics

    @classmethod
    def _register(cls, registry: CollectorRegistry) -> PassMetrics:
        return cls(
            duration=Histogram("cozygpu_pass_duration_seconds", "How long a pass took, snapshot to last write",
                               ("loop", "lane"), buckets=_BUCKETS, registry=registry),
            passes=Counter("cozygpu_passes", "Passes run, by how they ended (ok, requeued, waiting, failed)",
                           ("loop", "lane", "outcome"), registry=registry),
            queue_wait=Histogram("cozygpu_pass_queue_wait_seconds", "From the first request a pass answers "
                                 "to its start", ("loop", "lane"), buckets=_BUCKETS, registry=registry),
            sync_wait=Histogram("cozygpu_pass_write_sync_seconds", "How long the cache took to see a pass's "
                                "own writes before the next pass", ("loop",), buckets=_BUCKETS,
                                registry=registry),
            sync_timeouts=Counter("cozygpu_pass_write_sync_timeouts", "Waits for a pass's own writes that ran "
                                  "out of time", ("loop",), registry=registry),
        )
