"""What one event costs the binder — folding it, and the placement cycle it causes.

    python bench/bench_events.py [--sizes 1000,5000,10000] [--quick] [--reps 9] [--profile]

In-process, on the code as it stands: the real ``Binder`` over a real
``Cache``, faked at the client boundary only (``bench/fakeapi.py``: LIST and
WATCH from memory, the binder's own patches, creates and deletes echoed back
as watch events with new resourceVersions). The binder's own lanes
(``binder.LANES``) are asked for as ``binder_driver`` asks for them: the
trigger it builds (``cache.trigger(*binder.kinds, name=NAME,
when=binder.worth_a_pass())``) asks for every lane but the check, a bind
request or new order for placement, a key's time coming (a held-back report,
an idle-hold deadline) for its work's lane; the bench runs the lanes asked
for itself, in the driver's order, each until it says it is done, and waits
before each pass until the cache has seen the last pass's writes, as the
driver does (R-BIND-2). Time is a ``FakeClock`` moved by hand
(1.01 s before each event, so a report held back by ``report_every`` is due
again and nothing goes stale).

The world (the issue's shapes) at N nodes: N Ready Nodes with GPUNode reports
of 8 units each, one GPUClass, N GPUDevices Bound one per node, the first N/5
attached to N/5 running VMIs with their launcher pods (the GPU pods), in 20
tenant namespaces; the class and GPUNode reports and the finalizers are
already what the binder would write, so the first full pass writes nothing.

Per event kind, ``--reps`` times each (median), after the system is quiet:

- a Node heartbeat (its conditions' ``lastHeartbeatTime``): nothing a
  decision reads;
- one Node label changed;
- one GPUNode ``lastReport`` moved (the agent's heartbeat);
- one GPU pod bound (``spec.nodeName`` set on a pod asking for a unit,
  created unbound before the measurement);
- one bind request (``status.bindRequest`` on a Bound device, as the VMI
  webhook writes it): the answer pass;
- one new order (a GPUDevice created): the answer pass (a placement cycle)
  that binds it;
- a VM stopped: its VMI deleted once its launcher pod is gone (KubeVirt's
  order; the pod's deletion is folded and passed first, untimed);
- a tenant quota set or changed (``tenant-quota``'s ``spec.hard``);
- a node's report naming a GPU no one reported (the effective names grow);
- a second GPUClass moved to another resource name (created by the first
  repetition);
- a tenant namespace created;
- a VM without GPUs started: its VMI listing a launcher that asks for no GPU
  (the launcher created before the measurement, untimed).

For each it prints the time to fold the event (the reflector's whole
handling: transform, freeze, store, indexes, every handler —
``LiveSnapshot.changed``, the binder's — and the triggers'
predicates), whether it fired the trigger and asked for placement, the
placement pass it caused (for a request or a new order: the answer), and
every pass until nothing was asked for (each lane's, and those the echoes of
its writes caused: a class report, a finalizer), summed: what the event
costs the binder.
Then the from-scratch snapshot build (a fresh ``LiveSnapshot``: nothing
memoised) and a rebuild with a warm memo (what a pass pays when the live
snapshot must be derived again). Last, the issue's table per size with the
growth from the smallest size to the largest, and each target with its ratio.
Nothing is asserted: the figures are for people. ``gc.collect()`` runs before
each event (outside the timings), so a collection owed by the last event
does not land in the next one; logging stays at its default (warnings).
``--profile`` adds, at the largest size, one more repetition per event kind
whose passes are cProfile'd, per lane (printed as it is taken, before that
size's table): the cozygpu functions on top by cumulative and by own time.

How long, on a shared two-core machine: ``--quick`` (200 and 1,000 nodes)
about 15 s; the default (1,000, 5,000 and 10,000 nodes, 9 repetitions) about
3 minutes, peak RSS about 0.5 GB (the 10,000-node world: the fake API's
objects, the cache's and the snapshot).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import gc
import io
import math
import pstats
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Final

import attrs
from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.fakeapi import FakeApi, Obj, merge  # noqa: E402
from cozygpu import keys  # noqa: E402
from cozygpu.base.clock import FakeClock  # noqa: E402
from cozygpu.binder import ledger, reports  # noqa: E402
from cozygpu.binder.assumed import StaleWrites  # noqa: E402
from cozygpu.binder.binder import LANES, PLACEMENT, VERIFY, Binder, BinderConfig  # noqa: E402
from cozygpu.binder.loop import NAME  # noqa: E402
from cozygpu.binder.metrics import BinderMetrics  # noqa: E402
from cozygpu.binder.writes import device_status_path  # noqa: E402
from cozygpu.cache.cache import Cache  # noqa: E402
from cozygpu.cache.errors import KindNotServed  # noqa: E402
from cozygpu.cache.reflector import ReflectorSettings  # noqa: E402
from cozygpu.cache.triggers import Trigger  # noqa: E402
from cozygpu.kube import errors, resource_path  # noqa: E402
from cozygpu.passes.driver import Lane, Progress  # noqa: E402
from cozygpu.passes.writes import Writes  # noqa: E402
from cozygpu.views import specs  # noqa: E402
from cozygpu.views.build import build_snapshot  # noqa: E402
from cozygpu.views.live import LiveSnapshot, Source  # noqa: E402

RESOURCE: Final = "nvidia.com/GH100_H100_SXM5_80GB"
CLASS: Final = "h100"
TENANTS: Final = 20
UNITS_PER_NODE: Final = 8
#: The time moved before each event: past ``report_every`` (1 s), so a report held back is due again.
STEP: Final = 1.01
#: Passes one event may cause before the bench gives up on the system going quiet.
MAX_PASSES: Final = 40
#: Repetitions are bounded so the fake clock (``STEP`` per event) stays well inside the reports' 5 min freshness.
MAX_REPS: Final = 20
PROFILE_LINES: Final = 10

NODE_TARGET_MS: Final = 10.0
GROWTH_TARGET: Final = 1.5

NODES = resource_path("", "v1", "nodes")
PODS = resource_path("", "v1", "pods")
NAMESPACES = resource_path("", "v1", "namespaces")
QUOTAS = resource_path("", "v1", "resourcequotas")
CLASSES = resource_path(keys.GROUP, keys.VERSION, keys.GPUCLASS_PLURAL)
DEVICES = resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL)
GPUNODES = resource_path(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL)
VMIS = resource_path("kubevirt.io", "v1", "virtualmachineinstances")
CRDS = resource_path("apiextensions.k8s.io", "v1", "customresourcedefinitions")
CORE = {"nodes": False, "pods": True, "namespaces": False, "resourcequotas": True, "events": True}


def iso(when: datetime) -> str:
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


# -- the world ---------------------------------------------------------------------------------------


def crd(group: str, version: str, plural: str, kind: str, scope: str) -> Obj:
    return {"metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "names": {"plural": plural, "kind": kind}, "scope": scope,
                     "versions": [{"name": version, "served": True, "storage": True}]},
            "status": {"conditions": [{"type": "Established", "status": "True"}]}}


def node_conditions(heartbeat: str) -> list[Obj]:
    pressure = [{"type": kind, "status": "False", "reason": f"KubeletHas{reason}", "message": "ok",
                 "lastHeartbeatTime": heartbeat, "lastTransitionTime": "2026-12-01T10:00:00Z"}
                for kind, reason in (("MemoryPressure", "SufficientMemory"), ("DiskPressure", "NoDiskPressure"),
                                     ("PIDPressure", "SufficientPID"))]
    return [*pressure, {"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "kubelet is posting ready status", "lastHeartbeatTime": heartbeat,
                        "lastTransitionTime": "2026-12-01T10:00:00Z"}]


def node(name: str, heartbeat: str) -> Obj:
    capacity = {"cpu": "128", "memory": "1056Gi", "pods": "250", RESOURCE: str(UNITS_PER_NODE)}
    return {"metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "kubevirt.io/schedulable": "true", "nvidia.com/gpu.present": "true",
                "topology.kubernetes.io/zone": "zone-a"}},
            "spec": {"podCIDR": "10.244.1.0/24"},
            "status": {"conditions": node_conditions(heartbeat), "capacity": capacity, "allocatable": capacity,
                       "images": [{"names": [f"registry.example/image-{i}@sha256:{i:064x}"], "sizeBytes": 10**8}
                                  for i in range(10)]}}


def gpunode(name: str, report: str) -> Obj:
    devices = [{"address": f"0000:{d + 1:02x}:00.0", "resourceName": RESOURCE, "allocatable": 1,
                "driver": "vfio-pci"} for d in range(UNITS_PER_NODE)]
    return {"apiVersion": keys.API_VERSION, "kind": keys.GPUNODE_KIND, "metadata": {"name": name},
            "status": {"devices": devices, "resourceNames": [RESOURCE],
                       "agent": {"version": "0.1.0", "lastReport": report}}}


def gpu_pod(namespace: str, name: str, *, node_name: str | None, uid: str | None = None,
            owner: tuple[str, str] | None = None) -> Obj:
    """A pod asking for one unit (a launcher when ``owner`` names its VMI)."""
    resources = {"requests": {"cpu": "4", "memory": "17Gi", RESOURCE: "1"},
                 "limits": {"cpu": "4", "memory": "17Gi", RESOURCE: "1"}}
    meta: Obj = {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4()),
                 "creationTimestamp": "2026-12-01T10:00:00Z"}
    if owner is not None:
        meta["labels"] = {keys.KUBEVIRT_LAUNCHER_LABEL: keys.KUBEVIRT_LAUNCHER_VALUE,
                          "kubevirt.io/created-by": owner[1]}
        meta["ownerReferences"] = [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                                    "name": owner[0], "uid": owner[1], "controller": True,
                                    "blockOwnerDeletion": True}]
    spec: Obj = {"containers": [{"name": "compute", "image": "example/compute:1", "resources": resources}],
                 "restartPolicy": "Never"}
    if node_name is not None:
        spec["nodeName"] = node_name
    return {"metadata": meta, "spec": spec, "status": {"phase": "Running" if node_name else "Pending"}}


def world(n: int, now: datetime) -> dict[str, list[Obj]]:
    """The issue's shapes at ``n`` nodes, by collection (see the module docstring)."""
    stamp = iso(now)
    tenants = [f"tenant-e{i}" for i in range(TENANTS)]
    out: dict[str, list[Obj]] = {
        CRDS: [crd(keys.GROUP, keys.VERSION, keys.GPUCLASS_PLURAL, keys.GPUCLASS_KIND, "Cluster"),
               crd(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, keys.GPUDEVICE_KIND, "Namespaced"),
               crd(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL, keys.GPUNODE_KIND, "Cluster"),
               crd("kubevirt.io", "v1", "virtualmachineinstances", "VirtualMachineInstance", "Namespaced"),
               crd("kubevirt.io", "v1", "kubevirts", "KubeVirt", "Namespaced")],
        NAMESPACES: [{"metadata": {"name": t}} for t in tenants],
        CLASSES: [{"apiVersion": keys.API_VERSION, "kind": keys.GPUCLASS_KIND,
                   "metadata": {"name": CLASS, "finalizers": [keys.CLASS_FINALIZER]},
                   "spec": {"vendor": "NVIDIA", "model": "H100", "mode": "Passthrough", "memory": "80Gi",
                            "resourceName": RESOURCE, "source": {"devicePlugin": {}}}}],
        NODES: [node(f"node-{i:05d}", stamp) for i in range(n)],
        GPUNODES: [gpunode(f"node-{i:05d}", stamp) for i in range(n)],
        VMIS: [], PODS: [], DEVICES: [],
    }
    for i in range(max(1, n // 5)):
        namespace, name, node_name = tenants[i % TENANTS], f"vm-{i}", f"node-{i:05d}"
        vmi_uid, pod_uid = str(uuid.uuid4()), str(uuid.uuid4())
        out[VMIS].append({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                          "metadata": {"name": name, "namespace": namespace, "uid": vmi_uid},
                          "spec": {"domain": {"devices": {}}},
                          "status": {"phase": "Running", "nodeName": node_name, "activePods": {pod_uid: node_name}}})
        out[PODS].append(gpu_pod(namespace, f"virt-launcher-{name}-x{i}", node_name=node_name, uid=pod_uid,
                                 owner=(name, vmi_uid)))
    for i in range(n):
        node_name = f"node-{i:05d}"
        status: Obj = {"phase": "Bound", "nodeName": node_name, "observedGeneration": 1, "conditions": [
            {"type": "Bound", "status": "True", "reason": "Placed", "message": f"holds 1 unit on {node_name}",
             "lastTransitionTime": "2026-12-01T10:00:00Z", "observedGeneration": 1}]}
        if i < len(out[VMIS]):
            vmi = out[VMIS][i]["metadata"]
            status["attachment"] = {"vmi": vmi["name"], "uid": vmi["uid"], "attachedAt": "2026-12-01T10:00:00Z",
                                    "requestId": uuid.uuid4().hex}
        out[DEVICES].append({"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND,
                             "metadata": {"name": f"gpu-{i}", "namespace": tenants[i % TENANTS],
                                          "finalizers": [keys.DEVICE_FINALIZER]},
                             "spec": {"className": CLASS, "count": 1}, "status": status})
    return out


def reports_written_already(api: FakeApi, now: datetime) -> None:
    """Put in the class and GPUNode reports and the holds' ledgers the binder would write, as if it had been
    running."""
    objects = {c: list(api.objects.get(c, {}).values()) for c in (CLASSES, DEVICES, GPUNODES, NODES, PODS, VMIS,
                                                                  NAMESPACES)}
    snapshot = build_snapshot(now=now, classes=objects[CLASSES], devices=objects[DEVICES],
                              gpunodes=objects[GPUNODES], nodes=objects[NODES], pods=objects[PODS],
                              vmis=objects[VMIS], namespaces=objects[NAMESPACES])
    for write in reports.report_writes(snapshot, objects[CLASSES], objects[GPUNODES], now=now):
        merge(api.get_object(write.path), {"status": dict(write.status)})
    by_key = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in objects[DEVICES]}
    for held in ledger.ledger_writes(snapshot, by_key, snapshot.devices.keys(), now=now):
        merge(api.get_object(device_status_path(held.key)), {"status": dict(held.status)})


# -- the rig: cache, binder, lanes -----------------------------------------------------------------


@attrs.frozen
class PassRecord:
    lane: Lane
    seconds: float
    #: The fake API's writes during the pass: ``"PATCH gpuclasses"`` -> how many.
    wrote: tuple[tuple[str, int], ...]
    outcome: str

    @property
    def writes(self) -> int:
        return sum(count for _, count in self.wrote)


@attrs.frozen
class Sample:
    kind: str
    fold: float
    #: The trigger fired (every lane but the check asked for), and placement was asked for.
    triggered: bool
    placement_asked: bool
    passes: tuple[PassRecord, ...]

    @property
    def placement(self) -> PassRecord | None:
        """The first placement pass it caused."""
        return next((p for p in self.passes if p.lane is PLACEMENT), None)

    @property
    def seconds(self) -> float:
        """Every pass it caused, summed."""
        return sum(p.seconds for p in self.passes)


class Rig:
    """The binder over its cache on the fake API, with its lanes run by hand as the driver runs them."""

    def __init__(self, api: FakeApi, clock: FakeClock) -> None:
        self.api = api
        self.clock = clock
        registry = CollectorRegistry()
        self.config = BinderConfig(identity="bench")
        self.cache = Cache(api, registry=registry, clock=clock,
                           settings=ReflectorSettings(inactivity_timeout=1e9))  # the fake clock is moved by hand
        self.binder = Binder(self.cache, api, self.config, clock=clock, metrics=BinderMetrics.on(registry))
        # The trigger and the requests, as ``binder_driver`` builds them.
        self.trigger: Trigger = self.cache.trigger(*self.binder.kinds, name=NAME, when=self.binder.worth_a_pass())
        self.asked: dict[Lane, set[str]] = {lane: set() for lane in LANES}
        self.passes = self.binder.lanes()
        self.binder.on_request(lambda: self.ask(PLACEMENT, "bind request"))
        for lane, queue in self.binder.queues().items():
            queue.on_ready(functools.partial(self.ask, lane, "a key's time came"))
        #: While an event is profiled: one profile per lane of the passes it causes (the fold is not in them).
        self.profiles: dict[Lane, cProfile.Profile] | None = None

    def ask(self, lane: Lane, why: str) -> None:
        self.asked[lane].add(why)

    def ask_all(self, why: str) -> None:
        """Every lane but the check, as the driver's trigger asks for them."""
        for lane in LANES:
            if lane is not VERIFY:
                self.ask(lane, why)

    async def synced(self) -> None:
        served = [s for s in self.binder.kinds if s.group in ("", keys.GROUP, "kubevirt.io")]
        await self.cache.wait_synced(*served, timeout=600)
        for spec in self.binder.kinds:
            informer = self.cache.informer(spec)
            if not (informer.has_synced or informer.served is False):
                raise RuntimeError(f"{spec.key}: neither listed nor known unserved")

    async def drain(self) -> None:
        """Until the cache has folded every event the fake API sent on a kind the binder reads."""
        for spec in self.binder.kinds:
            latest = self.api.latest.get(spec.path)
            if latest is not None and self.cache.is_served(spec):
                await self.cache.wait_for_resource_version(spec, str(latest), timeout=60)
        await self.api.folded()  # the cache may show an event before its fold is recorded

    async def run(self, lane: Lane) -> PassRecord:
        writes = Writes()
        before = dict(self.api.writes)
        outcome = "ok"
        profiler = self.profiles.setdefault(lane, cProfile.Profile()) if self.profiles is not None else None
        started = time.perf_counter()
        try:
            if profiler is not None:
                profiler.enable()
            if await self.passes[lane](writes, lambda: False) is Progress.MORE:
                self.ask(lane, "more")
        except (errors.Conflict, StaleWrites) as err:
            outcome = "requeued"
            self.ask(lane, f"requeued: {err}")
        except Exception as err:  # the driver logs and backs off; the bench shows it
            outcome = f"failed: {type(err).__name__}: {err}"
        finally:
            if profiler is not None:
                profiler.disable()
        seconds = time.perf_counter() - started
        for key, version in writes.items():  # read-your-writes, as the driver waits before the next pass
            await self.cache.wait_for_resource_version(key, version, timeout=60)
        wrote = tuple((key.split(" ")[0] + " " + key.rsplit("/", 1)[-1], count - before.get(key, 0))
                      for key, count in sorted(self.api.writes.items()) if count > before.get(key, 0))
        return PassRecord(lane, seconds, wrote, outcome)

    async def settle(self, bound: int = MAX_PASSES) -> list[PassRecord]:
        """Run the lanes asked for, in the driver's order, until nothing is asked (at most ``bound`` passes)."""
        passes: list[PassRecord] = []
        for _ in range(bound):
            await self.drain()
            if self.trigger.poll() is not None:
                self.ask_all("trigger")
            lane = next((lane for lane in LANES if self.asked[lane]), None)
            if lane is None:
                return passes
            self.asked[lane].clear()
            passes.append(await self.run(lane))
        raise RuntimeError(f"still asking for passes after {bound}: {self.asked}")

    async def quiet(self) -> None:
        """Move the clock past ``report_every`` and run what that asks for: the next event starts from rest."""
        self.clock.advance(STEP)
        await self.settle()
        gc.collect()

    async def event(self, kind: str, happen: Callable[[], object], *, profile: bool = False) -> Sample:
        """One event: what folding it took, which lanes it asked for, and every pass until quiet again."""
        await self.quiet()
        folded = len(self.api.folds)
        happen()
        await self.drain()
        triggered = self.trigger.poll() is not None
        if triggered:
            self.ask_all("trigger")
        placement = bool(self.asked[PLACEMENT])
        fold = sum(seconds for _, seconds in self.api.folds[folded:])
        self.profiles = {} if profile else None
        try:
            passes = await self.settle()
        finally:
            profiles, self.profiles = self.profiles, None
        if profiles:
            print_profile(kind, len(self.api.objects.get(NODES, {})), profiles)
        return Sample(kind, fold, triggered, placement, tuple(passes))

    def sources(self, identity: Callable[[object], object]) -> dict[str, Source | None]:
        """What ``Binder.snapshot`` hands its live snapshot, each store under ``identity(store)``."""
        out: dict[str, Source | None] = {}
        for kind, spec in specs.SNAPSHOT_SPECS.items():
            try:
                store = self.cache.store(spec)
            except KindNotServed:
                out[kind] = None
                continue
            out[kind] = Source(identity(store), store.list, store.get)
        return out

    def live(self) -> LiveSnapshot:
        return LiveSnapshot(hoster_names=self.config.hoster_names, report_stale_after=self.config.report_stale_after,
                            launcher_grace=self.config.launcher_grace)


# -- the events ----------------------------------------------------------------------------------------


@attrs.frozen
class Kind:
    label: str
    #: What happens, rep ``r`` of it, on the world of ``n`` nodes (the fake API's write).
    happen: Callable[[FakeApi, FakeClock, int, int], object]
    #: What must be true before it (untimed; its own passes run to rest first).
    prepare: Callable[[FakeApi, FakeClock, int, int], object] | None = None
    #: A row whose pass is an answer pass (targets compare it across sizes).
    answer: bool = False


def _free_node(n: int, rep: int, offset: int) -> int:
    """A node with no VMI on it, different for every repetition and event kind."""
    vmis = max(1, n // 5)
    return vmis + (offset * 97 + rep) % max(1, n - vmis)


def heartbeat(api: FakeApi, clock: FakeClock, n: int, rep: int) -> object:
    name = f"node-{_free_node(n, rep, 1):05d}"
    return api.patch_now(f"{NODES}/{name}/status", {"status": {"conditions": node_conditions(iso(clock.wall()))}})


def node_label(api: FakeApi, clock: FakeClock, n: int, rep: int) -> object:
    name = f"node-{_free_node(n, rep, 2):05d}"
    return api.patch_now(f"{NODES}/{name}", {"metadata": {"labels": {"bench.example/rack": f"r{rep}"}}})


def last_report(api: FakeApi, clock: FakeClock, n: int, rep: int) -> object:
    name = f"node-{_free_node(n, rep, 3):05d}"
    return api.patch_now(f"{GPUNODES}/{name}/status", {"status": {"agent": {"lastReport": iso(clock.wall())}}})


def _pod_name(rep: int) -> str:
    return f"gpu-job-{rep}"


def pod_created(api: FakeApi, clock: FakeClock, n: int, rep: int) -> object:
    return api.create_now(resource_path("", "v1", "pods", namespace="tenant-e0"),
                          gpu_pod("tenant-e0", _pod_name(rep), node_name=None))


def pod_bound(api: FakeApi, clock: FakeClock, n: int, rep: int) -> object:
    name = f"node-{_free_node(n, rep, 4):05d}"
    return api.patch_now(resource_path("", "v1", "pods", namespace="tenant-e0", name=_pod_name(rep)),
                         {"spec": {"nodeName": name}})


def bind_request(api: FakeApi, clock: FakeClock, n: int, rep: int) -> object:
    index = _free_node(n, rep, 5)
    path = resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, namespace=f"tenant-e{index % TENANTS}",
                         name=f"gpu-{index}", subresource="status")
    request = {"id": uuid.uuid4().hex, "vmi": f"vm-new-{rep}", "time": iso(clock.wall())}
    return api.patch_now(path, {"status": {"bindRequest": request}})


def new_order(api: FakeApi, clock: FakeClock, n: int, rep: int) -> object:
    namespace = f"tenant-e{rep % TENANTS}"
    return api.create_now(resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, namespace=namespace),
                          {"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND,
                           "metadata": {"name": f"order-{rep}", "creationTimestamp": iso(clock.wall())},
                           "spec": {"className": CLASS, "count": 1}})


