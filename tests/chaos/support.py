"""The chaos test's instruments: a recorder of every hold's phase over the whole run, and the audit of the
API server's state (the four counters that must stay 0). The replicas' webhooks sit behind the local
plane's own Service, ``cozygpu.devcluster.balancer``.

- ``Recorder``: a list-then-watch of GPUDevices and Nodes for the whole run,
  direct to the API server (not through the replicas' proxy). It resumes from
  its last resourceVersion across an API server restart and lists again on a 410,
  turning what changed in between into transitions too. It keeps every phase
  transition of a device (phase and node, with the ``Bound`` condition the new
  state carries), when each order was first decided, and every moment one of the
  run's nodes was cordoned, NotReady, tainted or gone.
- ``audit``: from the API server's state now, the breaches of three promises:
  units double-booked, budgets exceeded (the model's budget reader, over the
  snapshot the CLI reads), running VMs detached. The fourth, holds that left
  Bound without a reason of their own, comes from the recorder
  (``Recorder.left_bound_without_reason``).
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from cozygpu import keys
from cozygpu.commands.common import read_cluster
from cozygpu.kube import Client, errors, resource_path

Obj = dict[str, Any]

DEVICES = resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL)
GPUNODES = resource_path(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL)
NODES = resource_path("", "v1", "nodes")
PODS = resource_path("", "v1", "pods")
VMIS = resource_path("kubevirt.io", "v1", "virtualmachineinstances")
FINAL_POD_PHASES = ("Succeeded", "Failed")
#: The Bound condition reason of a device moved to join the rest of its own VMI's set (its own VM's start).
GATHERED = "Gathered"


def now() -> float:
    return time.monotonic()


# -- the recorder ----------------------------------------------------------------------------------------


@attrs.frozen
class Transition:
    """A device's (phase, node) changed; ``new`` is None when the device was deleted."""

    at: float
    namespace: str
    name: str
    old: tuple[str | None, str | None]
    new: tuple[str | None, str | None] | None
    deleting: bool
    reason: str
    message: str
    #: Seen by a list after a 410, not by a watch event: what happened in between is folded.
    relisted: bool = False

    @property
    def left_bound(self) -> bool:
        """The hold left Bound, or left its node while Bound (a move)."""
        return self.old[0] == "Bound" and (self.new is None or self.new != self.old)

    def describe(self) -> str:
        new = "deleted" if self.new is None else f"{self.new[0]} on {self.new[1]}"
        return (f"{self.namespace}/{self.name}: Bound on {self.old[1]} -> {new}"
                f" ({self.reason or 'no condition'}: {self.message}){' [relisted]' if self.relisted else ''}")


def compacted(transition: Transition) -> bool:
    """A stopped hold moved, still Bound, to make room for another order (R-BIND-11): its Moved condition names
    the compaction."""
    return (transition.new is not None and transition.new[0] == "Bound" and transition.reason == "Moved"
            and ": compaction: room made on node " in transition.message)


