"""LiveSnapshot: after any sequence of cache events, the same snapshot ``build_snapshot`` builds from scratch.

A small world (two classes, three nodes and their reports, VMIs with launcher
pods, raw GPU pods, tenant namespaces and budgets, devices in every phase, a DRA class
over simulated NVIDIA slices with claims of holds and of others)
is changed event by event as an informer would show it — a device placed,
moved, lost, attached, deleted; a node cordoned; a report changed, gone
stale, or deleted and made again (a new node's first report); a VMI's launcher
finishing; a store replaced without events — and at random points the
incremental snapshot is compared with the reference.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu import keys
from cozygpu.api import claims as claims_api
from cozygpu.devcluster import dra_driver
from cozygpu.model.catalog import catalog
from cozygpu.model.derive import STEP, ModelTables
from cozygpu.model.derive.nodes import NodeLedger
from cozygpu.model.dra import DeviceRef
from cozygpu.model.snapshot import Snapshot
from cozygpu.views import live as live_module
from cozygpu.views.build import build_snapshot
from cozygpu.views.live import LIVE_KINDS, LiveSnapshot, Source

Obj = dict[str, Any]
T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
STALE = timedelta(minutes=5)
RESOURCES = ("nvidia.com/A", "nvidia.com/B")
#: A name no class or report has at first: one that comes and goes moves the effective names.
NEW = "nvidia.com/NEW"
NODES = ("n1", "n2", "n3")
NAMESPACES = ("tenant-root", "tenant-a", "tenant-a-b", "tenant-c", "default")
VMIS = ("vm1", "vm2")
DEVICES = tuple(f"d{i}" for i in range(6))
#: Where devices are ordered: mostly where the VMIs run, and one tenant no Namespace object names.
DEVICE_NAMESPACES = ("tenant-a", "tenant-a", "tenant-a-b", "tenant-c", "tenant-a-x")
PODS = ("p1", "p2", "p3")
#: The DRA class's resource name (its DeviceClass's extended name) and its claims' names.
DRA_RESOURCE = f"deviceclass.resource.kubernetes.io/{dra_driver.DEVICE_CLASS}"
CLAIMS = ("c1", "c2", "d0")
_rv = itertools.count(1)


def stamp(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


def meta(name: str, namespace: str | None = None, **more: Any) -> Obj:
    found: Obj = {"name": name, "resourceVersion": str(next(_rv)), **more}
    if namespace is not None:
        found["namespace"] = namespace
    return found


def gpu_class(name: str, resource: str, *, selector: bool = False) -> Obj:
    spec: Obj = {"mode": "Passthrough", "resourceName": resource}
    if selector:
        spec["nodeSelector"] = {"matchLabels": {"gpu": "yes"}}
    return {"metadata": meta(name), "spec": spec}


def node(name: str, *, ready: bool = True, cordoned: bool = False, labelled: bool = True,
         heartbeat: int = 0) -> Obj:
    return {"metadata": meta(name, labels={"gpu": "yes"} if labelled else {}),
            "spec": {"unschedulable": cordoned},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                       "lastHeartbeatTime": str(heartbeat)}]}}


def report(name: str, units: Mapping[str, int], *, reported: datetime) -> Obj:
    devices = [{"resourceName": r, "allocatable": 1} for r, n in units.items() for _ in range(n)]
    return {"metadata": meta(name), "status": {"devices": devices, "resourceNames": sorted(units),
                                                "agent": {"lastReport": stamp(reported)}}}


def device(name: str, namespace: str, *, class_name: str, count: int, phase: str | None, node_name: str | None,
           vmi: str | None, uid: str, deleting: bool, request: str | None) -> Obj:
    status: Obj = {}
    if phase:
        status["phase"] = phase
    if node_name:
        status["nodeName"] = node_name
    if vmi:
        status["attachment"] = {"vmi": vmi, "uid": uid}
    if request:
        status["bindRequest"] = {"id": request, "vmi": vmi or ""}
    extra: Obj = {"creationTimestamp": stamp(T0)}
    if deleting:
        extra["deletionTimestamp"] = stamp(T0)
    return {"metadata": meta(name, namespace, uid=f"uid-{name}", **extra),
            "spec": {"className": class_name, "count": count}, "status": status}


def vmi(name: str, namespace: str, *, uid: str, active: tuple[str, ...], node_name: str | None) -> Obj:
    return {"metadata": meta(name, namespace, uid=uid),
            "spec": {}, "status": {"phase": "Running", "nodeName": node_name,
                                   "activePods": {pod_uid(namespace, p): node_name or "" for p in active}}}


def pod_uid(namespace: str, name: str) -> str:
    """A pod's UID: unique per object, as the API server makes it (two namespaces' p1 are two pods)."""
    return f"uid-{namespace}-{name}"


def pod(name: str, namespace: str, *, resource: str, units: int, node_name: str | None, phase: str,
        claims: str | None = None, claimed_uid: str = "", created: datetime = T0) -> Obj:
    """A GPU pod; ``claims`` names the VMI of its controller ownerReference (a launcher's claim, R-MOD-7)."""
    extra: Obj = {"creationTimestamp": stamp(created)}
    if claims:
        extra["ownerReferences"] = [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                                     "name": claims, "uid": claimed_uid, "controller": True}]
    return {"metadata": meta(name, namespace, uid=pod_uid(namespace, name), **extra),
            "spec": {"nodeName": node_name, "containers": [{"resources": {"limits": {resource: str(units)}}}]},
            "status": {"phase": phase}}


def quota(namespace: str, total: int, raw: Mapping[str, int] | None = None) -> Obj:
    hard = {keys.QUOTA_TOTAL: str(total), **{f"requests.{name}": str(n) for name, n in (raw or {}).items()}}
    return {"metadata": meta(keys.TENANT_QUOTA_NAME, namespace), "spec": {"hard": hard}}


def kubevirt(names: tuple[str, ...], vendor: str = "10de:2330") -> Obj:
    """A KubeVirt CR whose ``permittedHostDevices`` lists ``names`` as PCI devices of ``vendor``."""
    table = {"pciHostDevices": [{"pciVendorSelector": vendor, "resourceName": name} for name in names]}
    return {"metadata": meta("kubevirt", "kubevirt"), "spec": {"configuration": {"permittedHostDevices": table}}}


