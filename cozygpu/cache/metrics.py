"""Prometheus metrics of the cache: watch restarts, relists, events, list time, store sizes, sync.

``CacheMetrics(registry)`` registers one set of collectors in ``registry``;
``default_metrics()`` is the process-wide set in prometheus-client's default
registry (created on first use, so importing this module registers nothing).
The controller process serves whichever registry it passes to ``Cache``.

Store sizes, sync and served state are read at scrape time from the live
informers (``InformerStates``), so the hot path pays nothing for them; the
counters are bound per kind once, so an event costs one ``inc()``.

    cozygpu_cache_events_total{kind,type}            ADDED / MODIFIED / DELETED / BOOKMARK
    cozygpu_cache_watch_restarts_total{kind,reason}  closed / inactive / error / expired
    cozygpu_cache_relists_total{kind,reason}         initial / expired
    cozygpu_cache_list_seconds{kind}                 histogram of a whole (paged) list
    cozygpu_cache_objects{kind}                      objects in the store
    cozygpu_cache_synced{kind}                       1 once the first list is stored
    cozygpu_cache_served{kind}                       1 served, 0 not served, -1 not known yet
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

#: (kind, objects, synced, served) for every informer, read at scrape time.
StateRow = tuple[str, int, bool, bool | None]
InformerStates = Callable[[], Iterable[StateRow]]


class _StateCollector(Collector):
    def __init__(self) -> None:
        self._sources: list[InformerStates] = []
        self._lock = threading.Lock()

    def add(self, source: InformerStates) -> None:
        with self._lock:
            self._sources.append(source)

    def remove(self, source: InformerStates) -> None:
        with self._lock:
            if source in self._sources:
                self._sources.remove(source)

    def collect(self) -> Iterator[Metric]:
        objects = GaugeMetricFamily("cozygpu_cache_objects", "Objects in the informer's store.", labels=["kind"])
        synced = GaugeMetricFamily("cozygpu_cache_synced", "1 once the informer's first list is stored.",
                                   labels=["kind"])
        served = GaugeMetricFamily("cozygpu_cache_served",
                                   "1 when the API server serves the kind, 0 when not, -1 while unknown.",
                                   labels=["kind"])
        with self._lock:
            sources = list(self._sources)
        for source in sources:
            for kind, count, is_synced, is_served in source():
                objects.add_metric([kind], count)
                synced.add_metric([kind], 1 if is_synced else 0)
                served.add_metric([kind], -1 if is_served is None else int(is_served))
        yield objects
        yield synced
        yield served


class CacheMetrics:
    """One set of cache collectors in one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.events = Counter("cozygpu_cache_events", "Watch events applied to the store.",
                              ["kind", "type"], registry=registry)
        self.watch_restarts = Counter("cozygpu_cache_watch_restarts",
                                      "Watch streams started again from the last resourceVersion or after a relist.",
                                      ["kind", "reason"], registry=registry)
        self.relists = Counter("cozygpu_cache_relists", "Full lists that replaced a store's content.",
                               ["kind", "reason"], registry=registry)
        self.list_seconds = Histogram("cozygpu_cache_list_seconds", "Time to list a kind (all pages).", ["kind"],
                                      buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60), registry=registry)
        self.states = _StateCollector()
        registry.register(self.states)


_default: CacheMetrics | None = None
_default_lock = threading.Lock()


def default_metrics() -> CacheMetrics:
    """The process-wide collectors, in prometheus-client's default registry."""
    global _default
    with _default_lock:
        if _default is None:
            _default = CacheMetrics(REGISTRY)
        return _default
