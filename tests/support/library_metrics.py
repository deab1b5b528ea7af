"""The per-node and ledger families as prometheus_client renders them, from a snapshot.

The reference the project's own text rendering (``base.exposition``) must read
as, through Prometheus's parser, in the tests; and, in the benches, the way
those families were served before, timed beside ours.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from cozygpu.model import ledger
from cozygpu.model.snapshot import Snapshot


class LibraryNodeFamilies:
    """``cozygpu_binder_node_units`` and ``cozygpu_binder_node_report_timestamp_seconds`` of ``snapshot``."""

    def __init__(self, snapshot: Snapshot | None = None) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        units = GaugeMetricFamily("cozygpu_binder_node_units", "Units per node and resource name: served, held, "
                                  "free", labels=("node", "resource", "state"))
        reported = GaugeMetricFamily("cozygpu_binder_node_report_timestamp_seconds", "When each GPUNode's agent "
                                     "last reported (Unix time; 0 when it never did)", labels=("node",))
        snapshot = self.snapshot
        if snapshot is not None:
            for node, by_name in snapshot.capacity.items():
                for resource, entry in by_name.items():
                    for state, value in (("served", entry.served), ("held", entry.held),
                                         ("free", max(entry.room, 0))):
                        units.add_metric((node, resource, state), value)
            for node, inventory in snapshot.inventories.items():
                reported.add_metric((node,), inventory.last_report.timestamp() if inventory.last_report else 0.0)
        yield units
        yield reported


class LibraryLedgerFamilies:
    """``cozygpu_tenant_gpu_units`` and ``cozygpu_hold_unit_seconds`` of ``snapshot`` at ``now``."""

    def __init__(self, snapshot: Snapshot, now: datetime) -> None:
        self.snapshot, self.now = snapshot, now

    def collect(self) -> Iterator[Metric]:
        units = GaugeMetricFamily("cozygpu_tenant_gpu_units", "GPU units per tenant namespace and class",
                                  labels=("namespace", "class", "state"))
        seconds = CounterMetricFamily("cozygpu_hold_unit_seconds", "Unit-seconds each hold has held its units and "
                                      "left them idle", labels=("namespace", "class", "gpudevice", "state"))
        holds = list(ledger.figures(self.snapshot, self.now))
        for (namespace, class_name), figures in sorted(ledger.by_tenant(iter(holds)).items()):
            for state, value in (("held", figures.held), ("running", figures.running), ("idle", figures.idle)):
                units.add_metric((namespace, class_name, state), value)
        for hold in holds:
            seconds.add_metric((hold.namespace, hold.class_name, hold.name, "held"), hold.held_unit_seconds)
            seconds.add_metric((hold.namespace, hold.class_name, hold.name, "idle"), hold.idle_unit_seconds)
        yield units
        yield seconds