def key_of(obj: Obj) -> tuple[str, str]:
    return (obj["metadata"].get("namespace") or "", obj["metadata"]["name"])


class World:
    """The cache's stores, as plain dicts, and the LiveSnapshot fed their events."""

    def __init__(self) -> None:
        self.stores: dict[str, dict[tuple[str, str], Obj]] = {kind: {} for kind in LIVE_KINDS}
        self.identities: dict[str, object] = {kind: object() for kind in LIVE_KINDS}
        self.live = LiveSnapshot(report_stale_after=STALE)
        #: The watch is down: stores change and the live model is told nothing.
        self.deaf = False
        self.now = T0
        #: The live snapshot the last check saw: the next one's change log must name what changed since.
        self.previous: Snapshot | None = None
        #: The previous snapshot's compared fields as it was handed out (deep-copied).
        self.previous_fields: dict[str, Any] | None = None

    def put(self, kind: str, obj: Obj | None, key: tuple[str, str] | None = None) -> None:
        key = key or key_of(obj or {})
        old = self.stores[kind].get(key)
        if obj is None:
            if old is None:
                return
            del self.stores[kind][key]
        else:
            self.stores[kind][key] = obj
        if not self.deaf:
            self.live.changed(kind, old, obj)

    def replace_store(self, kind: str) -> None:
        """The kind was served again: a new store, and no events for what was there before."""
        self.identities[kind] = object()

    def sources(self) -> dict[str, Source | None]:
        def source(kind: str) -> Source:
            store = self.stores[kind]
            return Source(self.identities[kind], lambda: list(store.values()),
                          lambda namespace, name: store.get((namespace, name)))

        return {kind: source(kind) for kind in LIVE_KINDS}

    def reference(self) -> Snapshot:
        s = {kind: list(objects.values()) for kind, objects in self.stores.items()}
        return build_snapshot(now=self.now, classes=s[keys.GPUCLASS_KIND], devices=s[keys.GPUDEVICE_KIND],
                              gpunodes=s[keys.GPUNODE_KIND], nodes=s["Node"], pods=s["Pod"],
                              vmis=s["VirtualMachineInstance"], quotas=s["ResourceQuota"],
                              namespaces=s["Namespace"], kubevirts=s["KubeVirt"], slices=s["ResourceSlice"],
                              device_classes=s["DeviceClass"], claims=s["ResourceClaim"], report_stale_after=STALE)


def normal(snapshot: Snapshot) -> dict[str, Any]:
    """The snapshot's compared fields, the device index tuples as sets (their order means nothing)."""
    fields = {f.name: getattr(snapshot, f.name) for f in attrs.fields(Snapshot) if f.eq}
    for name in ("devices_by_node", "devices_by_vmi"):
        fields[name] = {k: frozenset(v) for k, v in fields[name].items()}
    return {name: (dict(value) if isinstance(value, Mapping) else value) for name, value in fields.items()}


def assert_same(world: World) -> None:
    snapshot = world.live.snapshot(now=world.now, sources=world.sources())
    live = normal(snapshot)
    reference = normal(world.reference())
    for name in reference:
        assert live[name] == reference[name], f"{name} differs after {world.live.last_step}"
    if world.previous is not None:
        # A snapshot handed out never changes: an update copies what it patches (readers hold snapshots).
        then = normal(world.previous)
        for name, value in (world.previous_fields or {}).items():
            assert then[name] == value, f"the snapshot before {world.live.last_step} changed: {name}"
        assert_changes_named(world.previous, snapshot, world.live.last_step)
    world.previous = snapshot
    world.previous_fields = copy.deepcopy(live)


def assert_changes_named(before: Snapshot, after: Snapshot, step: str) -> None:
    """The change log names every node, device and VMI whose inputs to a decision changed (more is allowed)."""
    changes = after.changes_since(before)
    if changes is None:
        return  # rebuilt since: a reader judges everything again
    for key in set(before.devices) | set(after.devices):
        if before.devices.get(key) != after.devices.get(key):
            assert key in changes.devices, f"device {key} changed unnamed after {step}"
    for index in ("nodes", "inventories", "capacity"):
        then, now = getattr(before, index), getattr(after, index)
        for name in set(then) | set(now):
            if then.get(name) != now.get(name):
                assert name in changes.nodes, f"{index}[{name}] changed unnamed after {step}"
    for vmi in set(before.vmis) | set(after.vmis):
        views = [v for v in (before.vmis.get(vmi), after.vmis.get(vmi)) if v is not None]
        pods = {uid for view in views for uid in view.active_pods}
        if before.vmis.get(vmi) != after.vmis.get(vmi) or any(
                before.pods.get(uid) != after.pods.get(uid) for uid in pods):
            assert vmi in changes.vmis, f"VMI {vmi} or its launchers changed unnamed after {step}"


def seed(world: World) -> None:
    world.put(keys.GPUCLASS_KIND, gpu_class("a", RESOURCES[0]))
    world.put(keys.GPUCLASS_KIND, gpu_class("b", RESOURCES[1], selector=True))
    for name in NODES:
        world.put("Node", node(name))
        world.put(keys.GPUNODE_KIND, report(name, {RESOURCES[0]: 4, RESOURCES[1]: 2}, reported=T0))
    for namespace in NAMESPACES:
        world.put("Namespace", {"metadata": meta(namespace)})
    world.put("ResourceQuota", quota("tenant-a", 6))
    world.put(keys.GPUCLASS_KIND, dra_class())
    world.put("DeviceClass", dra_driver.device_class())
    for name in NODES[:2]:
        world.put("ResourceSlice", dra_driver.resource_slice(name, f"uid-{name}", 2))


def dra_class() -> Obj:
    return {"metadata": meta("c"), "spec": {"mode": "Passthrough", "resourceName": DRA_RESOURCE, "source": {
        "dra": {"deviceClassName": dra_driver.DEVICE_CLASS}}}}


