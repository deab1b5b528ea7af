"""The binder's figures; pass durations and outcomes are the pass driver's (``loop="binder"``).

    cozygpu_binder_decisions_total{lane, action}     actions planned (Bind, MarkLost, KeepPending, Stay, Answer)
    cozygpu_binder_conflicts_total                   sets dropped on a resourceVersion conflict or a vanished device
    cozygpu_binder_answer_latency_seconds            a bind request first seen in the cache → its answer written
    cozygpu_binder_detaches_total{reason, deleted}   attachments cleared (or template devices deleted)
    cozygpu_binder_class_units{class, state}         held and free units per class (state: held, free, units)
    cozygpu_binder_node_units{node, resource, state} served, held and free units per node and resource name
    cozygpu_binder_devices{class, phase}             GPUDevices per class and phase (Pending, Bound, Lost)
    cozygpu_binder_node_report_timestamp_seconds{node}  when each GPUNode's agent last reported (Unix time)
    cozygpu_binder_events_dropped_total{reason}      Events about devices not sent: the queue was full, the
                                                     server refused one, or the term ended first
    cozygpu_read_model_drift_total                   checks that found the live read model off a build from the
                                                     stores (each repaired by a rebuild; expected to stay 0)

The gauges are set from each reports pass's snapshot (the view the pass decided
on, so they trail its own writes by one pass) and only by the leader; a
replica that stops leading keeps its last values, so a reader joins them with
``cozygpu_leader_is_leader == 1``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Final

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from cozygpu.binder.reports import class_status
from cozygpu.model.snapshot import Changes, Phase, Snapshot

#: Seconds; the target is an answer within 50 ms at the 99th percentile.
_LATENCY_BUCKETS: Final = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@attrs.frozen
class BinderMetrics:
    decisions: Counter
    conflicts: Counter
    answer_latency: Histogram
    detaches: Counter
    class_units: Gauge
    node_units: Gauge
    devices: Gauge
    report_time: Gauge
    drift: Counter
    events_dropped: Counter
    #: What each per-node series was last set to: a pass sets only the series whose value moved.
    _node_values: dict[str, dict[tuple[str, ...], float]] = attrs.field(factory=dict, init=False, eq=False)
    _report_values: dict[str, dict[tuple[str, ...], float]] = attrs.field(factory=dict, init=False, eq=False)
    #: Devices by (class, phase), kept from the change log between snapshots of one model.
    _device_counts: dict[tuple[str, str], int] = attrs.field(factory=dict, init=False, eq=False)
    #: The snapshot the gauges were last set from: the model's change log says which nodes and devices moved.
    _units_from: list[Snapshot] = attrs.field(factory=list, init=False, eq=False)
    #: The snapshot maps each group of gauges was last set from: a snapshot hands out a new top-level map
    #: only where something in it changed, so a group whose maps are the very same objects is skipped.
    _set_from: dict[str, tuple[object, ...]] = attrs.field(factory=dict, init=False, eq=False)

    @classmethod
    def on(cls, registry: CollectorRegistry) -> BinderMetrics:
        return cls(
            decisions=Counter("cozygpu_binder_decisions", "Actions the binder planned, by lane and action",
                              ("lane", "action"), registry=registry),
            conflicts=Counter("cozygpu_binder_conflicts", "Sets dropped on a resourceVersion conflict or a "
                              "vanished device (requeued, never retried blindly)", registry=registry),
            answer_latency=Histogram("cozygpu_binder_answer_latency_seconds", "From a bind request first seen "
                                     "in the cache to its answer written", buckets=_LATENCY_BUCKETS,
                                     registry=registry),
            detaches=Counter("cozygpu_binder_detaches", "Attachments cleared, or template devices deleted",
                             ("reason", "deleted"), registry=registry),
            class_units=Gauge("cozygpu_binder_class_units", "Units per class: served by eligible nodes, held, "
                              "free", ("class", "state"), registry=registry),
            node_units=Gauge("cozygpu_binder_node_units", "Units per node and resource name: served, held, free",
                             ("node", "resource", "state"), registry=registry),
            devices=Gauge("cozygpu_binder_devices", "GPUDevices per class and phase (Pending, Bound, Lost)",
                          ("class", "phase"), registry=registry),
            report_time=Gauge("cozygpu_binder_node_report_timestamp_seconds", "When each GPUNode's agent last "
                              "reported (Unix time; 0 when it never did)", ("node",), registry=registry),
            drift=Counter("cozygpu_read_model_drift", "Checks that found the live read model off a build from "
                          "the stores (each repaired by a rebuild)", registry=registry),
            events_dropped=Counter("cozygpu_binder_events_dropped", "Events about GPUDevices not sent (best "
                                   "effort, off the placement path): queue full, refused, or the term ended",
                                   ("reason",), registry=registry),
        )

    def _moved(self, group: str, *maps: object) -> bool:
        """Whether any of ``maps`` is another object than the one ``group`` was last set from (and note it)."""
        if self._set_from.get(group) is not None and all(
                a is b for a, b in zip(self._set_from[group], maps, strict=True)):
            return False
        self._set_from[group] = maps
        return True

    def observe_units(self, snapshot: Snapshot) -> None:
        """Set the unit gauges from a reports pass's snapshot; series of gone classes and nodes are dropped.

        Each group is set again only when a snapshot map it reads changed, and the per-node and per-device
        groups only for the nodes and devices the model's change log names since the last snapshot: after
        a Node label or one order, the gauges of a fleet are not walked again.
        """
        last = self._units_from[0] if self._units_from else None
        changes = snapshot.changes_since(last) if last is not None else None
        self._units_from[:] = [snapshot]
        if self._moved("classes", snapshot.classes, snapshot.availability, snapshot.devices, snapshot.capacity):
            self.class_units.clear()
            for name, gpu_class in snapshot.classes.items():
                status = class_status(snapshot, gpu_class)
                for state in ("units", "held", "free"):
                    self.class_units.labels(name, state).set(status[state])
        scope = changes.nodes if changes is not None else None
        if self._moved("nodes", snapshot.capacity):
            wanted: dict[tuple[str, str, str], float] = {}
            for node in snapshot.capacity if scope is None else scope:
                for resource, entry in snapshot.capacity.get(node, {}).items():
                    wanted[(node, resource, "served")] = entry.served
                    wanted[(node, resource, "held")] = entry.held
                    wanted[(node, resource, "free")] = max(entry.room, 0)
            _sync(self.node_units, self._node_values, wanted, scope)
        if self._moved("devices", snapshot.devices, snapshot.classes):
            self._count_devices(snapshot, last, changes)
        if self._moved("reports", snapshot.inventories):
            reported = {node: (inventory.last_report.timestamp() if inventory.last_report is not None else 0.0)
                        for node in (snapshot.inventories if scope is None else scope)
                        if (inventory := snapshot.inventories.get(node)) is not None}
            _sync(self.report_time, self._report_values, {(node,): value for node, value in reported.items()}, scope)

    def _count_devices(self, snapshot: Snapshot, last: Snapshot | None, changes: Changes | None) -> None:
        counts = self._device_counts
        if last is None or changes is None or snapshot.classes is not last.classes:
            counts.clear()
            for device in snapshot.devices.values():
                key = (device.class_name, device.phase.value)
                counts[key] = counts.get(key, 0) + 1
        else:
            for key in changes.devices:
                for view, sign in ((last.devices.get(key), -1), (snapshot.devices.get(key), +1)):
                    if view is not None:
                        counted = (view.class_name, view.phase.value)
                        counts[counted] = counts.get(counted, 0) + sign
        self.devices.clear()
        for name in snapshot.classes:
            for each in Phase:
                counts.setdefault((name, each.value), 0)
        for (name, phase), count in counts.items():
            if count or name in snapshot.classes:
                self.devices.labels(name, phase).set(count)


def _sync(gauge: Gauge, have: dict[str, dict[tuple[str, ...], float]], wanted: dict[Any, float],
          scope: Collection[str] | None) -> None:
    """Set the series of ``gauge`` whose value moved and drop those not wanted (a thousand nodes: no clear).

    ``have`` holds the series set, by node (their first label); ``scope`` the nodes ``wanted`` covers
    (None: every node), so only their series are looked at.
    """
    for node in list(have) if scope is None else scope:
        series = have.get(node)
        if series is None:
            continue
        for labels in [k for k in series if k not in wanted]:
            gauge.remove(*labels)
            del series[labels]
        if not series:
            del have[node]
    for labels, value in wanted.items():
        series = have.setdefault(labels[0], {})
        if series.get(labels) != value:
            gauge.labels(*labels).set(value)
            series[labels] = value
