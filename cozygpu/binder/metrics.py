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
    cozygpu_binder_read_model_rebuilds_total{reason} the process's read model (the webhooks' too) built again from
                                                     the stores, by why (a store listed again, a namespace, ...)

The gauges follow each reports pass's snapshot (the view the pass decided on,
so they trail its own writes by one pass) and only the leader's; a replica
that stops leading keeps its last values, so a reader joins them with
``cozygpu_leader_is_leader == 1``. The per-class and per-device gauges are set
by the pass; the per-node families (thousands of series at a fleet's size) are
rendered from the pass's snapshot when ``/metrics`` is scraped, off the event
loop and by ``PerNodeUnits`` itself, each node's lines made again only when its
figures moved; so a pass over a fleet whose reports all moved sets nothing per
node (a snapshot never changes once made).
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Final

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from cozygpu.base import exposition
from cozygpu.binder.reports import class_status
from cozygpu.model.snapshot import Changes, NodeCapacity, Phase, Snapshot

#: Seconds; the target is an answer within 50 ms at the 99th percentile.
_LATENCY_BUCKETS: Final = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@attrs.frozen
class BinderMetrics:
    decisions: Counter
    conflicts: Counter
    answer_latency: Histogram
    detaches: Counter
    class_units: Gauge
    devices: Gauge
    drift: Counter
    events_dropped: Counter
    rebuilds: Counter
    #: Stopped holds a plan moved to make room for an order no node had room for (R-BIND-11).
    compaction_moves: Counter
    #: The per-node families, rendered from the last snapshot when scraped (served beside the registry).
    per_node: PerNodeUnits
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
            devices=Gauge("cozygpu_binder_devices", "GPUDevices per class and phase (Pending, Bound, Lost)",
                          ("class", "phase"), registry=registry),
            drift=Counter("cozygpu_read_model_drift", "Checks that found the live read model off a build from "
                          "the stores (each repaired by a rebuild)", registry=registry),
            events_dropped=Counter("cozygpu_binder_events_dropped", "Events about GPUDevices not sent (best "
                                   "effort, off the placement path): queue full, refused, or the term ended",
                                   ("reason",), registry=registry),
            rebuilds=Counter("cozygpu_binder_read_model_rebuilds", "The binder's read model built again from the "
                             "stores (in slices), by why", ("reason",), registry=registry),
            compaction_moves=Counter("cozygpu_binder_compaction_moves", "Stopped holds moved to make room for an "
                                     "order no node had room for (R-BIND-11), by the plans written",
                                     registry=registry),
            per_node=PerNodeUnits(),
        )

    def _moved(self, group: str, *maps: object) -> bool:
        """Whether any of ``maps`` is another object than the one ``group`` was last set from (and note it)."""
        if self._set_from.get(group) is not None and all(
                a is b for a, b in zip(self._set_from[group], maps, strict=True)):
            return False
        self._set_from[group] = maps
        return True

    def observe_units(self, snapshot: Snapshot) -> None:
        """Follow a reports pass's snapshot; series of gone classes and nodes are dropped.

        The per-class group is set again only when a snapshot map it reads changed, the device counts
        only for the devices the model's change log names since the last snapshot, and the per-node
        families are only pointed at this snapshot: after a Node label, one order or a fleet's reports
        refreshed, nothing of the fleet is walked here.
        """
        last = self._units_from[0] if self._units_from else None
        changes = snapshot.changes_since(last) if last is not None else None
        self._units_from[:] = [snapshot]
        self.per_node.snapshot = snapshot
        if self._moved("classes", snapshot.classes, snapshot.availability, snapshot.devices, snapshot.capacity):
            self.class_units.clear()
            for name, gpu_class in snapshot.classes.items():
                status = class_status(snapshot, gpu_class)
                for state in ("units", "held", "free"):
                    self.class_units.labels(name, state).set(status[state])
        if self._moved("devices", snapshot.devices, snapshot.classes):
            self._count_devices(snapshot, last, changes)

    def _count_devices(self, snapshot: Snapshot, last: Snapshot | None, changes: Changes | None) -> None:
        counts = self._device_counts
        if last is None or changes is None:
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
                if each is not Phase.RELEASED:  # out of the read model: never counted here
                    counts.setdefault((name, each.value), 0)
        for (name, phase), count in counts.items():
            if count or name in snapshot.classes:
                self.devices.labels(name, phase).set(count)


class PerNodeUnits:
    """``cozygpu_binder_node_units`` and ``cozygpu_binder_node_report_timestamp_seconds``, from a snapshot.

    Not a collector of the registry: ``exposition()`` renders both families in the text format
    (``base.exposition``), and the ``/metrics`` handler serves it after the registry's. The library took
    0.18 s a scrape for the four series per node of 5,000 nodes (``bench/bench_scrape.py``). Here each
    node's lines are kept with the figures they say, and made again only when those moved (a report's
    timestamp, a hold).

    ``snapshot`` is the last one a reports pass decided on (set on the event loop); before the first,
    both families are empty. Safe to call from two scrapes' threads at once.
    """

    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None
        self._lock = threading.Lock()
        #: Node -> (its entries when rendered, their lines); and the same for its report's timestamp.
        self._units: dict[str, tuple[tuple[tuple[str, NodeCapacity], ...], bytes]] = {}
        self._reported: dict[str, tuple[datetime | None, bytes]] = {}

    def exposition(self) -> bytes:
        """Both families of the current snapshot, in the Prometheus text format (version 0.0.4)."""
        snapshot = self.snapshot  # one snapshot for the whole scrape: it never changes once made
        with self._lock:
            units: dict[str, tuple[tuple[tuple[str, NodeCapacity], ...], bytes]] = {}
            reported: dict[str, tuple[datetime | None, bytes]] = {}
            if snapshot is not None:
                for node, by_name in snapshot.capacity.items():
                    entries = tuple(by_name.items())
                    kept = self._units.get(node)
                    units[node] = kept if kept is not None and kept[0] == entries else (
                        entries, _units_lines(node, entries))
                for node, inventory in snapshot.inventories.items():
                    stamp = self._reported.get(node)
                    reported[node] = stamp if stamp is not None and stamp[0] == inventory.last_report else (
                        inventory.last_report, _reported_line(node, inventory.last_report))
            self._units, self._reported = units, reported
        return b"".join((_UNITS_HEADER, *(lines for _, lines in units.values()),
                         _REPORTED_HEADER, *(line for _, line in reported.values())))


_UNITS_HEADER: Final = exposition.header(
    "cozygpu_binder_node_units", "Units per node and resource name: served, held, free", "gauge")
_REPORTED_HEADER: Final = exposition.header(
    "cozygpu_binder_node_report_timestamp_seconds",
    "When each GPUNode's agent last reported (Unix time; 0 when it never did)", "gauge")


def _units_lines(node: str, entries: tuple[tuple[str, NodeCapacity], ...]) -> bytes:
    lines = []
    for resource, entry in entries:
        for state, value in (("served", entry.served), ("held", entry.held), ("free", max(entry.room, 0))):
            pairs = exposition.labels(("node", node), ("resource", resource), ("state", state))
            lines.append(f"cozygpu_binder_node_units{pairs} {exposition.number(value)}\n")
    return "".join(lines).encode()


def _reported_line(node: str, last_report: datetime | None) -> bytes:
    stamp = last_report.timestamp() if last_report else 0.0
    pairs = exposition.labels(("node", node))
    return f"cozygpu_binder_node_report_timestamp_seconds{pairs} {exposition.number(stamp)}\n".encode()