def claim(name: str, namespace: str, node_name: str, devices: tuple[int, ...], *, held: bool) -> Obj:
    """A claim allocated ``devices`` of ``node_name``: a hold's (owned by GPUDevice ``name``) or a pod's own."""
    body = claims_api.hold_claim(name, f"uid-{name}", device_class=dra_driver.DEVICE_CLASS, count=len(devices))
    if not held:
        body["metadata"]["ownerReferences"] = []
    body["metadata"].update(meta(name, namespace))
    refs = [DeviceRef(dra_driver.DRIVER, node_name, dra_driver.device_name(i)) for i in devices]
    if refs:
        body["status"] = claims_api.hold_status(node_name, refs, device_name=name, device_uid=f"uid-{name}", now=T0)
    return body


names = st.sampled_from
steps = st.one_of(
    st.tuples(st.just("device"), names(DEVICES), names(DEVICE_NAMESPACES), names(("a", "b", "c", "ghost")),
              st.integers(1, 3), names((None, "Pending", "Bound", "Lost")), names((None, *NODES)),
              names((None, *VMIS)), st.booleans(), st.booleans(), st.booleans()),
    st.tuples(st.just("delete device"), names(DEVICES), names(DEVICE_NAMESPACES)),
    st.tuples(st.just("node"), names(NODES), st.booleans(), st.booleans(), st.booleans(), st.integers(0, 3)),
    st.tuples(st.just("delete node"), names(NODES)),
    st.tuples(st.just("report"), names(NODES), st.integers(0, 5), st.integers(0, 3), st.integers(0, 10),
              names(("both", "A", "new"))),
    st.tuples(st.just("drop report"), names(NODES)),
    st.tuples(st.just("vmi"), names(VMIS), names(NAMESPACES[1:3]), st.booleans(), names((None, *NODES))),
    st.tuples(st.just("pod"), names(PODS), names(NAMESPACES[1:3]), names((*RESOURCES, NEW, "cpu")), st.integers(0, 2),
              names((None, *NODES)), names(("Running", "Succeeded")), names((None, *VMIS)), st.booleans(),
              st.integers(0, 40)),
    st.tuples(st.just("quota"), names(NAMESPACES[:3]), st.integers(0, 8)),
    st.tuples(st.just("raw quota"), names(NAMESPACES[:3]), names((*RESOURCES, NEW)), st.integers(0, 4)),
    st.tuples(st.just("drop quota"), names(NAMESPACES[:3])),
    st.tuples(st.just("class"), names(("a", "b")), st.booleans()),
    st.tuples(st.just("class named"), names(("a", "b", "x")), names((*RESOURCES, NEW)), st.booleans()),
    st.tuples(st.just("drop class"), names(("a", "b", "x"))),
    st.tuples(st.just("namespace"), names((*NAMESPACES, "tenant-a-x", "tenant-z")), st.booleans()),
    st.tuples(st.just("drop namespace"), names((*NAMESPACES, "tenant-a-x", "tenant-z"))),
    st.tuples(st.just("kubevirt"), names(((), (RESOURCES[0],), (RESOURCES[0], NEW), None)), st.booleans()),
    st.tuples(st.just("claim"), names(CLAIMS), names(DEVICE_NAMESPACES[:3]), names(NODES),
              st.sets(st.integers(0, 2), max_size=2), st.booleans()),
    st.tuples(st.just("drop claim"), names(CLAIMS), names(DEVICE_NAMESPACES[:3])),
    st.tuples(st.just("slice"), names(NODES), st.integers(0, 3), st.integers(1, 3)),
    st.tuples(st.just("device class"), st.booleans()),
    st.tuples(st.just("time"), st.integers(0, 4)),
    st.tuples(st.just("tick"), st.integers(0, 40)),
    st.tuples(st.just("replace"), names(LIVE_KINDS)),
    # A change the watch missed, seen by the relist that follows (the rebuild's change log names it).
    st.tuples(st.just("unseen"), st.one_of(
        st.tuples(st.just("device"), names(DEVICES), names(DEVICE_NAMESPACES), names(("a", "b")),
                  st.integers(1, 3), names(("Pending", "Bound")), names((None, *NODES)), names((None, *VMIS)),
                  st.booleans(), st.booleans(), st.booleans()),
        st.tuples(st.just("pod"), names(PODS), names(NAMESPACES[1:3]), names(RESOURCES), st.integers(0, 2),
                  names((None, *NODES)), names(("Running", "Succeeded")), names((None, *VMIS)), st.booleans(),
                  st.integers(0, 40)),
        st.tuples(st.just("vmi"), names(VMIS), names(NAMESPACES[1:3]), st.booleans(), names((None, *NODES))),
        st.tuples(st.just("report"), names(NODES), st.integers(0, 5), st.integers(0, 3), st.integers(0, 10),
                  names(("both", "A", "new"))),
        st.tuples(st.just("quota"), names(NAMESPACES[:3]), st.integers(0, 8)))),
    st.tuples(st.just("check")),
)