def _vm(n: int, rep: int) -> tuple[str, str, str]:
    """A running VM of the world, different for every repetition: its namespace, VMI and launcher pod."""
    i = rep % max(1, n // 5)
    return f"tenant-e{i % TENANTS}", f"vm-{i}", f"virt-launcher-vm-{i}-x{i}"


def launcher_gone(api: FakeApi, clock: FakeClock, n: int, rep: int) -> object:
    """A VM stopping: KubeVirt deletes its launcher first, the VMI still listing it."""
    namespace, _, pod = _vm(n, rep)
    return api.delete_now(resource_path("", "v1", "pods", namespace=namespace, name=pod))


def vm_stopped(api: FakeApi, clock: FakeClock, n: int, rep: int) -> object:
    """The stop's end: the VMI goes (its devices' attachments are then the binder's to clear)."""
    namespace, vmi, _ = _vm(n, rep)
    return api.delete_now(resource_path("kubevirt.io", "v1", "virtualmachineinstances", namespace=namespace,
                                        name=vmi))


def quota_changed(api: FakeApi, clock: FakeClock, n: int, rep: int) -> object:
    """A tenant's GPU budget set or changed (its ``tenant-quota``)."""
    namespace = f"tenant-e{rep % TENANTS}"
    path = resource_path("", "v1", "resourcequotas", namespace=namespace)
    hard = {"spec": {"hard": {keys.QUOTA_TOTAL: str(100 + rep)}}}
    if (namespace, keys.TENANT_QUOTA_NAME) in api.objects.get(QUOTAS, {}):
        return api.patch_now(f"{path}/{keys.TENANT_QUOTA_NAME}", hard)
    return api.create_now(path, {"metadata": {"name": keys.TENANT_QUOTA_NAME}, **hard})


def report_named(api: FakeApi, clock: FakeClock, n: int, rep: int) -> object:
    """A node's agent reporting a GPU of a kind no one reported before: the effective names grow."""
    name = f"node-{_free_node(n, rep, 6):05d}"
    extra = f"nvidia.com/BENCH_NEW_{rep}"
    report = gpunode(name, iso(clock.wall()))["status"]
    report["devices"].append({"address": "0000:99:00.0", "resourceName": extra, "allocatable": 1,
                              "driver": "vfio-pci"})
    report["resourceNames"] = [RESOURCE, extra]
    return api.patch_now(f"{GPUNODES}/{name}/status", {"status": report})


def class_renamed(api: FakeApi, clock: FakeClock, n: int, rep: int) -> object:
    """A second class, created once and then moved to another resource name each time (its devices' units
    move with it; it has none here)."""
    name = f"{CLASS}-second"
    resource = f"nvidia.com/BENCH_CLASS_{rep}"
    if ("", name) in api.objects.get(CLASSES, {}):
        return api.patch_now(f"{CLASSES}/{name}", {"spec": {"resourceName": resource}})
    return api.create_now(CLASSES, {"apiVersion": keys.API_VERSION, "kind": keys.GPUCLASS_KIND,
                                    "metadata": {"name": name},
                                    "spec": {"vendor": "NVIDIA", "model": "L4", "mode": "Passthrough",
                                             "memory": "24Gi", "resourceName": resource,
                                             "source": {"devicePlugin": {}}}})


def namespace_created(api: FakeApi, clock: FakeClock, n: int, rep: int) -> object:
    """A new tenant namespace under an existing one."""
    return api.create_now(NAMESPACES, {"metadata": {"name": f"tenant-e{rep % TENANTS}-bench{rep}"}})


def _plain_vm(rep: int) -> tuple[str, str, str, str]:
    return "tenant-e0", f"plain-vm-{rep}", f"virt-launcher-plain-vm-{rep}", f"plain-vmi-uid-{rep}"


def plain_launcher(api: FakeApi, clock: FakeClock, n: int, rep: int) -> object:
    """The launcher pod of a VM without GPUs, as KubeVirt creates it before the VMI lists it."""
    namespace, vmi, pod, vmi_uid = _plain_vm(rep)
    body = gpu_pod(namespace, pod, node_name=f"node-{_free_node(n, rep, 7):05d}", uid=f"{pod}-uid",
                   owner=(vmi, vmi_uid))
    for container in body["spec"]["containers"]:
        for table in container["resources"].values():
            table.pop(RESOURCE)
    return api.create_now(resource_path("", "v1", "pods", namespace=namespace), body)


def plain_vm_started(api: FakeApi, clock: FakeClock, n: int, rep: int) -> object:
    """A VM without GPUs running: its VMI lists the launcher."""
    namespace, vmi, pod, vmi_uid = _plain_vm(rep)
    node_name = f"node-{_free_node(n, rep, 7):05d}"
    return api.create_now(resource_path("kubevirt.io", "v1", "virtualmachineinstances", namespace=namespace),
                          {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                           "metadata": {"name": vmi, "uid": vmi_uid}, "spec": {"domain": {"devices": {}}},
                           "status": {"phase": "Running", "nodeName": node_name,
                                      "activePods": {f"{pod}-uid": node_name}}})


KINDS: Final = (
    Kind("nothing a decision reads (a Node heartbeat)", heartbeat),
    Kind("one Node label changed", node_label),
    Kind("one GPUNode lastReport moved", last_report),
    Kind("one GPU pod bound", pod_bound, prepare=pod_created),
    Kind("answer pass, one bind request", bind_request, answer=True),
    Kind("answer pass, one new order", new_order, answer=True),
    Kind("a VM stopped (its VMI gone after its launcher)", vm_stopped, prepare=launcher_gone),
    Kind("a tenant quota changed", quota_changed),
    Kind("a GPUNode report naming a new GPU", report_named),
    Kind("a GPUClass's resource name changed", class_renamed),
    Kind("a tenant namespace created", namespace_created),
    Kind("a VM without GPUs started", plain_vm_started, prepare=plain_launcher),
)


# -- one size ----------------------------------------------------------------------------------------------


@attrs.frozen
class Row:
    """One event kind at one size: medians over its samples."""

    kind: Kind
    samples: tuple[Sample, ...]

    @property
    def fold_ms(self) -> float:
        return statistics.median(s.fold for s in self.samples) * 1000

    @property
    def fired(self) -> int:
        return sum(s.triggered for s in self.samples)

    @property
    def answered(self) -> int:
        return sum(s.placement_asked for s in self.samples)

    @property
    def placement_ms(self) -> float | None:
        """The placement pass it caused (for a request or an order: the answer), median."""
        found = [p.seconds for s in self.samples if (p := s.placement) is not None]
        return statistics.median(found) * 1000 if found else None

    @property
    def pass_ms(self) -> float | None:
        """Every pass it caused, summed, median (None: it caused none)."""
        caused = [s.seconds for s in self.samples if s.passes]
        return statistics.median(caused) * 1000 if caused else None

    @property
    def lane(self) -> str:
        seen = {p.lane for s in self.samples for p in s.passes}
        return "/".join(lane.value for lane in LANES if lane in seen) or "—"

    @property
    def cost_ms(self) -> float:
        """Folding plus every pass it causes (what the event costs the binder), median over samples."""
        return statistics.median(s.fold + s.seconds for s in self.samples) * 1000

    @property
    def answer_ms(self) -> float:
        """Folding plus the placement pass it causes (what an answer waits for), median over samples."""
        return statistics.median(s.fold + (p.seconds if (p := s.placement) else 0.0) for s in self.samples) * 1000

    @property
    def count(self) -> float:
        return statistics.median(len(s.passes) for s in self.samples)

    @property
    def writes(self) -> float:
        return statistics.median(sum(p.writes for p in s.passes) for s in self.samples)

    @property
    def what(self) -> str:
        """What the first sample's passes wrote, summed."""
        total: dict[str, int] = {}
        for record in self.samples[0].passes if self.samples else ():
            for key, count in record.wrote:
                total[key] = total.get(key, 0) + count
        return ", ".join(f"{key} {count}" for key, count in total.items())

    @property
    def outcomes(self) -> set[str]:
        return {p.outcome for s in self.samples for p in s.passes if p.outcome != "ok"}


@attrs.frozen
class SizeResult:
    n: int
    rows: tuple[Row, ...]
    build_ms: float
    rebuild_ms: float
    setup_s: float
    sync_s: float
    warmup: tuple[PassRecord, ...]

    def row(self, label: str) -> Row:
        return next(r for r in self.rows if r.kind.label == label)


def fmt(ms: float | None) -> str:
    if ms is None:
        return "—"
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 1 else f"{ms:.3f}"


def print_size(result: SizeResult, reps: int) -> None:
    warm = result.warmup
    print(f"\n## N={result.n}: world loaded in {result.setup_s:.1f} s, cache synced in {result.sync_s:.1f} s; "
          f"warm-up: {len(warm)} pass(es), {sum(p.writes for p in warm)} write(s), "
          f"its passes {fmt(sum(p.seconds for p in warm) * 1000)} ms; median of {reps}")
    print("| what happened | fold ms | trigger | placement asked | placement pass ms | every pass ms | passes, lanes "
          "| writes |")
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    for row in result.rows:
        what = f" ({row.what})" if row.what else ""
        note = f"; not ok: {', '.join(sorted(row.outcomes))}" if row.outcomes else ""
        print(f"| {row.kind.label} | {fmt(row.fold_ms)} | {row.fired}/{len(row.samples)} | "
              f"{row.answered}/{len(row.samples)} | {fmt(row.placement_ms)} | {fmt(row.pass_ms)} | "
              f"{row.count:g}: {row.lane} | {row.writes:g}{what}{note} |")
    print(f"| from-scratch snapshot build (a fresh LiveSnapshot) | | | | | {fmt(result.build_ms)} | | |")
    print(f"| snapshot rebuild, warm memo (a view changed) | | | | | {fmt(result.rebuild_ms)} | | |")


async def measure(n: int, *, reps: int, profile: bool = False) -> SizeResult:
    started = time.perf_counter()
    clock = FakeClock()
    api = FakeApi(core=CORE)
    for collection, objects in world(n, clock.wall()).items():
        api.load(collection, objects)
    reports_written_already(api, clock.wall())
    rig = Rig(api, clock)
    setup = time.perf_counter() - started
    async with rig.cache.running():
        started = time.perf_counter()
        await rig.synced()
        rig.binder.start()  # the works follow events in the term, as on the driver
        synced = time.perf_counter() - started
        rig.ask_all("start")  # the driver's first passes
        # The term's first passes judge every object, a slice of keys a pass (reconciler.SLICE).
        warmup = tuple(await rig.settle(bound=MAX_PASSES * 1000))
        rows = []
        for offset, kind in enumerate(KINDS):
            samples = []
            for rep in range(reps + (1 if profile else 0)):
                tag = rep + offset * 1000
                if kind.prepare is not None:
                    await rig.quiet()
                    kind.prepare(api, clock, n, tag)
                    await rig.settle()
                samples.append(await rig.event(kind.label, functools.partial(kind.happen, api, clock, n, tag),
                                               profile=rep == reps))
            rows.append(Row(kind, tuple(samples[:reps])))
        build, rebuild = build_times(rig, reps)
    rig.binder.close()
    return SizeResult(n, tuple(rows), build, rebuild, setup, synced, warmup)


def build_times(rig: Rig, reps: int) -> tuple[float, float]:
    """Medians, ms: a fresh ``LiveSnapshot`` over the cache (nothing memoised), and a rebuild with a warm memo."""
    now = rig.clock.wall()
    cold: list[float] = []
    for _ in range(reps):
        gc.collect()
        fresh = rig.live()
        started = time.perf_counter()
        fresh.snapshot(now=now, sources=rig.sources(lambda store: store))
        cold.append(time.perf_counter() - started)
    warm: list[float] = []
    kept = rig.live()
    kept.snapshot(now=now, sources=rig.sources(lambda store: store))
    for _ in range(reps):
        gc.collect()
        sources = rig.sources(lambda store: object())  # another identity: everything derived again
        started = time.perf_counter()
        kept.snapshot(now=now, sources=sources)
        warm.append(time.perf_counter() - started)
    return statistics.median(cold) * 1000, statistics.median(warm) * 1000


def print_profile(label: str, n: int, profiles: Mapping[Lane, cProfile.Profile]) -> None:
    """The passes an event caused, per lane: their cozygpu functions, top by cumulative time, then by own time."""
    for lane, profiler in sorted(profiles.items(), key=lambda item: item[0].value):
        print(f"\n### profile, N={n}: {label}; the {lane.value} passes it caused")
        for order, title in (("cumulative", "cumulative"), ("tottime", "own time")):
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(r"cozygpu/", PROFILE_LINES)
            lines = [line for line in out.getvalue().splitlines() if line.strip()]
            start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
            print(f"top {PROFILE_LINES} by {title}:")
            print("\n".join(line.replace(str(ROOT) + "/", "") for line in lines[start:start + PROFILE_LINES + 1]))


# -- all sizes ---------------------------------------------------------------------------------------------


def growth(first: float | None, last: float | None) -> str:
    if first is None or last is None or first <= 0:
        return "—"
    return f"{last / first:.2f}×"


def print_tables(results: Sequence[SizeResult]) -> None:
    sizes = [r.n for r in results]
    head = " | ".join(f"{n:,}" for n in sizes)
    span = f"{sizes[0]:,} → {sizes[-1]:,}"
    print("\n## every pass each event causes, summed, ms (median; the issue's table)")
    print(f"| what happened | {head} | growth {span} |")
    print("|---|" + "---:|" * (len(sizes) + 1))
    for kind in KINDS:
        rows = [r.row(kind.label) for r in results]
        cells = [fmt(row.pass_ms) if row.pass_ms is not None else f"no pass ({row.fired}/{len(row.samples)} fired)"
                 for row in rows]
        print(f"| {kind.label} | {' | '.join(cells)} | {growth(rows[0].pass_ms, rows[-1].pass_ms)} |")
    build = [r.build_ms for r in results]
    print(f"| from-scratch snapshot build | {' | '.join(fmt(b) for b in build)} | {growth(build[0], build[-1])} |")
    print("\n## folding the event, ms (median)")
    print(f"| what happened | {head} | growth {span} |")
    print("|---|" + "---:|" * (len(sizes) + 1))
    for kind in KINDS:
        rows = [r.row(kind.label) for r in results]
        print(f"| {kind.label} | {' | '.join(fmt(row.fold_ms) for row in rows)} | "
              f"{growth(rows[0].fold_ms, rows[-1].fold_ms)} |")


def _at(results: Sequence[SizeResult], n: int) -> tuple[SizeResult, str]:
    for result in results:
        if result.n == n:
            return result, ""
    nearest = max(results, key=lambda r: r.n)
    return nearest, f" (not run at {n:,}: shown at {nearest.n:,})"


def print_targets(results: Sequence[SizeResult]) -> None:
    print("\n## targets (ratio = figure / target; at most 1.00 is met)")
    fired = sum(r.row(KINDS[0].label).fired for r in results)
    total = sum(len(r.row(KINDS[0].label).samples) for r in results)
    print(f"- a heartbeat starts no cycle: {fired} of {total} heartbeats fired the trigger "
          f"({'met' if fired == 0 else 'missed'})")
    result, note = _at(results, 5000)
    row = result.row(KINDS[1].label)
    print(f"- one Node label change at 5,000 ≤ {NODE_TARGET_MS:g} ms{note}: fold {fmt(row.fold_ms)} + pass "
          f"{fmt(row.pass_ms)} = {fmt(row.cost_ms)} ms; ratio {row.cost_ms / NODE_TARGET_MS:.2f}")
    large, note = _at(results, 10000)
    small = next((r for r in results if r.n == 1000 and r.n < large.n), results[0])
    compared = note + (f" (compared with {small.n:,}, not 1,000)" if small.n != 1000 else "")
    for kind in (k for k in KINDS if k.answer):
        a, b = small.row(kind.label).answer_ms, large.row(kind.label).answer_ms
        grown = b / a if a > 0 else math.inf
        print(f"- {kind.label.removeprefix('answer pass, ')} at {large.n:,} ≤ {GROWTH_TARGET:g}× its cost at "
              f"{small.n:,}{compared}: {fmt(b)} / {fmt(a)} ms = {grown:.2f}×; ratio {grown / GROWTH_TARGET:.2f}")
    print(f"- from-scratch build at {large.n:,}{note}: {fmt(large.build_ms)} ms (reported; the rebuild with a "
          f"warm memo {fmt(large.rebuild_ms)} ms)")


def revision() -> str:
    """The commit measured, and whether cozygpu/ had uncommitted changes ("" outside a git checkout)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "cozygpu"], cwd=ROOT, capture_output=True,
                               text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"; commit {head}" + (" with uncommitted changes in cozygpu/" if dirty else "")


async def run(sizes: Sequence[int], *, reps: int, profile: bool = False) -> list[SizeResult]:
    """Measure every size in turn, print each as it is done, then the tables and targets."""
    print(f"# bench_events: sizes {', '.join(f'{n:,}' for n in sizes)}; {reps} repetition(s) per event kind"
          f"{revision()}")
    results = []
    for n in sizes:
        result = await measure(n, reps=reps, profile=profile and n == max(sizes))
        print_size(result, reps)
        results.append(result)
        gc.collect()
    print_tables(results)
    print_targets(results)
    return results


def parse_sizes(text: str) -> list[int]:
    sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    if not sizes or sizes[0] < 10:
        raise argparse.ArgumentTypeError("sizes are node counts of at least 10")
    return sizes


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=parse_sizes, default=[1000, 5000, 10000], help="node counts, comma-separated")
    parser.add_argument("--quick", action="store_true", help="sizes 200,1000")
    parser.add_argument("--reps", type=int, default=9, help="repetitions per event kind (median)")
    parser.add_argument("--profile", action="store_true", help="one cProfile'd repetition per kind, largest size")
    args = parser.parse_args(argv)
    sizes: list[int] = [200, 1000] if args.quick else args.sizes
    reps = max(1, min(args.reps, MAX_REPS))
    try:
        import uvloop
    except ImportError:
        asyncio.run(run(sizes, reps=reps, profile=args.profile))
    else:
        uvloop.run(run(sizes, reps=reps, profile=args.profile))


if __name__ == "__main__":
    main()