def bound_condition(device: Mapping[str, Any]) -> Mapping[str, Any]:
    for condition in (device.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "Bound":
            found: Mapping[str, Any] = condition
            return found
    return {}


def decided(device: Mapping[str, Any]) -> bool:
    """The binder decided the order: it holds units or is Lost, or it stays Pending with a condition saying why."""
    status = device.get("status") or {}
    if status.get("phase") in ("Bound", "Lost"):
        return True
    condition = bound_condition(device)
    return condition.get("status") == "False" and bool(condition.get("reason"))


def not_accepted_reason(device: Mapping[str, Any]) -> str | None:
    status = device.get("status") or {}
    if status.get("phase") in ("Bound", "Lost"):
        return None
    condition = bound_condition(device)
    return str(condition["reason"]) if condition.get("status") == "False" and condition.get("reason") else None


def node_troubles(node: Mapping[str, Any]) -> list[str]:
    """What about a Node is a reason of its own for a hold to leave it: cordon, NotReady, a NoSchedule taint."""
    troubles = []
    spec, status = node.get("spec") or {}, node.get("status") or {}
    if spec.get("unschedulable"):
        troubles.append("cordoned")
    ready = next((c for c in status.get("conditions") or () if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") != "True":
        troubles.append("NotReady")
    for taint in spec.get("taints") or ():
        if taint.get("effect") in ("NoSchedule", "NoExecute"):
            troubles.append(f"tainted {taint.get('key')}:{taint.get('effect')}")
    return troubles


class Recorder:
    """See the module docstring: every phase transition of the run's devices, and the troubles of its nodes."""

    def __init__(self, admin: Client, namespaces: Iterable[str], nodes: Iterable[str]) -> None:
        self.admin = admin
        self.namespaces = set(namespaces)
        self.nodes = set(nodes)
        #: uid -> (namespace, name, phase, node)
        self.state: dict[str, tuple[str, str, str | None, str | None]] = {}
        self.transitions: list[Transition] = []
        #: (namespace, name) -> when the recorder first saw the order decided.
        self.decided_at: dict[tuple[str, str], float] = {}
        #: node -> (when, what) of every trouble seen.
        self.troubles: dict[str, list[tuple[float, str]]] = {}
        self.reconnects = 0
        self.relists = 0
        self._synced = {DEVICES: asyncio.Event(), NODES: asyncio.Event()}

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._follow(DEVICES, self._device, self._devices_listed))
            tasks.create_task(self._follow(NODES, self._node, self._nodes_listed))

    async def synced(self) -> None:
        for event in self._synced.values():
            await event.wait()

    async def _follow(self, path: str, on_event: Any, on_list: Any) -> None:
        version: str | None = None
        while True:
            try:
                if version is None:
                    listed = await self.admin.list_objects(path)
                    version = str(listed["metadata"]["resourceVersion"])
                    on_list(listed["items"])
                    self._synced[path].set()
                params = {"resourceVersion": version, "allowWatchBookmarks": "true"}
                async for event in self.admin.watch(path, params=params, read_timeout=30):
                    version = str(event["object"]["metadata"]["resourceVersion"])
                    if event["type"] != "BOOKMARK":
                        on_event(event["type"], event["object"])
                self.reconnects += 1  # the server ended the stream: resume from the last version
            except errors.Gone:
                version = None
                self.relists += 1
            except errors.KubeError:
                self.reconnects += 1
                await asyncio.sleep(0.2)  # the API server is away (a restart): try again shortly

    # GPUDevices

    def _device(self, kind: str, device: Obj, *, relisted: bool = False) -> None:
        meta = device["metadata"]
        if meta["namespace"] not in self.namespaces:
            return
        uid, key = meta["uid"], (meta["namespace"], meta["name"])
        status = device.get("status") or {}
        old = self.state.get(uid)
        condition = bound_condition(device)
        if kind == "DELETED":
            self.state.pop(uid, None)
            if old is not None:
                self.transitions.append(Transition(now(), key[0], key[1], (old[2], old[3]), None, True,
                                                   str(condition.get("reason", "")),
                                                   str(condition.get("message", "")), relisted))
            return
        new = (status.get("phase"), status.get("nodeName"))
        if old is not None and (old[2], old[3]) != new:
            self.transitions.append(Transition(now(), key[0], key[1], (old[2], old[3]), new,
                                               bool(meta.get("deletionTimestamp")), str(condition.get("reason", "")),
                                               str(condition.get("message", "")), relisted))
        self.state[uid] = (key[0], key[1], new[0], new[1])
        if key not in self.decided_at and decided(device):
            self.decided_at[key] = now()

    def _devices_listed(self, items: list[Obj]) -> None:
        listed = {d["metadata"]["uid"] for d in items}
        for uid, (namespace, name, _, _) in list(self.state.items()):
            if uid not in listed:
                self._device("DELETED", {"metadata": {"uid": uid, "namespace": namespace, "name": name}},
                             relisted=True)
        for device in items:
            self._device("MODIFIED", device, relisted=True)

    # Nodes

    def _node(self, kind: str, node: Obj) -> None:
        name = node["metadata"]["name"]
        if name not in self.nodes:
            return
        found = ["gone"] if kind == "DELETED" else node_troubles(node)
        for trouble in found:
            self.troubles.setdefault(name, []).append((now(), trouble))

    def _nodes_listed(self, items: list[Obj]) -> None:
        present = {n["metadata"]["name"] for n in items}
        for name in self.nodes - present:
            self.troubles.setdefault(name, []).append((now(), "gone"))
        for node in items:
            self._node("MODIFIED", node)

    # The fourth counter

    def left_bound_with_reason(self, since: float, until: float) -> collections.Counter[str]:
        """The holds that left Bound (or their node) in [since, until) with a reason of their own, by reason."""
        unjustified = set(self.left_bound_without_reason(since, until))
        reasons: collections.Counter[str] = collections.Counter()
        for transition in self.transitions:
            if since <= transition.at < until and transition.left_bound and transition not in unjustified:
                if transition.new is None or transition.deleting:
                    reasons["deleted"] += 1
                elif transition.old[1] in self.troubles:
                    reasons["node trouble"] += 1
                elif compacted(transition):
                    reasons["compacted"] += 1
                else:
                    reasons["gathered"] += 1
        return reasons

    def left_bound_without_reason(self, since: float, until: float) -> list[Transition]:
        """Holds that left Bound (or their node) in [since, until) with no reason of their own.

        Reasons of its own: its deletion; its node cordoned, NotReady, tainted or gone at any time of the
        run (the chaos touches no node, so any is worth a look anyway: see ``troubles``); a move that
        gathers its own VMI's set (its own VM's start); a stopped hold moved, still Bound, by a compaction
        that made room for a larger order (R-BIND-11: no VM uses it, the audit's running-detached count
        says so). Anything else — capacity taken by a neighbour's launcher above all — is not.
        """
        found = []
        for transition in self.transitions:
            if not (since <= transition.at < until) or not transition.left_bound:
                continue
            if transition.new is None or transition.deleting:
                continue
            if transition.old[1] in self.troubles:
                continue
            if transition.reason == GATHERED and transition.new[0] == "Bound":
                continue
            if compacted(transition):
                continue
            found.append(transition)
        return found


    async def unmatched_events(self, seen: set[str]) -> list[str]:
        """Lost and Moved Events of the run's devices that no recorded transition accounts for, unjustified.

        The binder raises an Event with every hold it sends Lost or moves. The watch is the first source;
        Events are the second, for what a relist after a 410 folds away (a hold that went Lost and came
        back while the recorder was relisting). ``seen`` holds the Events already looked at.
        """
        found = []
        for namespace in sorted(self.namespaces):
            listed = await self.admin.list_objects(resource_path("", "v1", "events", namespace=namespace),
                                                   params={"fieldSelector": "involvedObject.kind=GPUDevice"})
            for event in listed["items"]:
                uid = event["metadata"]["uid"]
                if uid in seen or event.get("reason") not in ("Lost", "Moved"):
                    continue
                seen.add(uid)
                message = str(event.get("message", ""))
                where = re.match(r"(?:moved from node|lost node) ([^ :]+)", message)
                if where is None:
                    continue  # lost "its node": a member that held no units
                name, node = event["involvedObject"]["name"], where.group(1)
                if node in self.troubles or any(
                        t.namespace == namespace and t.name == name and t.old == ("Bound", node) and t.left_bound
                        for t in self.transitions):
                    continue
                found.append(f"{namespace}/{name} (from its Event {event.get('reason')}: {message})")
        return found


# -- the audit -------------------------------------------------------------------------------------------


def _units(pod: Mapping[str, Any], resource: str) -> int:
    """The pod's request of ``resource`` as the scheduler counts it (app containers; init containers' max)."""
    spec = pod.get("spec") or {}

    def request(container: Mapping[str, Any]) -> int:
        resources = container.get("resources") or {}
        value = (resources.get("requests") or {}).get(resource) or (resources.get("limits") or {}).get(resource)
        return int(value) if value is not None else 0

    apps = sum(request(c) for c in spec.get("containers") or ())
    inits = max((request(c) for c in spec.get("initContainers") or ()), default=0)
    return max(apps, inits)


def _device_refs(vmi: Mapping[str, Any]) -> list[str]:
    raw = ((vmi.get("metadata") or {}).get("annotations") or {}).get(keys.DEVICE_REFS_ANNOTATION) or "[]"
    return [str(ref["device"]) for ref in json.loads(raw) if isinstance(ref, dict) and ref.get("device")]


@attrs.frozen
class Audit:
    double_booked: list[str]
    budgets_exceeded: list[str]
    running_detached: list[str]
    running: int


async def audit(admin: Client, *, namespaces: Sequence[str], nodes: Sequence[str], resource: str) -> Audit:
    """The API server's state now, against three promises (see the module docstring)."""
    ours = set(namespaces)
    devices = [d for d in (await admin.list_objects(DEVICES))["items"] if d["metadata"]["namespace"] in ours]
    pods = [p for p in (await admin.list_objects(PODS))["items"] if p["metadata"]["namespace"] in ours]
    vmis = [v for v in (await admin.list_objects(VMIS))["items"] if v["metadata"]["namespace"] in ours]
    gpunodes = {n["metadata"]["name"]: n for n in (await admin.list_objects(GPUNODES))["items"]
                if n["metadata"]["name"] in nodes}
    by_key = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in devices}
    # Launchers: a pod a VMI lists in status.activePods (R-MOD-5); it is covered by the Bound devices attached
    # to that VMI on the pod's node (R-MOD-6, capacity reader).
    listed_by: dict[str, Obj] = {}
    for vmi in vmis:
        for uid in ((vmi.get("status") or {}).get("activePods") or {}):
            listed_by[uid] = vmi

    def attached_bound(vmi: Mapping[str, Any], node: str | None) -> list[Obj]:
        name = vmi["metadata"]["name"]
        return [d for d in devices if d["metadata"]["namespace"] == vmi["metadata"]["namespace"]
                and ((d.get("status") or {}).get("attachment") or {}).get("vmi") == name
                and (d.get("status") or {}).get("phase") == "Bound" and d["status"].get("nodeName") == node]

    double_booked = []
    for node in nodes:
        served = sum(int(dev.get("allocatable") or 0)
                     for dev in ((gpunodes.get(node) or {}).get("status") or {}).get("devices") or ()
                     if dev.get("resourceName") == resource)
        held = [d for d in devices if (d.get("status") or {}).get("phase") == "Bound"
                and d["status"].get("nodeName") == node]
        uncovered = 0
        for pod in pods:
            if (pod.get("spec") or {}).get("nodeName") != node:
                continue
            if (pod.get("status") or {}).get("phase") in FINAL_POD_PHASES:
                continue
            wants = _units(pod, resource)
            vmi = listed_by.get(pod["metadata"]["uid"])
            covered = sum(int(d["spec"]["count"]) for d in attached_bound(vmi, node)) if vmi is not None else 0
            uncovered += max(0, wants - covered)
        booked = sum(int(d["spec"]["count"]) for d in held)
        if booked + uncovered > served:
            double_booked.append(
                f"node {node}: {booked} units Bound + {uncovered} used by pods no Bound device covers > {served} served"
                f" ({', '.join(sorted(d['metadata']['namespace'] + '/' + d['metadata']['name'] for d in held))})")

    budgets_exceeded = []
    snapshot = (await read_cluster(admin)).snapshot
    for tenant in namespaces:
        declared = snapshot.budgets.get(tenant)
        if declared is None:
            continue
        used = snapshot.usage_of(tenant)
        limits = [(value, used.per_class.get(name, 0)) for name, value in declared.per_class.items()]
        if declared.total is not None:
            limits.append((declared.total, used.total))
        limits += [(value, used.raw.get(name, 0)) for name, value in declared.raw.items()]
        for value, in_use in limits:
            if value.amount is not None and in_use > value.amount:
                budgets_exceeded.append(f"{tenant}: {value.key} {in_use} in use over its subtree, {value.amount} "
                                        "allowed")

    running_detached = []
    running = 0
    for vmi in vmis:
        if vmi["metadata"].get("deletionTimestamp"):
            continue
        active = (vmi.get("status") or {}).get("activePods") or {}
        launchers = [p for p in pods if p["metadata"]["uid"] in active
                     and (p.get("status") or {}).get("phase") == "Running"]
        if not launchers:
            continue
        running += 1
        namespace, name = vmi["metadata"]["namespace"], vmi["metadata"]["name"]
        node = launchers[0]["spec"].get("nodeName")
        for ref in _device_refs(vmi):
            device = by_key.get((namespace, ref))
            status = (device or {}).get("status") or {}
            attachment = status.get("attachment") or {}
            if device is None or attachment.get("vmi") != name or (
                    attachment.get("uid") and attachment["uid"] != vmi["metadata"]["uid"]):
                running_detached.append(f"VMI {namespace}/{name} runs on {node}, its device {ref} is detached")
            elif (status.get("phase"), status.get("nodeName")) != ("Bound", node):
                running_detached.append(f"VMI {namespace}/{name} runs on {node}, its device {ref} is "
                                        f"{status.get('phase')} on {status.get('nodeName')}")
    return Audit(double_booked, budgets_exceeded, running_detached, running)