def apply(world: World, step: tuple[Any, ...]) -> None:
    what = step[0]
    if what == "device":
        _, name, namespace, class_name, count, phase, node_name, vmi_name, same_uid, deleting, request = step
        uid = f"vmi-uid-{vmi_name}" if same_uid else "an-old-uid"
        world.put(keys.GPUDEVICE_KIND, device(name, namespace, class_name=class_name, count=count, phase=phase,
                                              node_name=node_name, vmi=vmi_name, uid=uid, deleting=deleting,
                                              request="r1" if request else None))
    elif what == "delete device":
        world.put(keys.GPUDEVICE_KIND, None, (step[2], step[1]))
    elif what == "node":
        _, name, ready, cordoned, labelled, heartbeat = step
        world.put("Node", node(name, ready=ready, cordoned=cordoned, labelled=labelled, heartbeat=heartbeat))
    elif what == "delete node":
        world.put("Node", None, ("", step[1]))
    elif what == "drop report":  # the GPUNode deleted: a later report is a new node's first
        world.put(keys.GPUNODE_KIND, None, ("", step[1]))
    elif what == "report":
        _, name, a_units, b_units, minutes_ago, served = step
        units = {"both": {RESOURCES[0]: a_units, RESOURCES[1]: b_units}, "A": {RESOURCES[0]: a_units},
                 "new": {RESOURCES[0]: a_units, NEW: b_units}}[served]
        world.put(keys.GPUNODE_KIND, report(name, units, reported=world.now - timedelta(minutes=minutes_ago)))
    elif what == "vmi":
        _, name, namespace, running, node_name = step
        world.put("VirtualMachineInstance", vmi(name, namespace, uid=f"vmi-uid-{name}",
                                                active=("p1", "p2") if running else (), node_name=node_name))
    elif what == "pod":
        _, name, namespace, resource, units, node_name, phase, claims, same_uid, seconds_ago = step
        world.put("Pod", pod(name, namespace, resource=resource, units=units, node_name=node_name, phase=phase,
                             claims=claims, claimed_uid=f"vmi-uid-{claims}" if same_uid else "an-old-uid",
                             created=world.now - timedelta(seconds=seconds_ago)))
    elif what == "quota":
        world.put("ResourceQuota", quota(step[1], step[2]))
    elif what == "raw quota":
        world.put("ResourceQuota", quota(step[1], 6, {step[2]: step[3]}))
    elif what == "drop quota":
        world.put("ResourceQuota", None, (step[1], keys.TENANT_QUOTA_NAME))
    elif what == "class":
        world.put(keys.GPUCLASS_KIND, gpu_class(step[1], RESOURCES[0 if step[1] == "a" else 1], selector=step[2]))
    elif what == "class named":
        world.put(keys.GPUCLASS_KIND, gpu_class(step[1], step[2], selector=step[3]))
    elif what == "drop class":
        world.put(keys.GPUCLASS_KIND, None, ("", step[1]))
    elif what == "namespace":
        world.put("Namespace", {"metadata": meta(step[1], labels={"team": "x"} if step[2] else {})})
    elif what == "drop namespace":
        world.put("Namespace", None, ("", step[1]))
    elif what == "kubevirt":
        if step[1] is None:
            world.put("KubeVirt", None, ("kubevirt", "kubevirt"))
        else:
            world.put("KubeVirt", kubevirt(step[1], "10de:2330" if step[2] else "15b3:101e"))
    elif what == "claim":
        _, name, namespace, node_name, devices, held = step
        world.put("ResourceClaim", claim(name, namespace, node_name, tuple(sorted(devices)), held=held))
    elif what == "drop claim":
        world.put("ResourceClaim", None, (step[2], step[1]))
    elif what == "slice":
        _, name, gpus, generation = step
        world.put("ResourceSlice", dra_driver.resource_slice(name, f"uid-{name}", gpus, generation=generation),
                  ("", dra_driver.slice_name(name)))
    elif what == "device class":
        if step[1]:
            world.put("DeviceClass", dra_driver.device_class())
        else:
            world.put("DeviceClass", None, ("", dra_driver.DEVICE_CLASS))
    elif what == "time":
        world.now += timedelta(minutes=step[1])
    elif what == "tick":
        world.now += timedelta(seconds=step[1])
    elif what == "replace":
        world.replace_store(step[1])
    elif what == "unseen":
        kind = {"device": keys.GPUDEVICE_KIND, "pod": "Pod", "vmi": "VirtualMachineInstance",
                "report": keys.GPUNODE_KIND, "quota": "ResourceQuota"}[step[1][0]]
        world.deaf = True
        apply(world, step[1])
        world.deaf = False
        world.replace_store(kind)
    else:
        assert_same(world)


@settings(max_examples=300, deadline=None)
@given(st.lists(steps, max_size=40))
def test_after_any_events_the_live_snapshot_is_the_one_built_from_scratch(events: list[tuple[Any, ...]]) -> None:
    world = World()
    seed(world)
    assert_same(world)
    for step in events:
        apply(world, step)
        assert_same(world)


def test_a_device_or_node_change_is_an_update_and_a_heartbeat_changes_nothing() -> None:
    world = World()
    seed(world)
    assert_same(world)
    assert world.live.last_step == "rebuild"
    world.put(keys.GPUDEVICE_KIND, device("d0", "tenant-a", class_name="a", count=2, phase="Bound", node_name="n1",
                                          vmi=None, uid="", deleting=False, request=None))
    world.put("Node", node("n2", heartbeat=7))  # a kubelet heartbeat: no view moved
    assert_same(world)
    assert world.live.last_step == "update of 1 device(s)"
    world.put("Node", node("n2", cordoned=True))
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s) and 1 node(s)", "a cordon moves who may use n2"
    world.put("Node", None, ("", "n3"))
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s) and 1 node(s)", "a Node gone"


def test_a_device_attached_to_a_running_vmi_takes_its_launchers_units_off_raw_usage_incrementally() -> None:
    world = World()
    seed(world)
    world.put("VirtualMachineInstance", vmi("vm1", "tenant-a", uid="vmi-uid-vm1", active=("p1",), node_name="n1"))
    world.put("Pod", pod("p1", "tenant-a", resource=RESOURCES[0], units=2, node_name="n1", phase="Running"))
    assert_same(world)
    for step in (("device", "d0", "tenant-a", "a", 1, "Bound", "n1", "vm1", True, False, False),
                 ("device", "d1", "tenant-a", "a", 1, "Bound", "n2", "vm1", True, False, False),
                 ("device", "d1", "tenant-a", "a", 1, "Bound", "n1", "vm1", True, False, False),
                 ("delete device", "d0", "tenant-a")):
        apply(world, step)
        assert_same(world)
        assert world.live.last_step == "update of 1 device(s)"


def running_vm() -> World:
    """The seeded world with VM vm1 running on n1: its launcher p1 asking for its two units, d0 attached."""
    world = World()
    seed(world)
    world.put("VirtualMachineInstance", vmi("vm1", "tenant-a", uid="vmi-uid-vm1", active=("p1",), node_name="n1"))
    world.put("Pod", pod("p1", "tenant-a", resource=RESOURCES[0], units=2, node_name="n1", phase="Running"))
    apply(world, ("device", "d0", "tenant-a", "a", 2, "Bound", "n1", "vm1", True, False, False))
    assert_same(world)
    return world


