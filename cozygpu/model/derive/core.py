"""The model's tables, kept up to date change by change: one object's contribution routed to the parts.

Contract: pure; ``now`` is passed in and decides which agent reports are fresh and which launcher windows
are open. One derivation: ``update`` takes a changed object's old contribution away and adds its new one,
then refreshes what that touched; a from-scratch build is the same applied to an empty model (every
object's contribution added, then every node it touched refreshed).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping
from datetime import datetime, timedelta

from cozygpu.model import capacity as cap
from cozygpu.model.derive.availability import ClassIndex
from cozygpu.model.derive.devices import DeviceIndex, alike
from cozygpu.model.derive.launching import LauncherIndex
from cozygpu.model.derive.nodes import NodeLedger
from cozygpu.model.derive.shared import STEP, Stamp, drain, frozen
from cozygpu.model.derive.usage import TenantUsage
from cozygpu.model.resource_names import effective_names as derive_effective_names
from cozygpu.model.snapshot import (
    DeviceKey,
    DeviceView,
    DraGroup,
    GPUClassView,
    NamespaceView,
    NodeInventory,
    NodeView,
    PermittedHostDevices,
    Phase,
    PodView,
    Snapshot,
    VmiKey,
    VMIView,
    touch,
)


class ModelTables:
    """The Snapshot of a set of views, kept up to date change by change (the binder's, every pass).

    ``rebuild`` derives everything from every view; ``update`` takes what changed since (see there) and
    re-derives only what it touches, each touched node, device and VMI logged. Anything else (a class's
    name or source, a namespace, KubeVirt, a report's new names) is a ``rebuild``. Device index tuples are
    sorted by key. Each update hands out a new Snapshot: the maps it shares with earlier ones are
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
        self._now: datetime | None = None
        self._names: frozenset[str] = frozenset()
        self._permitted: PermittedHostDevices | None = None
        self._dra_problems: dict[str, tuple[str, ...]] = {}
        self._classes = ClassIndex(stamp=self._stamp)
        self._ledger = NodeLedger(self._classes, stamp=self._stamp, stale_after=report_stale_after)
        self._devices = DeviceIndex()
        self._usage = TenantUsage()
        self._launching = LauncherIndex()

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
    ) -> Generator[None, None, Snapshot]:
        """``rebuild`` as steps: it yields after every ``STEP`` items derived, so a caller on an event loop
        can let the loop go between them; its value is the Snapshot. Nothing but the caller may touch the
        model until it is done (``current`` stays the last snapshot meanwhile). ``dra``: node -> the
        units DRA-sourced offers serve there, by resource name (``cap.node_capacity``); ``dra_raw``:
        namespace -> the units of DRA-sourced names its own claims hold (raw use, counted against its budgets
        as a raw pod's; not on the node: the node's DRA units leave those devices out already)."""
        stamp = self._stamp
        stamp.generation += 1
        stamp.log.rebuilt(stamp.generation)
        self._now = now
        # What an update cannot change: the classes, the effective names, the namespaces, the launchers.
        self._classes = ClassIndex(classes, nodes, stamp=stamp)
        dra_names = frozenset(c.resource_name for c in self._classes.classes.values() if c.dra is not None)
        self._ledger = ledger = NodeLedger(self._classes, stamp=stamp, stale_after=self._stale_after,
                                           dra_names=dra_names)
        for i, inventory in enumerate(inventories, 1):
            ledger.report(inventory.name, inventory, now)
            if i % STEP == 0:
                yield
        self._names = derive_effective_names(hoster=self._hoster, classes=self._classes.classes.values(),
                                             inventories=ledger.inventories.values(), permitted=permitted)
        self._permitted = permitted
        self._dra_problems = dict(dra_problems or {})
        self._launching = LauncherIndex(vmis)
        self._usage = TenantUsage(namespaces)
        self._usage.budgeted(quotas or {}, self._names, stamp)
        self._devices = DeviceIndex()
        yield
        # Every contribution added to the empty model, as ``update`` adds a new object's.
        for name, served in (dra or {}).items():
            ledger.dra(name, served)
        for name, groups in (dra_groups or {}).items():
            ledger.groups(name, groups)
        for i, device in enumerate(devices, 1):
            self._put_device(device.key, device, set())
            if i % STEP == 0:
                yield
        for i, pod in enumerate(pods, 1):
            self._add_pod(pod)
            if i % STEP == 0:
                yield
        for namespace, amounts in (dra_raw or {}).items():
            self._usage.claimed(namespace, amounts)
        yield
        yield from self._settling()
        return self._emit(now)

    @staticmethod
    def same_names(before: NodeInventory | None, after: NodeInventory | None) -> bool:
        """A report change ``update`` can take: the node reported before and after, with the same names
        (the effective GPU names, R-MOD-9, follow from them; anything else is a rebuild)."""
        return (before is not None and after is not None and before.resource_names == after.resource_names
                and before.served.keys() == after.served.keys())

    @staticmethod
    def adds_names_only(before: NodeInventory | None, after: NodeInventory | None) -> bool:
        """A report change that drops none of the node's names (it may add some, or keep them all)."""
        return (before is not None and after is not None and before.resource_names <= after.resource_names
                and before.served.keys() <= after.served.keys())

    def takes_report(self, name: str, inventory: NodeInventory) -> bool:
        """Whether ``update`` can take this report of node ``name``: one that keeps its names, or a first
        report, or one that only adds names, whose names are all effective GPU names already (a new node
        of a known kind, or a node's first real report after an empty one: the effective names are a
        union over reports, so they stay what they were)."""
        before = self._ledger.inventories.get(name)
        if before is not None and self.same_names(before, inventory):
            return True
        if before is not None and not self.adds_names_only(before, inventory):
            return False
        return inventory.resource_names <= self._names and inventory.served.keys() <= self._names

    def takes_class(self, gpu_class: GPUClassView) -> bool:
        """Whether ``update`` can take this class: one it holds, that keeps its resource name and sells
        device-plugin units before and after (its selector, tolerations and anything else may change: the
        effective names, the units held and the DRA offers stay what they were)."""
        before = self._classes.classes.get(gpu_class.name)
        return (before is not None and before.resource_name == gpu_class.resource_name
                and before.dra is None and gpu_class.dra is None)

    def update(self, *, now: datetime, devices: Mapping[DeviceKey, DeviceView | None],
               vmis: Mapping[VmiKey, VMIView | None] | None = None,
               inventories: Mapping[str, NodeInventory] | None = None,
               nodes: Mapping[str, NodeView | None] | None = None,
               pods: Mapping[tuple[str, str], PodView | None] | None = None,
               dra: Mapping[str, Mapping[str, int]] | None = None,
               dra_raw: Mapping[str, Mapping[str, int]] | None = None,
               dra_groups: Mapping[str, Mapping[str, tuple[DraGroup, ...]]] | None = None,
               quotas: Mapping[str, Mapping[str, object] | None] | None = None,
               classes: Mapping[str, GPUClassView] | None = None) -> Snapshot:
        """The Snapshot after these device, VMI, report and Node changes (a view, or None when it is gone).

        A VMI change may change its ``active_pods`` (absent counts as none) when
        which pods the snapshot holds stays the same (the caller's to know: the
        pods that start or stop being its launchers ask for extended resources,
        or are gone): their usage is judged again with the launcher index
        patched; a pod that two VMIs list takes a rebuild (``ValueError``). A
        report change must keep the node's names, or only add names already
        known (``takes_report``; a first report too): its units, its time and
        its freshness move that one node's capacity and the availability there
        (otherwise ``ValueError``). A Node's
        view (labels, taints, Ready, cordon) moves only which classes may use
        it: the availability of the classes of the names it serves. A pod
        change (by namespace and name; None when it is gone or no longer one
        the snapshot holds) takes its old contribution away and adds its new
        one; it must not change which pods are launchers (that is the VMIs'). A node's DRA units (by
        resource name; empty when it has none left) move that node's capacity, as a report does; a
        namespace's DRA raw use (empty: none left) replaces what it counted against its budgets. A tenant's
        ``tenant-quota`` ``spec.hard`` (None: gone) replaces its budgets: every unsettled order is judged
        again (the change log's usage), as a budget caps a whole subtree. A class that ``takes_class``
        replaces the one held: its availability is made again over the nodes serving its name, and those
        nodes and the name are logged, so the sets there are judged again (one it no longer tolerates
        loses them); any other class change is a ``ValueError`` before anything moved.
        """
        if self._snapshot is None:
            raise RuntimeError("update before the first rebuild")
        self._now = now
        stamp, ledger, launching = self._stamp, self._ledger, self._launching
        stamp.generation += 1
        generation, log = stamp.generation, stamp.log
        for name, inventory in (inventories or {}).items():
            if not self.takes_report(name, inventory):
                raise ValueError(f"GPUNode {name}: its resource names changed; rebuild")
        for gpu_class in (classes or {}).values():
            if not self.takes_class(gpu_class):
                raise ValueError(f"GPUClass {gpu_class.name}: new, gone, or its resource name or source changed; "
                                 "rebuild")
        for name, served in (dra or {}).items():
            ledger.dra(name, served)
        for name, groups in (dra_groups or {}).items():
            ledger.groups(name, groups)
        for name, inventory in (inventories or {}).items():
            ledger.report(name, inventory, now)
        ledger.expire(now)
        for pod in launching.due(now):  # launcher windows closed: their GPUs are raw use now (R-MOD-7)
            self._pod(pod, -1)
            self._pod(pod, +1)
            if pod.claims_vmi is not None:
                touch(log.vmis, (pod.namespace, pod.claims_vmi[0]), generation)
        for name, node_view in (nodes or {}).items():
            self._classes.node_view(name, node_view)
            touch(log.nodes, name, generation)
        for key, pod_view in (pods or {}).items():
            uid = launching.pod_keys.get(key)
            old = launching.pods[uid] if uid is not None else None
            if old is not None:
                self._pod(old, -1)
                launching.drop(old)
            if pod_view is not None:
                self._add_pod(pod_view)
            # A VMI's sets are judged on its launchers, and on the pods that claim it (seen after its end).
            for seen in (p for p in (old, pod_view) if p is not None):
                claimed = {(seen.namespace, seen.claims_vmi[0])} if seen.claims_vmi is not None else set()
                for vmi_of in claimed | launching.listing.get(seen.uid, set()):
                    touch(log.vmis, vmi_of, generation)
        for vmi_key, view in (vmis or {}).items():
            launchers = launching.listed(vmi_key, view)
            for launcher in launchers:
                self._pod(launcher, -1)
            launching.put_vmi(vmi_key, view)
            touch(log.vmis, vmi_key, generation)
            for launcher in launchers:
                self._pod(launcher, +1)
        for namespace, amounts in (dra_raw or {}).items():
            self._usage.claimed(namespace, amounts)
        if quotas:
            self._usage.budgeted(quotas, self._names, stamp)
        attached_vmis: set[VmiKey] = set()
        for key, device in devices.items():
            touch(log.devices, key, generation)
            self._put_device(key, device, attached_vmis)
        for vmi_key in attached_vmis:  # their launchers' (and claimants') usage depends on the devices attached
            vmi = launching.vmis.get(vmi_key)
            uids = set(vmi.active_pods) if vmi is not None else set()
            for uid in sorted(uids | launching.claimants.get(vmi_key, set())):
                found = launching.pods.get(uid)
                if found is not None:
                    self._pod(found, -1)
                    self._pod(found, +1)
        drain(self._settling())
        for name in sorted(nodes or ()):
            self._classes.eligibility(name, ledger.capacity.get(name, {}), ledger.serving_of)
        if classes:
            self._classes.reclassed(classes, ledger.capacity, ledger.serving_of)
        return self._emit(now)

    def _put_device(self, key: DeviceKey, device: DeviceView | None, attached_vmis: set[VmiKey]) -> None:
        """A device's new view (None: gone): its old contribution away, its new one added; the VMIs it
        was or is attached to go into ``attached_vmis``."""
        old = self._devices.devices.get(key)
        device = self._devices.release(key, device)
        for view in (old, device):
            if view is not None and view.attachment is not None:
                attached_vmis.add((view.namespace, view.attachment.vmi))
        if old is not None and device is not None and alike(old, device):
            # A request, an answer, an attachment's details: the same units, usage and index buckets.
            self._devices.replace(key, device)
            return
        if old is not None:
            self._device(old, -1)
        if device is not None:
            self._device(device, +1)

    def _device(self, device: DeviceView, sign: int) -> None:
        """Add (+1) or take away (-1) everything one device contributes."""
        resource = self._classes.resource_of.get(device.class_name)
        self._devices.add(device, resource, sign)
        if device.node_name and device.phase is Phase.BOUND and resource is not None:
            self._ledger.hold(device.node_name, resource, device.count, sign)
        self._usage.device(device.namespace, device.class_name, resource, device.count, device.phase,
                           device.deleting, sign)

    def _add_pod(self, pod: PodView) -> None:
        self._launching.add(pod)
        self._pod(pod, +1)

    def _pod(self, pod: PodView, sign: int) -> None:
        """Add (+1) or take away (-1) what one pod contributes."""
        assert self._now is not None
        part = self._launching.part(pod, sign, names=self._names, devices=self._devices.devices,
                                    by_vmi=self._devices.by_vmi, classes=self._classes.classes, now=self._now,
                                    launcher_grace=self._grace)
        if part is None:
            return
        self._usage.pod(part.namespace, part.beyond_budget, sign)
        if part.node:
            self._ledger.use(part.node, part.beyond, part.window, sign)

    def _settling(self) -> Generator[None, None, None]:
        """What the contributions touched, derived again: the subtrees' usage, and each touched node (in
        name order, yielding every ``STEP`` nodes), logged."""
        stamp, ledger = self._stamp, self._ledger
        self._usage.settle(stamp)
        for i, node in enumerate(sorted(ledger.touched), 1):
            ledger.refresh(node)
            touch(stamp.log.nodes, node, stamp.generation)
            if i % STEP == 0:
                yield
        ledger.touched.clear()

    def _emit(self, now: datetime) -> Snapshot:
        devices, ledger, usage, launching = self._devices, self._ledger, self._usage, self._launching
        ledger.settle()
        self._classes.settle()
        for part in (devices, usage, launching):
            part.share()
        self._snapshot = Snapshot(
            now=now,
            classes=self._classes.classes,
            devices=frozen(devices.devices),
            nodes=frozen(self._classes.nodes),
            inventories=frozen(ledger.inventories),
            pods=frozen(launching.pods),
            vmis=frozen(launching.vmis),
            namespaces=usage.namespaces,
            budgets=usage.budgets,
            effective_names=self._names,
            permitted=self._permitted,
            devices_by_node=frozen(devices.by_node),
            devices_by_vmi=frozen(devices.by_vmi),
            launchers=launching.launchers,
            children=usage.children,
            dra_problems=self._dra_problems,
            subtree_usage=frozen(usage.subtree),
            pending_usage=frozen(usage.pending),
            capacity=frozen(ledger.capacity),
            availability=frozen(self._classes.availability),
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
