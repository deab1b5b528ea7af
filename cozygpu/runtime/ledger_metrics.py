"""The hold ledger's metrics (R-LEDGER-1), on every replica, from its own read model.

    cozygpu_tenant_gpu_units{namespace, class, state}                 units held, running (a VM runs on them)
                                                                      and idle, per tenant namespace and class
    cozygpu_hold_unit_seconds_total{namespace, class, gpudevice, state}  unit-seconds each hold has held and
                                                                      left idle (state: held, idle)

Why every replica: the figures are derived from the holds' status
timestamps (``model.ledger``) and the wall clock, never from a process's
memory, so every replica exports the same values, before and after a leader
change, and a reader deduplicates with ``max without (instance, pod)``. A
hold's counter is monotonic (``heldSince`` never moves; idle time only adds
up); it ends with the hold, so a tenant's GPU-hours are
``sum by (namespace, class) (increase(...))`` over the holds (the chart's
recording rules). Series that name tenants are served only over the
authenticated HTTPS endpoint (R-LEDGER-3).

A collector: the scrape handler first brings the replica's webhook model up
to date on the event loop (``refresh``), then the series are made from that
snapshot on the scrape's thread (it never changes once made).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from cozygpu.admission.view import NotReady, SnapshotSource
from cozygpu.base.clock import Clock, LoopClock
from cozygpu.base.logging import get_logger
from cozygpu.model import ledger
from cozygpu.model.snapshot import Snapshot

log = get_logger("cozygpu.ledger")


class LedgerMetrics:
    """The collector (see the module docstring); empty until a first refresh found the model ready."""

    def __init__(self, source: Callable[[], Awaitable[Snapshot]], *, clock: Clock | None = None) -> None:
        #: The replica's model now (``SnapshotSource.snapshot``); ``NotReady`` while its caches are not.
        self._source = source
        self._clock: Clock = clock if clock is not None else LoopClock()
        self.snapshot: Snapshot | None = None

    @classmethod
    def on(cls, registry: CollectorRegistry, source: SnapshotSource, *, clock: Clock | None = None) -> LedgerMetrics:
        collector = cls(source.snapshot, clock=clock)
        registry.register(collector)
        return collector

    async def refresh(self) -> None:
        """The model now (before a scrape); the last one kept while the replica's caches are not ready."""
        try:
            self.snapshot = await self._source()
        except NotReady as why:
            log.debug("ledger metrics from the last model: this replica's cache is not ready", why=str(why))

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        units, seconds = self._families()
        snapshot = self.snapshot
        if snapshot is not None:
            holds = list(ledger.figures(snapshot, self._clock.wall()))
            for (namespace, class_name), figures in sorted(ledger.by_tenant(iter(holds)).items()):
                units.add_metric((namespace, class_name, "held"), figures.held)
                units.add_metric((namespace, class_name, "running"), figures.running)
                units.add_metric((namespace, class_name, "idle"), figures.idle)
            for hold in holds:
                seconds.add_metric((hold.namespace, hold.class_name, hold.name, "held"), hold.held_unit_seconds)
                seconds.add_metric((hold.namespace, hold.class_name, hold.name, "idle"), hold.idle_unit_seconds)
        yield units
        yield seconds

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, CounterMetricFamily]:
        return (GaugeMetricFamily("cozygpu_tenant_gpu_units", "GPU units per tenant namespace and class: held "
                                  "(Bound), running (a VM runs on them), idle (held, no VM runs on them)",
                                  labels=("namespace", "class", "state")),
                CounterMetricFamily("cozygpu_hold_unit_seconds", "Unit-seconds each hold has held its units and "
                                    "left them idle, from its status timestamps (every replica exports the same "
                                    "values: deduplicate with max without (instance, pod))",
                                    labels=("namespace", "class", "gpudevice", "state")))