def test_a_vmi_change_is_an_update_even_when_its_launcher_asks_for_no_gpu() -> None:
    world = running_vm()
    # A VMI starting (no launcher yet), one moving node with the same pod, and one going: updates, never a rebuild.
    steps: tuple[Callable[[], None], ...] = (
                 lambda: world.put("VirtualMachineInstance", vmi("vm2", "tenant-a", uid="u2", active=(),
                                                                 node_name=None)),
                 lambda: world.put("VirtualMachineInstance", vmi("vm1", "tenant-a", uid="vmi-uid-vm1",
                                                                 active=("p1",), node_name="n2")),
                 lambda: world.put("VirtualMachineInstance", None, ("tenant-a", "vm2")))
    for step in steps:
        step()
        assert_same(world)
        assert world.live.last_step == "update of 0 device(s) and 1 VMI(s)"
    # A VM stopping and starting again: its launcher asks for GPUs, so the snapshot holds it either way and
    # only its usage moves (raw use while it launches nothing, the VMI's devices' while it does).
    world.put("VirtualMachineInstance", vmi("vm1", "tenant-a", uid="vmi-uid-vm1", active=(), node_name="n1"))
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s) and 1 VMI(s) and 1 pod(s)"
    world.put("VirtualMachineInstance", vmi("vm1", "tenant-a", uid="vmi-uid-vm1", active=("p1",), node_name="n1"))
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s) and 1 VMI(s) and 1 pod(s)"
    # A launcher asking for no GPU (a VM without GPUs) is held only while a VMI lists it: the pod is found by
    # its UID, and which pods the snapshot holds changes in an update (each such VM start rebuilt the model).
    plain = pod("p2", "tenant-a", resource=RESOURCES[0], units=1, node_name="n1", phase="Running")
    plain["spec"]["containers"] = [{"resources": {"limits": {"cpu": "1"}}}]
    world.put("Pod", plain)
    assert_same(world)
    world.put("VirtualMachineInstance", vmi("vm1", "tenant-a", uid="vmi-uid-vm1", active=("p1", "p2"),
                                            node_name="n1"))
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s) and 1 VMI(s) and 1 pod(s)"
    assert pod_uid("tenant-a", "p2") in world.live.snapshot(now=world.now, sources=world.sources()).pods
    world.put("VirtualMachineInstance", vmi("vm1", "tenant-a", uid="vmi-uid-vm1", active=("p1",), node_name="n1"))
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s) and 1 VMI(s) and 1 pod(s)"
    assert pod_uid("tenant-a", "p2") not in world.live.snapshot(now=world.now, sources=world.sources()).pods


def test_a_vm_stop_whose_launcher_goes_before_its_vmi_stops_listing_it_is_an_update() -> None:
    """KubeVirt's order of a stop: the launcher pod is deleted while the VMI still lists it, then the VMI goes.
    Neither step changes which pods the snapshot holds, so neither rebuilds (each did, on every VM stop)."""
    world = running_vm()
    world.put("Pod", None, ("tenant-a", "p1"))
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s) and 1 pod(s)"
    world.put("VirtualMachineInstance", None, ("tenant-a", "vm1"))
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s) and 1 VMI(s)"
    # A pod a VMI starts listing before the pod is seen is taken when it comes: the model holds it then.
    world.put("VirtualMachineInstance", vmi("vm1", "tenant-a", uid="vmi-uid-vm1", active=("p9",), node_name="n1"))
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s) and 1 VMI(s)"
    plain = pod("p9", "tenant-a", resource="cpu", units=1, node_name="n1", phase="Running")
    world.put("Pod", plain)
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s) and 1 pod(s)"


def test_a_claimed_launchers_window_opens_with_its_vmis_devices_and_closes_with_time() -> None:
    world = World()
    seed(world)
    apply(world, ("vmi", "vm1", "tenant-a", False, "n1"))  # the VMI exists and does not list the pod
    world.put("Pod", pod("p1", "tenant-a", resource=RESOURCES[0], units=1, node_name="n1", phase="Running",
                         claims="vm1", claimed_uid="vmi-uid-vm1", created=world.now))
    assert_same(world)
    apply(world, ("device", "d0", "tenant-a", "a", 1, "Bound", "n1", "vm1", True, False, False))
    assert_same(world)
    assert world.live.last_step == "update of 1 device(s)"
    snapshot = world.live.snapshot(now=world.now, sources=world.sources())
    assert snapshot.capacity["n1"][RESOURCES[0]].window == 1
    assert snapshot.window_closes is not None
    world.now = snapshot.window_closes
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s)", "the window closed: its pod is derived again"
    assert world.live.snapshot(now=world.now, sources=world.sources()).capacity["n1"][RESOURCES[0]].raw_in_use == 1


def test_the_launcher_of_a_vmi_seen_ending_stays_its_holds_past_the_window_until_it_goes() -> None:
    """The VMI gone from the view (its end seen before its launcher's), the attachment naming its UID: the pod is
    the hold's past the grace, with no deadline, until the pod goes (model.coverage)."""
    world = World()
    seed(world)
    world.put("Pod", pod("p1", "tenant-a", resource=RESOURCES[0], units=1, node_name="n1", phase="Running",
                         claims="vm1", claimed_uid="vmi-uid-vm1", created=world.now))
    apply(world, ("device", "d0", "tenant-a", "a", 1, "Bound", "n1", "vm1", True, False, False))
    assert_same(world)
    world.now += timedelta(hours=1)
    assert_same(world)
    snapshot = world.live.snapshot(now=world.now, sources=world.sources())
    assert (snapshot.capacity["n1"][RESOURCES[0]].window, snapshot.capacity["n1"][RESOURCES[0]].raw_in_use) == (1, 0)
    world.put("Pod", None, ("tenant-a", "p1"))
    assert_same(world)
    assert world.live.snapshot(now=world.now, sources=world.sources()).capacity["n1"][RESOURCES[0]].window == 0


def test_a_report_is_an_update_of_that_node_whatever_its_names() -> None:
    world = World()
    seed(world)
    assert_same(world)
    for step in (("report", "n1", 4, 2, 1, "both"),   # its time moved: the agent's heartbeat
                 ("report", "n2", 1, 2, 0, "both"),   # fewer units of a name it serves
                 ("report", "n3", 4, 2, 7, "both")):  # a report gone stale
        apply(world, step)
        assert_same(world)
        assert world.live.last_step == "update of 0 device(s) and 1 report(s)"
    apply(world, ("report", "n1", 4, 0, 0, "A"))  # it serves no B any more: the effective names may change
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s) and 1 report(s)"


