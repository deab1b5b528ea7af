"""What changed since the last snapshot, noted from the cache's events by kind and key.

Contract: :meth:`ChangeNotes.note` is a store handler's body: synchronous, cheap (it compares the two
states' views only where a heartbeat would otherwise count), and it never raises. It notes keys, never
views: the live model converts what it noted when a snapshot is asked for. A change no update can take
(a class that sells DRA units, a DRA slice, DeviceClass or taint rule, an unreadable VMI) asks for a
rebuild instead. Every pod's key is kept by its UID from its events, so a VM start that lists a launcher
asking for no GPU is an update too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from cozygpu import keys
from cozygpu.model.dra import ClaimView
from cozygpu.views.build import device_class
from cozygpu.views.decode import (
    EMPTY_OBJECT,
    Obj,
    as_map,
    as_str,
    gpu_class_view,
    namespace_view,
    node_inventory,
    node_view,
    permitted_host_devices,
)
from cozygpu.views.decode_dra import device_taint_rule_view, resource_claim_view, resource_slice_view
from cozygpu.views.decode_pods import asks_extended, pod_view, vmi_view

Key = tuple[str, str]

#: The kinds the DRA offers and claims are derived from (with a class selling DRA units): a rebuild for one of
#: them tells the readers of the change log that anything may have changed (the claims work then judges every
#: hold on the devices the slices name, which no snapshot field shows one by one).
DRA_KINDS = frozenset({"ResourceSlice", "DeviceClass", "DeviceTaintRule", "ResourceClaim"})


class ChangeNotes:
    """The keys changed since the last snapshot, by kind; and why a rebuild is due, when one is.

    ``held``: whether the current model holds a pod UID as a VMI's launcher (so its changes count while it
    asks for no extended resource).
    """

    def __init__(self, held: Callable[[str], bool]) -> None:
        self._held = held
        self.devices: set[Key] = set()
        self.vmis: set[Key] = set()
        #: GPUNodes whose report changed, came or went.
        self.reports: set[Key] = set()
        #: Nodes whose view changed (or that came or went): which classes may use them.
        self.nodes: set[Key] = set()
        #: GPU pods and launchers that changed, came or went: each one's contribution, swapped.
        self.pods: set[Key] = set()
        #: Pod UIDs a VMI started listing as active: their launcher (and so their usage) moved.
        self.launching: set[str] = set()
        #: Pod UIDs a VMI stopped listing as active (and no VMI started listing since): likewise.
        self.unlisted: set[str] = set()
        #: ResourceClaims whose allocation or holder changed, came or went: the DRA units of their nodes.
        self.claims: set[Key] = set()
        #: Tenant quotas whose ``spec.hard`` changed, came or went: those tenants' budgets.
        self.quotas: set[Key] = set()
        #: GPUClasses whose view changed, came or went (none selling DRA units).
        self.classes: set[Key] = set()
        #: Namespaces whose view changed, came or went.
        self.namespaces: set[Key] = set()
        #: KubeVirt's table may have changed.
        self.kubevirt = False
        #: Pod UID -> its key, for every pod in the store: a VMI listing a pod the model does not hold
        #: (one asking for no GPU) finds it here.
        self.pod_keys: dict[str, Key] = {}
        self._by_kind: dict[str, set[Key]] = {"Node": self.nodes, "Pod": self.pods, "ResourceQuota": self.quotas,
                                               keys.GPUNODE_KIND: self.reports, "Namespace": self.namespaces}
        self.rebuild = True
        #: Whether the next rebuild's change log says anything may have changed (a DRA input moved), rather
        #: than what differs from the model before it.
        self.everything = True
        #: Why ``rebuild`` was set (the first build's reason is the stores being new).
        self.why = "first build"

    def rebuild_for(self, why: str, *, everything: bool = False) -> None:
        self.rebuild, self.why = True, why
        self.everything |= everything

    def note(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """Note one change (``old`` None when added, ``new`` None when deleted)."""
        if kind == "Pod":
            self._pod_key(old, new)
        if self.rebuild:
            return
        if kind == keys.GPUDEVICE_KIND:
            self.devices.add(key_of(new or old or EMPTY_OBJECT))
        elif kind == "VirtualMachineInstance":
            self._vmi_changed(old, new)
        elif kind == "ResourceClaim":
            if _claim_of(old) != _claim_of(new):
                self.claims.add(key_of(new or old or EMPTY_OBJECT))
        elif not self.matters(kind, old, new):
            return
        elif kind == keys.GPUCLASS_KIND:
            self._class_changed(old, new)
        elif kind == "KubeVirt":
            self.kubevirt = True
        elif (noted := self._by_kind.get(kind)) is not None:
            noted.add(key_of(new or old or EMPTY_OBJECT))
        else:  # a DRA slice, DeviceClass or taint rule: the DRA offers are derived from them all
            self.rebuild_for(f"{kind} changed", everything=True)

    def matters(self, kind: str, old: Obj | None, new: Obj | None) -> bool:
        """Whether a change of an object of ``kind`` (not a device or VMI) moves anything a decision reads.

        A heartbeat (a Node's, a quota's usage, a status field no view holds) does not, and neither does
        any change of a pod that asks for no extended resource and launches no VMI here.
        """
        convert = _SAME_VIEW.get(kind)
        if convert is not None and old is not None and new is not None:
            try:
                if convert(old) == convert(new):
                    return False
            except ValueError:
                pass
        return not (kind == "Pod" and not self.wanted_pod(old) and not self.wanted_pod(new))

    def wanted_pod(self, pod: Obj | None) -> bool:
        """A pod the model holds: a VMI's launcher, or one asking for extended resources."""
        if pod is None:
            return False
        return self._held(as_str(as_map(pod.get("metadata")).get("uid"))) or asks_extended(as_map(pod.get("spec")))

    def _class_changed(self, old: Obj | None, new: Obj | None) -> None:
        try:
            views = [gpu_class_view(obj) for obj in (old, new) if obj is not None]
        except ValueError:
            self.rebuild_for(f"{keys.GPUCLASS_KIND} unreadable", everything=True)
            return
        if any(view.dra is not None for view in views):
            self.rebuild_for(f"{keys.GPUCLASS_KIND} selling DRA units changed", everything=True)
            return
        self.classes.add(key_of(new or old or EMPTY_OBJECT))

    def _vmi_changed(self, old: Obj | None, new: Obj | None) -> None:
        """Nothing when its view stayed the same, else an update; the pods that start or stop being its
        launchers are judged when the snapshot is taken."""
        try:
            before = vmi_view(old) if old is not None else None
            after = vmi_view(new) if new is not None else None
        except ValueError:
            self.rebuild_for("VirtualMachineInstance unreadable")
            return
        if before is not None and before == after:
            return  # nothing a decision reads moved
        was = before.active_pods if before else frozenset()
        listed = after.active_pods if after else frozenset()
        self.launching |= listed - was
        self.unlisted |= was - listed
        self.unlisted -= self.launching
        self.vmis.add(key_of(new or old or EMPTY_OBJECT))

    def _pod_key(self, old: Obj | None, new: Obj | None) -> None:
        """Keep a pod's key by its UID (forget it when it goes)."""
        uid = as_str(as_map((new or old or EMPTY_OBJECT).get("metadata")).get("uid"))
        if new is None:
            self.pod_keys.pop(uid, None)
        elif uid:
            self.pod_keys[uid] = key_of(new)

    def listed_pods(self, pods: Iterable[Obj]) -> None:
        """The stores were listed again: every pod's key by its UID, from ``pods``."""
        self.pod_keys = {uid: key_of(obj) for obj in pods if (uid := as_str(as_map(obj.get("metadata")).get("uid")))}

    @property
    def dirty(self) -> bool:
        """Whether a change was noted since the last snapshot (heartbeats are not)."""
        return self.rebuild or self.kubevirt or any((
            self.devices, self.vmis, self.reports, self.nodes, self.pods, self.launching, self.unlisted,
            self.claims, self.quotas, self.classes, self.namespaces))

    def forget(self) -> None:
        """The noted keys taken (by an update or a rebuild)."""
        for noted in (self.devices, self.vmis, self.reports, self.nodes, self.pods, self.claims, self.quotas,
                      self.classes, self.namespaces, self.launching, self.unlisted):
            noted.clear()
        self.kubevirt = False


def key_of(obj: Obj) -> Key:
    meta = as_map(obj.get("metadata"))
    return (as_str(meta.get("namespace")), as_str(meta.get("name")))


def _claim_of(obj: Obj | None) -> ClaimView | None:
    return resource_claim_view(obj) if obj is not None else None


def _inventory_key(obj: Obj) -> object:
    inventory = node_inventory(obj)
    return (inventory.served, inventory.resource_names, inventory.last_report)


#: Kinds whose events often change nothing a view reads (kubelet and agent heartbeats, status writes).
_SAME_VIEW: dict[str, Callable[[Obj], object]] = {
    "Node": node_view,
    keys.GPUNODE_KIND: _inventory_key,
    keys.GPUCLASS_KIND: gpu_class_view,
    "Namespace": namespace_view,
    "Pod": pod_view,
    "ResourceSlice": resource_slice_view,
    "DeviceClass": device_class,
    "KubeVirt": lambda obj: permitted_host_devices((obj,)),
    "DeviceTaintRule": device_taint_rule_view,
    "ResourceQuota": lambda obj: (as_map(obj.get("metadata")).get("name"), as_map(obj.get("spec")).get("hard")),
}
