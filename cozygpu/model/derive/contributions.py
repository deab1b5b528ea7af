"""The parts of one model, and each object's contribution routed to them.

Contract: every method adds (+1) or takes away (-1) what one object contributes, or replaces one object
(a class, a report, KubeVirt's table, a namespace) by taking its old contribution away and adding its
new one; nothing is derived twice. What the contributions touched is derived again by ``settling`` (the
subtrees' usage, each touched node) and by ``renamed`` (what reads the effective names).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from datetime import datetime, timedelta

from cozygpu.model.derive.availability import ClassIndex
from cozygpu.model.derive.devices import DeviceIndex, alike
from cozygpu.model.derive.launching import LauncherIndex
from cozygpu.model.derive.names import NameSources
from cozygpu.model.derive.nodes import NodeLedger
from cozygpu.model.derive.shared import STEP, Stamp
from cozygpu.model.derive.usage import TenantUsage
from cozygpu.model.resource_names import permitted_gpu_names, permitted_names
from cozygpu.model.snapshot import (
    DeviceKey,
    DeviceView,
    GPUClassView,
    NamespaceView,
    NodeInventory,
    NodeView,
    PermittedHostDevices,
    Phase,
    PodView,
    VmiKey,
    VMIView,
    touch,
)


class Parts:
    """One model's parts: the classes and their availability, the node ledger, the device index, tenant
    usage, the launcher index and the effective names."""

    def __init__(self, *, stamp: Stamp, hoster: Iterable[str], stale_after: timedelta, launcher_grace: timedelta,
                 classes: Iterable[GPUClassView] = (), nodes: Iterable[NodeView] = (),
                 vmis: Iterable[VMIView] = (), namespaces: Iterable[NamespaceView] = ()) -> None:
        self.stamp = stamp
        self.classes = ClassIndex(classes, nodes, stamp=stamp)
        dra_names = frozenset(c.resource_name for c in self.classes.classes.values() if c.dra is not None)
        self.ledger = NodeLedger(self.classes, stamp=stamp, stale_after=stale_after, dra_names=dra_names)
        self.devices = DeviceIndex()
        self.usage = TenantUsage(namespaces)
        self.launching = LauncherIndex(vmis)
        self.names = NameSources(hoster)
        for gpu_class in self.classes.classes.values():
            self.names.declare((gpu_class.resource_name,), +1)
        self.permitted: PermittedHostDevices | None = None
        self.now: datetime | None = None
        self._grace = launcher_grace

    # -- objects replaced whole ------------------------------------------------------------------

    def report(self, name: str, inventory: NodeInventory | None, now: datetime) -> None:
        """Node ``name``'s report now (None: gone): its names declared, its units on the ledger."""
        before = self.ledger.inventories.get(name)
        if before is not None:
            self.names.declare(before.resource_names, -1)
        if inventory is None:
            self.ledger.unreport(name)
            return
        self.names.declare(inventory.resource_names, +1)
        self.ledger.report(name, inventory, now)

    def put_class(self, name: str, gpu_class: GPUClassView | None, attached_vmis: set[VmiKey]) -> None:
        """Class ``name`` replaced (None: gone; neither sells DRA units): its devices' contributions taken
        away and added again under it, when its resource name moved (their VMIs go into
        ``attached_vmis``); its availability is the caller's to ``remake`` once nodes are refreshed."""
        before = self.classes.classes.get(name)
        if before is not None and gpu_class is not None and before.resource_name == gpu_class.resource_name:
            self.classes.put(name, gpu_class)
            return
        held = [self.devices.devices[key] for key in sorted(self.devices.of_class.get(name, ()))]
        for device in held:
            self.device(device, -1)
            if device.attachment is not None:
                attached_vmis.add((device.namespace, device.attachment.vmi))
        if before is not None:
            self.names.declare((before.resource_name,), -1)
        self.classes.put(name, gpu_class)
        if gpu_class is not None:
            self.names.declare((gpu_class.resource_name,), +1)
        for device in held:
            self.device(device, +1)

    def put_permitted(self, permitted: PermittedHostDevices | None) -> None:
        """KubeVirt's ``permittedHostDevices`` now: its GPU entries declared; the names whose permission
        moved are logged (a class's order is judged on them)."""
        before = self.permitted
        self.names.declare(permitted_gpu_names(before), -1)
        self.names.declare(permitted_gpu_names(permitted), +1)
        self.permitted = permitted
        if (before is None) != (permitted is None):  # no table checks nothing: every class's name moved
            moved = frozenset(self.classes.classes_of)
        else:
            moved = permitted_names(before) ^ permitted_names(permitted)
        for name in sorted(moved):
            touch(self.stamp.log.names, name, self.stamp.generation)

    def renamed(self) -> None:
        """The effective names settled: when some came or went, what reads them is derived again — the pods
        asking for them, the budgets naming them; the names are logged."""
        moved = self.names.settle()
        if not moved:
            return
        for pod in self.launching.asking_for(moved):
            self.pod(pod, -1)
            self.pod(pod, +1)
        self.usage.renamed(moved, self.names.names, self.stamp)
        for name in sorted(moved):
            touch(self.stamp.log.names, name, self.stamp.generation)

    # -- contributions ---------------------------------------------------------------------------

    def put_device(self, key: DeviceKey, device: DeviceView | None, attached_vmis: set[VmiKey]) -> None:
        """A device's new view (None: gone): its old contribution away, its new one added; the VMIs it
        was or is attached to go into ``attached_vmis``."""
        old = self.devices.devices.get(key)
        device = self.devices.release(key, device)
        for view in (old, device):
            if view is not None and view.attachment is not None:
                attached_vmis.add((view.namespace, view.attachment.vmi))
        if old is not None and device is not None and alike(old, device):
            # A request, an answer, an attachment's details: the same units, usage and index buckets.
            self.devices.replace(key, device)
            return
        if old is not None:
            self.device(old, -1)
        if device is not None:
            self.device(device, +1)

    def device(self, device: DeviceView, sign: int) -> None:
        """Add (+1) or take away (-1) everything one device contributes."""
        resource = self.classes.resource_of.get(device.class_name)
        self.devices.add(device, resource, sign)
        if device.node_name and device.phase is Phase.BOUND and resource is not None:
            self.ledger.hold(device.node_name, resource, device.count, sign)
        self.usage.device(device.namespace, device.class_name, resource, device.count, device.phase,
                          device.deleting, sign)

    def add_pod(self, pod: PodView) -> None:
        self.launching.add(pod)
        self.pod(pod, +1)

    def pod(self, pod: PodView, sign: int) -> None:
        """Add (+1) or take away (-1) what one pod contributes."""
        assert self.now is not None
        part = self.launching.part(pod, sign, names=self.names.names, devices=self.devices.devices,
                                   by_vmi=self.devices.by_vmi, classes=self.classes.classes, now=self.now,
                                   launcher_grace=self._grace)
        if part is None:
            return
        self.usage.pod(part.namespace, part.beyond_budget, sign)
        if part.node:
            self.ledger.use(part.node, part.beyond, part.window, sign)

    def launchers_of(self, vmi_keys: Iterable[VmiKey]) -> None:
        """The launchers (and claimants) of these VMIs derived again: their usage depends on the devices
        attached."""
        launching = self.launching
        for vmi_key in vmi_keys:
            vmi = launching.vmis.get(vmi_key)
            uids = set(vmi.active_pods) if vmi is not None else set()
            for uid in sorted(uids | launching.claimants.get(vmi_key, set())):
                found = launching.pods.get(uid)
                if found is not None:
                    self.pod(found, -1)
                    self.pod(found, +1)

    def settling(self) -> Generator[None, None, None]:
        """What the contributions touched, derived again: the subtrees' usage, and each touched node (in
        name order, yielding every ``STEP`` nodes), logged."""
        stamp, ledger = self.stamp, self.ledger
        self.usage.settle(stamp)
        for i, node in enumerate(sorted(ledger.touched), 1):
            ledger.refresh(node)
            touch(stamp.log.nodes, node, stamp.generation)
            if i % STEP == 0:
                yield
        ledger.touched.clear()