def test_a_new_nodes_first_report_is_an_update_whatever_its_names() -> None:
    """A fleet growing by thousands of nodes of one GPU kind must not rebuild the model per node."""
    world = World()
    seed(world)
    apply(world, ("drop report", "n3"))
    assert_same(world)
    apply(world, ("report", "n3", 4, 2, 0, "both"))  # n3 again: names every other node serves
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s) and 1 report(s)"
    apply(world, ("drop report", "n3"))
    assert_same(world)
    world.put(keys.GPUNODE_KIND, report("n3", {"example.com/NEW_GPU": 2}, reported=world.now))
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s) and 1 report(s)", "a name no one had: the names grow"


async def verify(world: World) -> str | None:
    """The safety net over the world's stores, as ``ReadModel.verify`` takes it: the live snapshot and the
    objects of one instant."""
    live = world.live.snapshot(now=world.now, sources=world.sources())
    objects = {kind: list(store.values()) for kind, store in world.stores.items()}
    return await world.live.verify(now=world.now, live=live, objects=objects, budget=0)


def break_node_refresh_in_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    """While an update runs, no node is refreshed; a from-scratch build (the safety net's) stays whole."""
    update = ModelTables.update

    def broken(self: ModelTables, **changes: Any) -> Snapshot:
        with pytest.MonkeyPatch.context() as during:
            during.setattr(NodeLedger, "refresh", lambda ledger, node: None)
            return update(self, **changes)

    monkeypatch.setattr(ModelTables, "update", broken)


async def test_the_safety_net_finds_a_broken_delta_names_where_and_the_next_snapshot_is_repaired(
        monkeypatch: pytest.MonkeyPatch) -> None:
    world = World()
    seed(world)
    assert_same(world)
    assert await verify(world) is None
    # A delta broken on purpose: a node's capacity is no longer refreshed when a device changes it.
    break_node_refresh_in_updates(monkeypatch)
    apply(world, ("device", "d0", "tenant-a", "a", 2, "Bound", "n1", None, False, False, False))
    drift = await verify(world)
    assert drift == "capacity['n1']"
    monkeypatch.undo()
    assert_same(world)
    assert world.live.last_step == "rebuild", "the drift was repaired by a build from the stores"


async def test_a_rebuild_runs_in_slices_and_takes_what_changed_during_them() -> None:
    """``refreshed`` lets the loop go between slices of a rebuild; a change made meanwhile is in its result."""
    world = World()
    seed(world)
    for i in range(3 * STEP):  # enough devices and pods for several slices
        apply(world, ("device", f"bulk-{i}", "tenant-a", "a", 1, "Bound", NODES[i % len(NODES)], None, False,
                      False, False))
    assert_same(world)
    world.replace_store("Node")  # a relist: a rebuild
    ticks = 0
    changed = False

    async def meanwhile() -> None:
        nonlocal ticks, changed
        while True:
            await asyncio.sleep(0)
            ticks += 1
            if ticks == 2:  # during the rebuild: a device and a node change, as a watch would deliver them
                apply(world, ("device", "d0", "tenant-a", "a", 2, "Bound", "n1", None, False, False, False))
                apply(world, ("node", "n2", False, False, True, 1))
                changed = True

    async with asyncio.TaskGroup() as group:
        ticker = group.create_task(meanwhile())
        snapshot = await world.live.refreshed(now=world.now, sources=world.sources(), budget=0)
        ticker.cancel()
    assert changed, "the loop ran between slices"
    assert ticks > 3
    assert world.live.last_step.startswith("update"), "what changed during the slices came as an update after"
    live, reference = normal(snapshot), normal(world.reference())
    for name in reference:
        assert live[name] == reference[name], name


@pytest.mark.parametrize("names_change", [False, True])
async def test_reports_and_nodes_changed_by_the_many_are_taken_in_slices(monkeypatch: pytest.MonkeyPatch,
                                                                         names_change: bool) -> None:
    """A fleet's agents reporting at once: ``refreshed`` takes the noted reports and Node views a chunk an
    update, with the loop let go between (one update of 5,000 held it about 0.2 s); the result is the
    reference's, whether or not a report's names changed."""
    monkeypatch.setattr(live_module, "NODE_CHUNK", 1)
    world = World()
    seed(world)
    apply(world, ("device", "d0", "tenant-a", "a", 1, "Bound", "n1", None, False, False, False))
    assert_same(world)
    for name in NODES:
        apply(world, ("report", name, 3, 2, 1, "both"))  # what each serves moved; names kept
    apply(world, ("node", "n2", True, True, True, 1))  # cordoned
    if names_change:
        world.put(keys.GPUNODE_KIND, report("n3", {RESOURCES[0]: 4}, reported=world.now))
    apply(world, ("device", "d1", "tenant-a", "a", 1, "Bound", "n3", None, False, False, False))
    ticks = 0

    async def meanwhile() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1

    async with asyncio.TaskGroup() as group:
        ticker = group.create_task(meanwhile())
        snapshot = await world.live.refreshed(now=world.now, sources=world.sources(), budget=0)
        ticker.cancel()
    assert ticks >= 2, "the loop ran between the chunks"
    assert world.live.last_step == "update of 1 device(s)", "the nodes came before, a chunk an update"
    live, reference = normal(snapshot), normal(world.reference())
    for name in reference:
        assert live[name] == reference[name], name


def test_a_budget_set_changed_or_dropped_is_an_update_that_judges_every_unsettled_order_again() -> None:
    """A tenant quota replaces that tenant's budgets (it rebuilt the model); a cycle that kept orders Pending for
    want of budget is told to judge every unsettled order again (the change log's usage)."""
    world = World()
    seed(world)
    apply(world, ("device", "d0", "tenant-a", "a", 1, "Pending", None, None, False, False, False))
    assert_same(world)
    before = world.live.snapshot(now=world.now, sources=world.sources())
    for step in (("quota", "tenant-a", 1), ("quota", "tenant-a-b", 3), ("drop quota", "tenant-a")):
        apply(world, step)
        assert_same(world)
        assert world.live.last_step == "update of 0 device(s) and 1 quota(s)"
    after = world.live.snapshot(now=world.now, sources=world.sources())
    changes = after.changes_since(before)
    assert changes is not None
    assert changes.usage
    assert "tenant-a" in before.budgets
    assert "tenant-a" not in after.budgets
    total = after.budgets["tenant-a-b"].total
    assert total is not None
    assert total.amount == 3


