"""The model's tables, kept up to date change by change: one object's contribution routed to the parts.

Contract: pure; ``now`` is passed in and decides which agent reports are fresh and which launcher windows
are open. One derivation: ``update`` takes a changed object's old contribution away and adds its new one,
then refreshes what that touched; a from-scratch build is the same applied to an empty model (every
object's contribution added, then every node it touched refreshed).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from cozygpu.model import capacity as cap
from cozygpu.model.changelog import ChangeLog
from cozygpu.model.derive.contributions import Parts
from cozygpu.model.derive.shared import STEP, Stamp, drain, frozen
from cozygpu.model.snapshot import (
    DeviceKey,
    DeviceView,
    DraGroup,
    GPUClassView,
    NamespaceView,
    NodeInventory,
    NodeView,
    PermittedHostDevices,
    PodView,
    Snapshot,
    VmiKey,
    VMIView,
    touch,
)

#: ``update``'s ``permitted`` when KubeVirt's table did not change.
KEEP = object()


class ModelTables:
    """The Snapshot of a set of views, kept up to date change by change (the binder's, every pass).

    ``rebuild`` derives everything from every view; ``update`` takes what changed since (see there) and
    re-derives only what it touches, each touched node, device and VMI logged. A class that sells DRA units
    (before or after its change) is a ``rebuild``: the DRA offers are derived from the classes. Device index
    tuples are sorted by key. Each update hands out a new Snapshot: the maps it shares with earlier ones are
    ``CowMap``s, patched without being copied, so an earlier Snapshot never changes under its reader.
    """

    def __init__(
        self, *, hoster_names: Iterable[str] = (), report_stale_after: timedelta = cap.DEFAULT_REPORT_STALE_AFTER,
        launcher_grace: timedelta = cap.DEFAULT_LAUNCHER_GRACE,
    ) -> None:
        self._hoster = tuple(hoster_names)
        self._stale_after = report_stale_after
        self._grace = launcher_grace
        self._snapshot: Snapshot | None = None
        self._stamp = Stamp()
        self._dra_problems: dict[str, tuple[str, ...]] = {}
        self._parts = self._empty()

    def _empty(self, classes: Iterable[GPUClassView] = (), nodes: Iterable[NodeView] = (),
               vmis: Iterable[VMIView] = (), namespaces: Iterable[NamespaceView] = ()) -> Parts:
        return Parts(stamp=self._stamp, hoster=self._hoster, stale_after=self._stale_after,
                     launcher_grace=self._grace, classes=classes, nodes=nodes, vmis=vmis, namespaces=namespaces)

    @property
    def current(self) -> Snapshot | None:
        return self._snapshot

    def needs_rebuild(self, now: datetime) -> bool:
        """No snapshot yet (a report turning stale and a launcher window closing are ``update``s)."""
        return self._snapshot is None

    def rebuild(
        self,
        *,
        now: datetime,
        classes: Iterable[GPUClassView],
        devices: Iterable[DeviceView],
        nodes: Iterable[NodeView],
        inventories: Iterable[NodeInventory],
        pods: Iterable[PodView],
        vmis: Iterable[VMIView],
        namespaces: Iterable[NamespaceView],
        quotas: Mapping[str, Mapping[str, object]] | None = None,
        permitted: PermittedHostDevices | None = None,
        dra: Mapping[str, Mapping[str, int]] | None = None,
        dra_raw: Mapping[str, Mapping[str, int]] | None = None,
        dra_problems: Mapping[str, tuple[str, ...]] | None = None,
        dra_groups: Mapping[str, Mapping[str, tuple[DraGroup, ...]]] | None = None,
    ) -> Snapshot:
        """Everything derived from these views, in one go (``rebuilding`` is the same in steps)."""
        return drain(self.rebuilding(now=now, classes=classes, devices=devices, nodes=nodes,
                                      inventories=inventories, pods=pods, vmis=vmis, namespaces=namespaces,
                                      quotas=quotas, permitted=permitted, dra=dra, dra_raw=dra_raw,
                                      dra_problems=dra_problems, dra_groups=dra_groups))

    def rebuilding(
        self,
        *,
        now: datetime,
        classes: Iterable[GPUClassView],
        devices: Iterable[DeviceView],
        nodes: Iterable[NodeView],
        inventories: Iterable[NodeInventory],
        pods: Iterable[PodView],
        vmis: Iterable[VMIView],
        namespaces: Iterable[NamespaceView],
        quotas: Mapping[str, Mapping[str, object]] | None = None,
        permitted: PermittedHostDevices | None = None,
        dra: Mapping[str, Mapping[str, int]] | None = None,
        dra_raw: Mapping[str, Mapping[str, int]] | None = None,
        dra_problems: Mapping[str, tuple[str, ...]] | None = None,
        dra_groups: Mapping[str, Mapping[str, tuple[DraGroup, ...]]] | None = None,
        everything: bool = False,
    ) -> Generator[None, None, Snapshot]:
        """``rebuild`` as steps: it yields after every ``STEP`` items derived, so a caller on an event loop
        can let the loop go between them; its value is the Snapshot. Nothing but the caller may touch the
        model until it is done (``current`` stays the last snapshot meanwhile). ``dra``: node -> the
        units DRA-sourced offers serve there, by resource name (``cap.node_capacity``); ``dra_raw``:
        namespace -> the units of DRA-sourced names its own claims hold (raw use, counted against its budgets
        as a raw pod's; not on the node: the node's DRA units leave those devices out already).

        The change log names what differs from the model before (a relist or a drift repair changes little,
        and the next cycle plans only that); with ``everything``, or on a first build, it says anything may
        have changed (``Snapshot.changes_since`` is None)."""
        stamp = self._stamp
        stamp.generation += 1
        before, kept = (None if everything else self._snapshot), stamp.log
        if before is None:
            kept.rebuilt(stamp.generation)
        else:
            stamp.log = ChangeLog()  # the derivation's own touches: what differs from ``before`` is logged after
        try:
            # The empty model with the classes, Node views, VMIs and namespaces; then every contribution added,
            # as ``update`` adds a new object's.
            self._parts = parts = self._empty(classes, nodes, vmis, namespaces)
            parts.now = now
            for i, inventory in enumerate(inventories, 1):
                parts.report(inventory.name, inventory, now)
                if i % STEP == 0:
                    yield
            parts.put_permitted(permitted)
            parts.names.settle()
            self._dra_problems = dict(dra_problems or {})
            parts.usage.budgeted(quotas or {}, parts.names.names, stamp)
            yield
            for name, served in (dra or {}).items():
                parts.ledger.dra(name, served)
            for name, groups in (dra_groups or {}).items():
                parts.ledger.groups(name, groups)
            for i, device in enumerate(devices, 1):
                parts.put_device(device.key, device, set())
                if i % STEP == 0:
                    yield
            for i, pod in enumerate(pods, 1):
                parts.add_pod(pod)
                if i % STEP == 0:
                    yield
            for namespace, amounts in (dra_raw or {}).items():
                parts.usage.claimed(namespace, amounts)
            yield
            yield from parts.settling()
        finally:
            stamp.log = kept
        after = self._emit(now)
        if before is not None:
            try:
                yield from logged_differences(before, after, stamp)
            except BaseException:  # cut short: a reader must judge everything again
                kept.rebuilt(stamp.generation)
                raise
        return after

    def update(self, *, now: datetime, devices: Mapping[DeviceKey, DeviceView | None],
               vmis: Mapping[VmiKey, VMIView | None] | None = None,
               inventories: Mapping[str, NodeInventory | None] | None = None,
               nodes: Mapping[str, NodeView | None] | None = None,
               pods: Mapping[tuple[str, str], PodView | None] | None = None,
               dra: Mapping[str, Mapping[str, int]] | None = None,
               dra_raw: Mapping[str, Mapping[str, int]] | None = None,
               dra_groups: Mapping[str, Mapping[str, tuple[DraGroup, ...]]] | None = None,
               quotas: Mapping[str, Mapping[str, object] | None] | None = None,
               classes: Mapping[str, GPUClassView | None] | None = None,
               namespaces: Mapping[str, NamespaceView | None] | None = None,
               permitted: PermittedHostDevices | object | None = KEEP) -> Snapshot:
        """The Snapshot after these changes (each a view, or None when the object is gone).

        - A device, a pod (by namespace and name; None also when no longer one the snapshot holds), a
          node's DRA units or groups, a namespace's DRA raw use: the old contribution taken away, the new
          one added. A pod change must not change which pods are launchers (that is the VMIs').
        - A VMI: its view, and its launchers' usage judged again with the launcher index patched (its
          active pods may change when which pods the snapshot holds stays the same: the caller's to know);
          a pod that two VMIs list takes a rebuild (``ValueError``).
        - A report (None: its GPUNode gone): that node's units, time and freshness, and the names it
          declares; a Node's view: which classes may use that node.
        - A class: replaced; its devices added again under it when its resource name moved; its
          availability made again over the nodes serving its name, those nodes and the name logged. A
          class that sells DRA units before or after is a ``ValueError`` before anything moved.
        - A tenant's ``tenant-quota`` ``spec.hard`` (None: gone): its budgets, every subtree's usage
          logged (a budget caps a whole subtree). A namespace: the tree. ``permitted``: KubeVirt's table.
        - When effective names come or go (a report's, a class's, the table's), the pods asking for them
          and the budgets naming them are derived again, and the names logged.
        """
        if self._snapshot is None:
            raise RuntimeError("update before the first rebuild")
        parts = self._parts
        for name, gpu_class in (classes or {}).items():
            before = parts.classes.classes.get(name)
            if (before is not None and before.dra is not None) or (gpu_class is not None and gpu_class.dra is not None):
                raise ValueError(f"GPUClass {name}: sells DRA units; rebuild")
        parts.now = now
        stamp, ledger, launching = self._stamp, parts.ledger, parts.launching
        stamp.generation += 1
        generation, log = stamp.generation, stamp.log
        for name, served in (dra or {}).items():
            ledger.dra(name, served)
        for name, groups in (dra_groups or {}).items():
            ledger.groups(name, groups)
        for name, inventory in (inventories or {}).items():
            parts.report(name, inventory, now)
        ledger.expire(now)
        attached_vmis: set[VmiKey] = set()
        for name, gpu_class in (classes or {}).items():
            parts.put_class(name, gpu_class, attached_vmis)
        if permitted is not KEEP:
            assert permitted is None or isinstance(permitted, PermittedHostDevices)
            parts.put_permitted(permitted)
        for name, namespace_view in (namespaces or {}).items():
            parts.usage.namespace(name, namespace_view)
            log.usage = generation  # the tree a budget caps
        parts.renamed()
        for pod in launching.due(now):  # launcher windows closed: their GPUs are raw use now (R-MOD-7)
            parts.pod(pod, -1)
            parts.pod(pod, +1)
            if pod.claims_vmi is not None:
                touch(log.vmis, (pod.namespace, pod.claims_vmi[0]), generation)
        for name, node_view in (nodes or {}).items():
            parts.classes.node_view(name, node_view)
            touch(log.nodes, name, generation)
        for key, pod_view in (pods or {}).items():
            uid = launching.pod_keys.get(key)
            old = launching.pods[uid] if uid is not None else None
            if old is not None:
                parts.pod(old, -1)
                launching.drop(old)
            if pod_view is not None:
                parts.add_pod(pod_view)
            # A VMI's sets are judged on its launchers, and on the pods that claim it (seen after its end).
            for seen in (p for p in (old, pod_view) if p is not None):
                claimed = {(seen.namespace, seen.claims_vmi[0])} if seen.claims_vmi is not None else set()
                for vmi_of in claimed | launching.listing.get(seen.uid, set()):
                    touch(log.vmis, vmi_of, generation)
        for vmi_key, view in (vmis or {}).items():
            launchers = launching.listed(vmi_key, view)
            for launcher in launchers:
                parts.pod(launcher, -1)
            launching.put_vmi(vmi_key, view)
            touch(log.vmis, vmi_key, generation)
            for launcher in launchers:
                parts.pod(launcher, +1)
        for namespace, amounts in (dra_raw or {}).items():
            parts.usage.claimed(namespace, amounts)
        if quotas:
            parts.usage.budgeted(quotas, parts.names.names, stamp)
        for key, device in devices.items():
            touch(log.devices, key, generation)
            parts.put_device(key, device, attached_vmis)
        parts.launchers_of(attached_vmis)
        drain(parts.settling())
        for name in sorted(nodes or ()):
            parts.classes.eligibility(name, ledger.capacity.get(name, {}), ledger.serving_of)
        if classes:
            parts.classes.remake(sorted(classes), ledger.capacity, ledger.serving_of)
        return self._emit(now)

    def _emit(self, now: datetime) -> Snapshot:
        parts = self._parts
        devices, ledger, usage, launching = parts.devices, parts.ledger, parts.usage, parts.launching
        ledger.settle()
        parts.classes.settle()
        for part in (devices, usage, launching):
            part.share()
        self._snapshot = Snapshot(
            now=now,
            classes=parts.classes.classes,
            devices=frozen(devices.devices),
            nodes=frozen(parts.classes.nodes),
            inventories=frozen(ledger.inventories),
            pods=frozen(launching.pods),
            vmis=frozen(launching.vmis),
            namespaces=frozen(usage.namespaces),
            budgets=usage.budgets,
            effective_names=parts.names.names,
            permitted=parts.permitted,
            devices_by_node=frozen(devices.by_node),
            devices_by_vmi=frozen(devices.by_vmi),
            launchers=launching.launchers,
            children=usage.children,
            dra_problems=self._dra_problems,
            subtree_usage=frozen(usage.subtree),
            pending_usage=frozen(usage.pending),
            capacity=frozen(ledger.capacity),
            availability=frozen(parts.classes.availability),
            serving=frozen(ledger.serving),
            window_closes=min(launching.window_closes.values(), default=None),
            over_capacity=ledger.over,
            held_by_class=frozen(devices.class_held),
            stopped_hold_sizes=frozen(devices.stopped_sizes),
            rooms=frozen(ledger.rooms),
            dra_groups=frozen(ledger.dra_groups),
            released=frozen(devices.released),
            unsettled=frozenset(devices.unsettled),
            unsettled_by_name=devices.unsettled_names(),
            asking=frozenset(devices.asking),
            waiting=frozenset(devices.waiting),
            generation=self._stamp.generation,
            log=self._stamp.log,
        )
        return self._snapshot


def logged_differences(before: Snapshot, after: Snapshot, stamp: Stamp) -> Generator[None, None, None]:
    """A rebuild's change log: what differs between the model before it and after it, touched as an update
    would have touched it (a relist or a drift repair changes little, and the next cycle plans only that);
    in steps of ``STEP`` keys."""
    log, generation = stamp.log, stamp.generation
    targets: tuple[tuple[str, dict[Any, int]], ...] = (
        ("devices", log.devices), ("released", log.devices), ("nodes", log.nodes), ("inventories", log.nodes),
        ("capacity", log.nodes), ("dra_groups", log.nodes), ("vmis", log.vmis), ("rooms", log.names),
        ("serving", log.names))
    for field, target in targets:
        old, new = getattr(before, field), getattr(after, field)
        for i, key in enumerate(old.keys() | new.keys(), 1):
            if old.get(key) != new.get(key):
                touch(target, key, generation)
            if i % STEP == 0:
                yield
    for i, uid in enumerate(before.pods.keys() | after.pods.keys(), 1):  # a launcher's, or a claimant's VMI
        pods = [p for p in (before.pods.get(uid), after.pods.get(uid)) if p is not None]
        if len(pods) == 1 or pods[0] != pods[1]:
            for snapshot in (before, after):
                vmi = snapshot.launchers.get(uid)
                if vmi is not None:
                    touch(log.vmis, vmi, generation)
            for pod in pods:
                if pod.claims_vmi is not None:
                    touch(log.vmis, (pod.namespace, pod.claims_vmi[0]), generation)
        if i % STEP == 0:
            yield
    names = set(before.effective_names ^ after.effective_names)
    permission_moved = before.permitted != after.permitted
    for class_name in before.classes.keys() | after.classes.keys():  # availability is by class, of these
        old_class, new_class = before.classes.get(class_name), after.classes.get(class_name)
        if (old_class != new_class or permission_moved
                or before.availability.get(class_name) != after.availability.get(class_name)):
            for gpu_class in (old_class, new_class):
                if gpu_class is not None:
                    names.add(gpu_class.resource_name)
                    if old_class != new_class:  # who it may use: the sets on its nodes, judged again
                        for node in after.serving.get(gpu_class.resource_name, ()):
                            touch(log.nodes, node, generation)
    for name in sorted(names):
        touch(log.names, name, generation)
    yield
    if any(getattr(before, field) != getattr(after, field)
           for field in ("subtree_usage", "pending_usage", "budgets", "children", "namespaces")):
        log.usage = generation