def test_a_class_that_keeps_its_resource_name_is_an_update_that_judges_the_sets_on_its_nodes_again() -> None:
    """A class's selector changed (it rebuilt the model): its availability is made again, and every node serving
    its name is in the change log, so a set held on a node it no longer selects is judged again."""
    world = World()
    seed(world)
    world.put("Node", node("n2", labelled=False))
    apply(world, ("device", "d0", "tenant-a", "a", 1, "Bound", "n2", None, False, False, False))
    assert_same(world)
    before = world.live.snapshot(now=world.now, sources=world.sources())
    assert "n2" in before.availability["a"].node_free
    world.put(keys.GPUCLASS_KIND, gpu_class("a", RESOURCES[0], selector=True))
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s) and 1 class(es)"
    after = world.live.snapshot(now=world.now, sources=world.sources())
    assert "n2" not in after.availability["a"].node_free
    assert before.availability["a"].node_free.keys() >= {"n2"}, "the snapshot handed out kept its own"
    changes = after.changes_since(before)
    assert changes is not None
    assert {"n1", "n2", "n3"} <= changes.nodes
    assert RESOURCES[0] in changes.names
    # Another resource name moves the units its holds count under: still an update.
    world.put(keys.GPUCLASS_KIND, gpu_class("a", RESOURCES[1], selector=True))
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s) and 1 class(es)"


def test_each_rebuild_says_why() -> None:
    """The reasons a live model gives for building again (the rebuilds metric's label): a first build, a
    change of the DRA offers, a store listed again."""
    reasons: list[str] = []
    world = World()
    world.live = LiveSnapshot(report_stale_after=STALE, on_rebuild=reasons.append)
    seed(world)
    assert_same(world)
    apply(world, ("device", "d0", "tenant-a", "a", 1, "Bound", "n1", None, False, False, False))
    assert_same(world)  # an update: no reason given
    world.put(keys.GPUCLASS_KIND, gpu_class("a", RESOURCES[0], selector=True))  # an update: no reason
    assert_same(world)
    world.put(keys.GPUCLASS_KIND, gpu_class("a", RESOURCES[1]))  # another resource name: an update too
    assert_same(world)
    world.replace_store("Node")
    assert_same(world)
    world.put("ResourceSlice", dra_driver.resource_slice("n3", "uid-n3", 2), ("", dra_driver.slice_name("n3")))
    assert_same(world)
    world.put(keys.GPUCLASS_KIND, None, ("", "c"))  # the DRA class gone
    assert_same(world)
    assert reasons == ["first build", "Node listed again", "ResourceSlice changed",
                       f"{keys.GPUCLASS_KIND} selling DRA units changed"]


def test_a_nodes_first_real_report_after_its_empty_gpunode_is_an_update() -> None:
    """A fleet growing: each GPUNode is made empty and then reported; that report only adds known names, so
    it is an update (each one rebuilt the model: 294 rebuilds while 5,000 nodes joined)."""
    reasons: list[str] = []
    world = World()
    world.live = LiveSnapshot(report_stale_after=STALE, on_rebuild=reasons.append)
    seed(world)
    assert_same(world)
    world.put("Node", node("n4"))
    world.put(keys.GPUNODE_KIND, {"metadata": meta("n4"), "status": {}})
    assert_same(world)
    world.put(keys.GPUNODE_KIND, report("n4", {RESOURCES[0]: 2}, reported=world.now))
    assert_same(world)
    assert world.live.last_step.startswith("update"), world.live.last_step
    world.put(keys.GPUNODE_KIND, report("n4", {RESOURCES[0]: 2, "example.com/new": 1}, reported=world.now))
    assert_same(world)
    assert reasons == ["first build"], "a name no one knew is an update too"


async def test_a_rebuild_left_half_way_is_done_again() -> None:
    world = World()
    seed(world)
    for i in range(2 * STEP):
        apply(world, ("device", f"bulk-{i}", "tenant-a", "a", 1, "Bound", "n1", None, False, False, False))
    assert_same(world)
    world.replace_store("Node")  # a relist: a rebuild
    task = asyncio.create_task(world.live.refreshed(now=world.now, sources=world.sources(), budget=0))
    for _ in range(3):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert world.live.dirty, "a rebuild cut short leaves the next snapshot to rebuild"
    assert_same(world)
    assert world.live.last_step == "rebuild"


def test_a_tenants_own_claim_of_a_sold_device_class_counts_against_its_raw_budget_and_a_hold_does_not() -> None:
    """Raw use of DRA (SPEC §1.5): a claim of the tenant's own holding two GPUs a DRA class sells counts two
    under the class's resource name, as a raw pod asking for them would; the device's own hold counts as the
    device, not again."""
    world = World()
    seed(world)
    world.put("ResourceQuota", {"metadata": meta(keys.TENANT_QUOTA_NAME, "tenant-a"), "spec": {"hard": {
        keys.QUOTA_TOTAL: "6", f"requests.{DRA_RESOURCE}": "3"}}})
    assert_same(world)
    world.put("ResourceClaim", claim("c1", "tenant-a-b", "n1", (0, 1), held=False))
    world.put("ResourceClaim", claim("d0", "tenant-a", "n2", (0,), held=True))
    snapshot = world.live.snapshot(now=world.now, sources=world.sources())
    assert world.live.last_step == "update of 0 device(s) and 2 claim(s)"
    assert snapshot.subtree_usage["tenant-a"].raw == {DRA_RESOURCE: 2}, "the child's claim, in the parent's subtree"
    [entry] = [e for e in catalog(snapshot, "tenant-a") if e.class_name == "c"]
    assert entry.remaining_budget == 1, entry
    assert DRA_RESOURCE not in snapshot.capacity["n1"], "the claim's GPUs, the node's two, are no one's to place"
    assert snapshot.capacity["n2"][DRA_RESOURCE].served == 2, "the hold's GPU stays served: its device holds it"
    assert_same(world)


def test_a_name_that_comes_or_goes_is_an_update_that_derives_what_reads_it_again() -> None:
    """A node's report naming a GPU no one named, a class of that name, KubeVirt's table listing it: each
    moves the effective names (R-MOD-9), and the pods asking for the name and the budgets naming it are
    derived again, in an update (each rebuilt the whole model)."""
    reasons: list[str] = []
    world = World()
    world.live = LiveSnapshot(report_stale_after=STALE, on_rebuild=reasons.append)
    seed(world)
    world.put("ResourceQuota", quota("tenant-a", 6, {NEW: 1}))
    world.put("Pod", pod("p3", "tenant-a", resource=NEW, units=2, node_name="n1", phase="Running"))
    assert_same(world)
    before = world.live.snapshot(now=world.now, sources=world.sources())
    assert NEW not in before.effective_names
    steps: tuple[tuple[Callable[[], None], str], ...] = (
        (lambda: world.put(keys.GPUNODE_KIND, report("n3", {RESOURCES[0]: 4, NEW: 2}, reported=world.now)),
         "update of 0 device(s) and 1 report(s)"),
        (lambda: world.put(keys.GPUNODE_KIND, report("n3", {RESOURCES[0]: 4}, reported=world.now)),
         "update of 0 device(s) and 1 report(s)"),
        (lambda: world.put(keys.GPUCLASS_KIND, gpu_class("x", NEW)), "update of 0 device(s) and 1 class(es)"),
        (lambda: world.put(keys.GPUCLASS_KIND, None, ("", "x")), "update of 0 device(s) and 1 class(es)"),
        (lambda: world.put("KubeVirt", kubevirt((RESOURCES[0], NEW))), "update of 0 device(s) and 1 KubeVirt table(s)"),
        (lambda: world.put("KubeVirt", kubevirt((RESOURCES[0],))), "update of 0 device(s) and 1 KubeVirt table(s)"),
    )
    for i, (step, expected) in enumerate(steps):
        step()
        assert_same(world)
        assert world.live.last_step == expected
        after = world.live.snapshot(now=world.now, sources=world.sources())
        named = i % 2 == 0
        assert (NEW in after.effective_names) is named
        assert (NEW in after.budgets["tenant-a"].raw) is named
        usage = after.subtree_usage.get("tenant-a")
        assert (usage.raw.get(NEW, 0) if usage is not None else 0) == (2 if named else 0)
        changes = after.changes_since(before)
        assert changes is not None
        assert NEW in changes.names
        before = after
    assert reasons == ["first build"]


def test_a_class_renamed_added_or_gone_and_a_namespace_are_updates() -> None:
    """A class that sells another resource name moves the units its devices hold to that name; a class that
    comes or goes, and a namespace that comes or goes, are updates too."""
    reasons: list[str] = []
    world = World()
    world.live = LiveSnapshot(report_stale_after=STALE, on_rebuild=reasons.append)
    seed(world)
    apply(world, ("device", "d0", "tenant-a", "a", 2, "Bound", "n1", None, False, False, False))
    assert_same(world)
    world.put(keys.GPUCLASS_KIND, gpu_class("a", RESOURCES[1]))
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s) and 1 class(es)"
    snapshot = world.live.snapshot(now=world.now, sources=world.sources())
    assert snapshot.capacity["n1"][RESOURCES[1]].held == 2
    assert snapshot.capacity["n1"][RESOURCES[0]].held == 0
    world.put(keys.GPUCLASS_KIND, None, ("", "a"))
    assert_same(world)
    assert "a" not in world.live.snapshot(now=world.now, sources=world.sources()).availability
    world.put(keys.GPUCLASS_KIND, gpu_class("a", RESOURCES[0]))
    assert_same(world)
    world.put("Namespace", {"metadata": meta("tenant-a-x")})
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s) and 1 namespace(s)"
    world.put("Namespace", None, ("", "tenant-c"))
    assert_same(world)
    assert world.live.last_step == "update of 0 device(s) and 1 namespace(s)"
    assert reasons == ["first build"]


def test_a_rebuild_logs_what_it_changed_so_the_next_cycle_plans_only_that() -> None:
    """A relist rebuilds the model; its change log names what differs from the model before (a device
    changed while the watch was down), not "everything", so the next cycle plans only that."""
    world = World()
    seed(world)
    apply(world, ("device", "d0", "tenant-a", "a", 1, "Bound", "n1", None, False, False, False))
    apply(world, ("device", "d1", "tenant-a", "a", 1, "Bound", "n2", None, False, False, False))
    assert_same(world)
    before = world.live.snapshot(now=world.now, sources=world.sources())
    world.replace_store(keys.GPUDEVICE_KIND)
    assert_same(world)
    assert world.live.last_step == "rebuild"
    quiet = world.live.snapshot(now=world.now, sources=world.sources()).changes_since(before)
    assert quiet is not None, "a rebuild keeps the log"
    assert (quiet.devices, quiet.nodes, quiet.vmis, quiet.names, quiet.usage) == (frozenset(), frozenset(),
                                                                                  frozenset(), frozenset(), False)
    # The watch down: d1 moved to n3, seen only by the relist.
    moved_away = device("d1", "tenant-a", class_name="a", count=1, phase="Bound", node_name="n3", vmi=None,
                        uid="an-old-uid", deleting=False, request=None)
    world.deaf = True  # the watch is down
    world.put(keys.GPUDEVICE_KIND, moved_away)
    world.deaf = False
    world.replace_store(keys.GPUDEVICE_KIND)
    assert_same(world)
    assert world.live.last_step == "rebuild"
    moved = world.live.snapshot(now=world.now, sources=world.sources()).changes_since(before)
    assert moved is not None
    assert moved.devices == {("tenant-a", "d1")}
    assert moved.nodes == {"n2", "n3"}
    assert moved.names == {RESOURCES[0]}


def test_a_rebuild_names_the_vm_whose_launcher_changed_unseen() -> None:
    world = running_vm()
    before = world.live.snapshot(now=world.now, sources=world.sources())
    world.deaf = True  # the watch is down: the launcher finishes
    world.put("Pod", pod("p1", "tenant-a", resource=RESOURCES[0], units=2, node_name="n1", phase="Succeeded"))
    world.deaf = False
    world.replace_store("Pod")
    assert_same(world)
    assert world.live.last_step == "rebuild"
    changes = world.live.snapshot(now=world.now, sources=world.sources()).changes_since(before)
    assert changes is not None
    assert changes.vmis == {("tenant-a", "vm1")}
