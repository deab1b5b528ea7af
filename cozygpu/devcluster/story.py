"""The demo's story: what no other Kubernetes GPU system does, step by step, through the real API server.

Run by ``cozygpu cluster demo`` once the platform is up (``demo.py``: the
simulated nodes read by the real agent, two controller replicas with their
webhooks registered, the KubeVirt stand-in). Every step is an ordinary API
call a tenant or an operator makes (create a GPUDevice, a VirtualMachine, a
VirtualMachineInstance; cordon a Node), and every outcome printed is read back
from the API server, with how long it took from the call:

1. an order accepted and bound onto a node;
2. an order over the parent tenant's budget refused at once, with the numbers;
3. a VM started with its held device: the webhook pins the launcher pod, the
   real kube-scheduler places it on the device's node, kwok runs it;
4. the VM stopped: the device stays Bound on its node (the hold);
5. another tenant's start that cannot fit, refused at admission with the reason;
6. a GPU asked for by its raw resource name, around the GPUDevice: a plain pod
   requesting it and a VMI with a ``gpus`` entry but no device-refs label, each
   refused by the chart's raw-name admission policy (``rawNames: forbid``);
7. the node of the stopped VM's hold cordoned: the binder moves the hold, with
   an Event saying from, to and why; the node is uncordoned again;
8. a GPU of the DRA class (SPEC §1.5): the order bound and held as a
   ResourceClaim the binder allocates on the DRA node, reserved for the
   GPUDevice; a VM started on it (the VMI webhook gives the VMI the claim,
   nothing pins the launcher pod: kube-scheduler places it by the claim's
   allocation, kwok runs it) and stopped: the claim stays allocated, reserved
   for the GPUDevice alone; a plain pod asking for a GPU of the DeviceClass
   with a claim of its own on that node stays unschedulable ("cannot allocate
   all claims"). That pod runs in a namespace of no tenant: with raw GPU names
   forbidden a tenant's claim of a DeviceClass a class sells is refused.
9. compaction (R-BIND-11): each H100 node left with one GPU free (a stopped
   hold of tenant-beta's on one, tenant-acme-ml's on the other, whose
   namespace opts out of compaction), tenant-beta orders two H100 — what a
   scheduler refuses for fragmentation: the order is accepted and Bound after
   the binder moved tenant-beta's stopped hold to the other node, with an Event
   naming the order; both are released again.
10. the hold ledger and idle-hold expiry (SPEC §1.6): a class of the story's
   own selling the H100s with ``idleHoldLimit`` 20s and ``idleHoldWarning``
   12s; tenant-acme-ml's order of it takes the last GPU of tenant-acme's
   budget (a second order is refused) and stays idle: it is warned
   (``IdleHoldExpiring``), then Released (``IdleHoldExpired``), and the second
   order is accepted and Bound on the freed budget; both orders and the class
   are deleted again. Then ``cozygpu usage -n tenant-acme --subtree`` (the
   command's own functions) on the two stopped VMs' holds, idle since steps 4
   and 8 (through the expiry's 20 s): units held, running and idle now,
   GPU-hours held and idle.

:func:`clear` removes what an earlier run left, so the story can be told again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

from cozygpu import keys
from cozygpu.binder.ledger import EXPIRING_CONDITION
from cozygpu.commands import common, usage
from cozygpu.devcluster import dra_driver
from cozygpu.kube import Client, errors, resource_path

T = TypeVar("T")

ACME: Final = "tenant-acme-ml"
BETA: Final = "tenant-beta"
#: The tenant namespaces a run writes in, and so clears before it runs again.
NAMESPACES: Final = (ACME, BETA)
HELD: Final = "train"
OVER: Final = "train-2"
VM: Final = "vm-train"
BIG_VMI: Final = "vm-big"
#: Step 6: a plain pod and a VMI asking for a GPU by its resource name, without a GPUDevice.
RAW_POD: Final = "cuda"
RAW_VMI: Final = "vm-raw"
RAW_GPU: Final = "nvidia.com/GH100_H100_SXM5_80GB"
#: Step 8: a GPU of the DRA class (its DeviceClass's GPUs published by the simulated driver on the DRA node),
#: held for ``DRA_VM``; a plain pod with a claim of its own of that DeviceClass, in a namespace of no tenant.
DRA_CLASS: Final = "h100-dra"
DRA_HELD: Final = "infer"
DRA_VM: Final = "vm-infer"
LAB: Final = "gpu-lab"
CLAIM_POD: Final = "cuda-claim"
CLAIM_TEMPLATE: Final = "one-vfio-gpu"
#: Step 9: tenant-beta's single-GPU holds that leave each H100 node one GPU free, and the order of two.
SPREAD: Final = ("spread-1", "spread-2")
PAIR: Final = "pair"
#: Step 10: the tenant whose subtree ``cozygpu usage`` reads; a class of the step's own whose idle holds expire
#: (the H100s class h100 sells: its one hold fits in the three H100s steps 1-9 leave free, and it is deleted at
#: the step's end, before the catalog), its order left idle, and the order that waits for the budget it frees.
USAGE_TENANT: Final = "tenant-acme"
EXPIRING_CLASS: Final = "h100-idle-limit"
IDLE_HOLD_LIMIT: Final = "20s"
IDLE_HOLD_WARNING: Final = "12s"
IDLE: Final = "scratch"
NEXT: Final = "scratch-2"
#: Every wait of the story ends after this long, with a line saying what did not happen.
WAIT: Final = 60.0


class StoryError(Exception):
    """A step did not end as the story says it should; the message names what was expected."""


def device_path(namespace: str, name: str | None = None) -> str:
    return resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, namespace=namespace, name=name)


def class_path(name: str | None = None) -> str:
    return resource_path(keys.GROUP, keys.VERSION, keys.GPUCLASS_PLURAL, name=name)


def kubevirt_path(plural: str, namespace: str, name: str | None = None) -> str:
    return resource_path("kubevirt.io", "v1", plural, namespace=namespace, name=name)


def dra_path(plural: str, namespace: str, name: str | None = None) -> str:
    return resource_path(dra_driver.API_GROUP, dra_driver.API_VERSION, plural, namespace=namespace, name=name)


def pods_path(namespace: str, name: str | None = None) -> str:
    return resource_path("", "v1", "pods", namespace=namespace, name=name)


def refs(*entries: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The device-refs label and annotation (SPEC §1.4) a VMI (or a VM's template) carries."""
    return {"labels": {keys.DEVICE_REFS_LABEL: "true"},
            "annotations": {keys.DEVICE_REFS_ANNOTATION: json.dumps(list(entries))}}


def vm_body(name: str, device: str) -> dict[str, Any]:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name},
            "spec": {"running": True, "template": {
                "metadata": refs({"device": device}),
                "spec": {"domain": {"devices": {}, "memory": {"guest": "2Gi"}}}}}}


def vmi_body(name: str, *entries: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, **refs(*entries)},
            "spec": {"domain": {"devices": {}, "memory": {"guest": "2Gi"}}}}


def raw_pod_body(name: str, resource: str = RAW_GPU) -> dict[str, Any]:
    """A plain pod whose container asks for a GPU by its extended resource name (no VM, no GPUDevice)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "compute", "image": "cozygpu.invalid/cuda",
                                     "resources": {"requests": {resource: "1"}, "limits": {resource: "1"}}}]}}


def raw_vmi_body(name: str, resource: str = RAW_GPU) -> dict[str, Any]:
    """A VMI with a raw ``gpus`` entry and no device-refs label: it names the GPU itself."""
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": name},
            "spec": {"domain": {"devices": {"gpus": [{"name": "gpu1", "deviceName": resource}]},
                                "memory": {"guest": "2Gi"}}}}


def claim_template_body(name: str) -> dict[str, Any]:
    """A ResourceClaimTemplate of one GPU of the vfio DeviceClass (what a pod of one's own would use)."""
    return {"apiVersion": f"{dra_driver.API_GROUP}/{dra_driver.API_VERSION}", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name}, "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": dra_driver.DEVICE_CLASS}}]}}}}


def claim_pod_body(name: str, template: str, node: str) -> dict[str, Any]:
    """A plain pod on ``node`` whose container uses a claim of its own, made from ``template``."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "compute", "image": "cozygpu.invalid/cuda",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def allocated(claim: dict[str, Any]) -> list[str]:
    """A claim's allocated devices as ``driver/pool/device``."""
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    return [f"{r['driver']}/{r['pool']}/{r['device']}" for r in results]


def reserved_for(claim: dict[str, Any]) -> list[str]:
    """A claim's consumers as ``resource/name`` (``gpudevices/infer``, ``pods/virt-launcher-…``)."""
    return [f"{r['resource']}/{r['name']}" for r in (claim.get("status") or {}).get("reservedFor") or []]


def expiring_class_body() -> dict[str, Any]:
    """Step 10's class: the H100s (class h100's resource name, every node serving it), its idle holds released."""
    return {"apiVersion": keys.API_VERSION, "kind": keys.GPUCLASS_KIND, "metadata": {"name": EXPIRING_CLASS},
            "spec": {"source": {"devicePlugin": {}}, "vendor": "NVIDIA", "model": "H100 SXM5 80GB",
                     "mode": "Passthrough", "memory": "80Gi", "resourceName": RAW_GPU,
                     "idleHoldLimit": IDLE_HOLD_LIMIT, "idleHoldWarning": IDLE_HOLD_WARNING}}


def condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)
    return found


def order(name: str, class_name: str, count: int) -> dict[str, Any]:
    return {"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND, "metadata": {"name": name},
            "spec": {"className": class_name, "count": count}}


async def until(probe: Callable[[], Awaitable[T | None]], what: str, started: float,
                timeout: float = WAIT) -> tuple[T, float]:
    """Poll ``probe`` (every 20 ms: the story reads the API server as a person would) until it has a value."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                found = await probe()
                if found is not None:
                    return found, time.monotonic() - started
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise StoryError(f"{what}: not within {timeout:.0f} s") from None


def took(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


class Story:
    def __init__(self, admin: Client, out: Callable[[str], None] = print) -> None:
        self.admin = admin
        self.out = out

    async def device(self, namespace: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = await self.admin.get(device_path(namespace, name))
        return found

    async def status(self, namespace: str, name: str) -> dict[str, Any]:
        status: dict[str, Any] = (await self.device(namespace, name)).get("status") or {}
        return status

    async def launchers(self, namespace: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = (await self.admin.list_objects(
            resource_path("", "v1", "pods", namespace=namespace),
            params={"labelSelector": f"{keys.KUBEVIRT_LAUNCHER_LABEL}={keys.KUBEVIRT_LAUNCHER_VALUE}"}))["items"]
        return found

    async def refused(self, path: str, body: dict[str, Any]) -> tuple[str, float]:
        """Create ``body``; the API server must refuse it. Returns the refusal's message and how long it took."""
        started = time.monotonic()
        try:
            await self.admin.create(path, body)
        except errors.ApiError as error:
            return error.message, time.monotonic() - started
        raise StoryError(f"{body['kind']} {body['metadata']['name']} was accepted; the story expected a refusal")

    async def accepted(self, path: str, body: dict[str, Any], *, unless: str) -> bool | None:
        """Create ``body``: True once accepted, None when refused with ``unless`` in the message (what a webhook
        says until its replica's cache has seen a change just written), a StoryError for any other refusal."""
        try:
            await self.admin.create(path, body)
        except errors.ApiError as error:
            if unless in error.message:
                return None
            raise StoryError(f"{body['kind']} {body['metadata']['name']} refused: {error.message}") from None
        return True

    async def tell(self) -> dict[str, Any]:
        """The ten steps; returns what each ended with (for the caller to print or check)."""
        told: dict[str, Any] = {}
        say = self.out

        say(f"1. {ACME} orders 1 H100 (gpudevice/{HELD}): accepted by the GPUDevice webhook, then bound by the "
            "leader's binder")
        started = time.monotonic()
        await self.admin.create(device_path(ACME), order(HELD, "h100", 1))

        async def bound() -> dict[str, Any] | None:
            status = await self.status(ACME, HELD)
            return status if status.get("phase") == "Bound" else None

        status, seconds = await until(bound, f"gpudevice/{HELD} Bound", started)
        node = str(status["nodeName"])
        say(f"   Bound on {node} after {took(seconds)}")
        told["bound"] = node

        say(f"2. {ACME} orders 1 more H100 (gpudevice/{OVER}): over the budget of its parent tenant-acme")
        message, seconds = await self.refused(device_path(ACME), order(OVER, "h100", 1))
        say(f"   refused in {took(seconds)}: {message}")
        told["overBudget"] = message

        say(f"3. {ACME} starts virtualmachine/{VM}, whose template names gpudevice/{HELD}")
        started = time.monotonic()
        await self.admin.create(kubevirt_path("virtualmachines", ACME), vm_body(VM, HELD))

        async def vmi_running() -> dict[str, Any] | None:
            vmi = await self.admin.get_or_none(kubevirt_path("virtualmachineinstances", ACME, VM))
            status = (vmi or {}).get("status") or {}
            return vmi if status.get("phase") == "Running" else None

        vmi, seconds = await until(vmi_running, f"virtualmachineinstance/{VM} Running", started)
        gpus = [gpu["deviceName"] for gpu in vmi["spec"]["domain"]["devices"].get("gpus", [])]
        pods = await self.launchers(ACME)
        pod = next(p for p in pods if any(ref.get("uid") == vmi["metadata"]["uid"]
                                          for ref in p["metadata"].get("ownerReferences", [])))
        say(f"   the VMI webhook attached the hold and gave the VMI {len(gpus)} GPU ({', '.join(gpus)}); "
            f"the launcher pod {pod['metadata']['name']}, pinned to {node} by the pod webhook, was placed there "
            f"by kube-scheduler and runs: VMI Running on {vmi['status'].get('nodeName')} after {took(seconds)}")
        told["ran"] = {"vmiNode": vmi["status"].get("nodeName"), "podNode": pod["spec"].get("nodeName"),
                       "gpus": gpus}

        say(f"4. {ACME} stops virtualmachine/{VM} (spec.running: false)")
        started = time.monotonic()
        await self.admin.merge_patch(kubevirt_path("virtualmachines", ACME, VM), {"spec": {"running": False}})

        async def released() -> dict[str, Any] | None:
            # Stopped means the launcher pod is gone too: until then it still uses the GPU on its node.
            if await self.admin.get_or_none(kubevirt_path("virtualmachineinstances", ACME, VM)) is not None:
                return None
            if await self.launchers(ACME):
                return None
            status = await self.status(ACME, HELD)
            return status if "attachment" not in status else None

        status, seconds = await until(released, f"{VM}'s VMI and launcher pod gone, gpudevice/{HELD} detached", started)
        say(f"   the VMI and its launcher pod are gone and the device detached after {took(seconds)}; "
            f"gpudevice/{HELD} is still "
            f"{status.get('phase')} on "
            f"{status.get('nodeName')}: the GPU stays the tenant's while its VM is off")
        told["kept"] = {"phase": status.get("phase"), "nodeName": status.get("nodeName")}

        say(f"5. {BETA} starts virtualmachineinstance/{BIG_VMI} asking for 3 H100 at once (a template device)")
        message, seconds = await self.refused(kubevirt_path("virtualmachineinstances", BETA),
                                              vmi_body(BIG_VMI, {"template": "big", "class": "h100", "count": 3}))
        say(f"   refused in {took(seconds)}, nothing left Pending: {message}")
        told["cannotFit"] = message

        say(f"6. {BETA} asks for a GPU by its raw name, around the GPUDevice: pod/{RAW_POD} requesting {RAW_GPU}, "
            f"and virtualmachineinstance/{RAW_VMI} with a gpus entry and no device-refs label")
        message, seconds = await self.refused(resource_path("", "v1", "pods", namespace=BETA), raw_pod_body(RAW_POD))
        say(f"   pod/{RAW_POD} refused in {took(seconds)}: {message}")
        told["rawPod"] = message
        message, seconds = await self.refused(kubevirt_path("virtualmachineinstances", BETA), raw_vmi_body(RAW_VMI))
        say(f"   virtualmachineinstance/{RAW_VMI} refused in {took(seconds)}: {message}")
        told["rawVmi"] = message

        say(f"7. the operator cordons {node}, which holds the stopped VM's GPU")
        started = time.monotonic()
        await self.admin.merge_patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}})

        async def moved() -> dict[str, Any] | None:
            status = await self.status(ACME, HELD)
            if status.get("phase") != "Bound" or status.get("nodeName") in (None, node):
                return None
            events = (await self.admin.list_objects(resource_path("", "v1", "events", namespace=ACME), params={
                "fieldSelector": f"involvedObject.name={HELD},reason=Moved"}))["items"]
            return {"nodeName": status["nodeName"], "event": events[0]["message"]} if events else None

        found, seconds = await until(moved, f"gpudevice/{HELD} moved off cordoned {node}", started)
        say(f"   moved to {found['nodeName']} after {took(seconds)}; its Event: Moved: {found['event']}")
        await self.admin.merge_patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": False}})
        say(f"   {node} uncordoned again")
        told["moved"] = found
        told["dra"] = await self.dra()
        told["compaction"] = await self.compaction()
        told["ledger"] = await self.ledger()
        return told

    async def compaction(self) -> dict[str, Any]:
        """Step 9: an order no node has room for, placed after moving a stopped hold."""
        say = self.out
        first, second = SPREAD
        say(f"9. {BETA} holds 1 H100 on each H100 node (gpudevice/{first}, then {second}), gives {first} up, and "
            f"{ACME} opts its namespace out of compaction ({keys.COMPACTION_LABEL}=Never): one GPU free per node")
        await self.admin.merge_patch(f"/api/v1/namespaces/{ACME}", {"metadata": {"labels": {
            keys.COMPACTION_LABEL: "Never"}}})
        placed: dict[str, str] = {}
        for name in SPREAD:
            started = time.monotonic()
            await self.admin.create(device_path(BETA), order(name, "h100", 1))

            async def bound(name: str = name) -> dict[str, Any] | None:
                status = await self.status(BETA, name)
                return status if status.get("phase") == "Bound" else None

            status, _ = await until(bound, f"gpudevice/{name} Bound", started)
            placed[name] = str(status["nodeName"])
        started = time.monotonic()
        await self.admin.delete(device_path(BETA, first))

        async def freed() -> bool | None:
            return True if await self.admin.get_or_none(device_path(BETA, first)) is None else None

        await until(freed, f"gpudevice/{first} released", started)
        say(f"   {first} was Bound on {placed[first]} and is released, {second} is Bound on {placed[second]}")
        say(f"   {BETA} orders 2 H100 (gpudevice/{PAIR}): no node has 2 free, which a scheduler refuses as "
            "fragmentation")
        started = time.monotonic()
        await self.admin.create(device_path(BETA), order(PAIR, "h100", 2))

        async def compacted() -> dict[str, Any] | None:
            status = await self.status(BETA, PAIR)
            if status.get("phase") != "Bound":
                return None
            events = (await self.admin.list_objects(resource_path("", "v1", "events", namespace=BETA), params={
                "fieldSelector": f"involvedObject.name={second},reason=Moved"}))["items"]
            moved = await self.status(BETA, second)
            return {"nodeName": status["nodeName"], "moved": moved.get("nodeName"),
                    "event": events[0]["message"]} if events else None

        found, seconds = await until(compacted, f"gpudevice/{PAIR} Bound after a compaction", started)
        say(f"   accepted by the GPUDevice webhook and Bound on {found['nodeName']} after {took(seconds)}: the "
            f"binder moved {BETA}'s stopped hold {second} to {found['moved']} first; its Event: Moved: "
            f"{found['event']}")
        started = time.monotonic()
        for name in (PAIR, second):
            await self.admin.delete(device_path(BETA, name))

        async def released() -> bool | None:
            return True if not (await self.admin.list_objects(device_path(BETA)))["items"] else None

        await until(released, f"gpudevice/{PAIR} and {second} released", started)
        await self.admin.merge_patch(f"/api/v1/namespaces/{ACME}", {"metadata": {"labels": {
            keys.COMPACTION_LABEL: None}}})
        say(f"   gpudevice/{PAIR} and {second} released again, and {ACME}'s label taken off")
        return {**found, "spread": placed}

    async def ledger(self) -> dict[str, Any]:
        """Step 10: an idle hold warned, then released, freeing its budget; what ``cozygpu usage`` then says of the
        story's stopped holds (read last, so they have sat idle through the expiry's 20 s: steps 1-9 take about
        one)."""
        say = self.out
        told: dict[str, Any] = {}
        say(f"10. the hold ledger and idle-hold expiry: the operator offers class {EXPIRING_CLASS}, the H100s with "
            f"idleHoldLimit {IDLE_HOLD_LIMIT} and idleHoldWarning {IDLE_HOLD_WARNING}; {ACME} orders 1 "
            f"(gpudevice/{IDLE}), the last GPU of {USAGE_TENANT}'s budget, and starts no VM on it")
        await self.admin.create(class_path(), expiring_class_body())
        started = time.monotonic()
        body = order(IDLE, EXPIRING_CLASS, 1)
        # The class was just created: until a replica's cache has it, its webhook says the class does not exist.
        await until(lambda: self.accepted(device_path(ACME), body, unless=f"class {EXPIRING_CLASS} does not exist"),
                    f"gpudevice/{IDLE} accepted", started)

        async def bound(name: str) -> dict[str, Any] | None:
            status = await self.status(ACME, name)
            return status if status.get("phase") == "Bound" else None

        status, seconds = await until(lambda: bound(IDLE), f"gpudevice/{IDLE} Bound", started)
        node = str(status["nodeName"])
        message, refused_in = await self.refused(device_path(ACME), order(NEXT, EXPIRING_CLASS, 1))
        say(f"   Bound on {node} after {took(seconds)}; gpudevice/{NEXT}, 1 more, refused in {took(refused_in)}: "
            f"{message}")
        told["idle"] = {"node": node, "refused": message}

        async def warned() -> dict[str, Any] | None:
            return condition(await self.status(ACME, IDLE), EXPIRING_CONDITION)

        warning, seconds = await until(warned, f"gpudevice/{IDLE} warned ({EXPIRING_CONDITION})", started)
        say(f"   {EXPIRING_CONDITION} (reason {warning.get('reason')}) {took(seconds)} after the order: "
            f"{warning.get('message')}")
        told["warning"] = warning

        async def expired() -> dict[str, Any] | None:
            status = await self.status(ACME, IDLE)
            return status if status.get("phase") == "Released" else None

        status, seconds = await until(expired, f"gpudevice/{IDLE} Released", started)
        released = condition(status, "Bound") or {}
        say(f"   Released {took(seconds)} after the order, on {status.get('nodeName') or 'no node'}; its Bound "
            f"condition {released.get('status')}, reason {released.get('reason')}: {released.get('message')}")
        told["released"] = {"phase": status.get("phase"), "nodeName": status.get("nodeName"), "condition": released}

        started = time.monotonic()
        # Accepted once the replica answering has seen the release (a moment after it was written).
        await until(lambda: self.accepted(device_path(ACME), order(NEXT, EXPIRING_CLASS, 1), unless="exceeds it"),
                    f"gpudevice/{NEXT} accepted on the budget {IDLE} freed", started)
        status, seconds = await until(lambda: bound(NEXT), f"gpudevice/{NEXT} Bound", started)
        say(f"   its GPU and budget are free again: gpudevice/{NEXT} accepted and Bound on {status['nodeName']} "
            f"{took(seconds)} after the release")
        told["next"] = {"node": status["nodeName"]}

        started = time.monotonic()
        for name in (IDLE, NEXT):
            await self.admin.delete(device_path(ACME, name))

        async def deleted(*paths: str) -> bool | None:
            for path in paths:
                if await self.admin.get_or_none(path) is not None:
                    return None
            return True

        await until(lambda: deleted(device_path(ACME, IDLE), device_path(ACME, NEXT)),
                    f"gpudevice/{IDLE} and {NEXT} deleted", started)
        # The class's finalizer goes once no device holds it.
        await self.admin.delete(class_path(EXPIRING_CLASS))
        await until(lambda: deleted(class_path(EXPIRING_CLASS)), f"class {EXPIRING_CLASS} deleted", started)
        say(f"   gpudevice/{IDLE} and {NEXT} deleted, and class {EXPIRING_CLASS} withdrawn again")

        say(f"   cozygpu usage -n {USAGE_TENANT} --subtree (kubectl gpu usage prints the same): the story's stopped "
            "holds, from the heldSince and idleSince the binder wrote into each one's status")
        cluster = await common.read_cluster(self.admin)
        rows = usage.usage(cluster.snapshot, cluster.now, namespace=USAGE_TENANT, subtree=True)
        if not rows:
            raise StoryError(f"cozygpu usage -n {USAGE_TENANT} --subtree: no holds, the story expected {HELD} and "
                             f"{DRA_HELD}")
        for line in usage.render_table(rows, since=None).splitlines():
            say(f"   {line}")
        held, running = sum(r.held for r in rows), sum(r.running for r in rows)
        spent = usage.Spent(held=sum(r.spent.held for r in rows), idle=sum(r.spent.idle for r in rows))
        say(f"   {held} GPUs held, {running} running, {held - running} idle now ({HELD}'s VM stopped in step 4, "
            f"{DRA_HELD}'s in step 8); since each hold began {spent.held / usage.HOUR:.4f} GPU-hours held "
            f"({spent.held:.0f} GPU-seconds), {spent.idle / usage.HOUR:.4f} of them idle ({spent.idle:.0f} "
            "GPU-seconds): the GPUs a tenant keeps, and pays for, while its VMs are off")
        told["usage"] = [{"namespace": r.namespace, "class": r.class_name, "held": r.held, "running": r.running,
                          "idle": r.idle, "heldSeconds": r.spent.held, "idleSeconds": r.spent.idle} for r in rows]
        return told

    async def claim(self) -> dict[str, Any]:
        found: dict[str, Any] = await self.admin.get(dra_path("resourceclaims", ACME, DRA_HELD))
        return found

    async def dra(self) -> dict[str, Any]:
        """Step 8: a GPU of the DRA class held as a ResourceClaim, a VM started on it and stopped, a foreign claim."""
        say = self.out
        told: dict[str, Any] = {}
        say(f"8. {ACME} orders 1 H100 of the DRA class {DRA_CLASS} (gpudevice/{DRA_HELD}): the binder holds it as a "
            f"ResourceClaim it allocates itself")
        started = time.monotonic()
        await self.admin.create(device_path(ACME), order(DRA_HELD, DRA_CLASS, 1))

        async def held() -> tuple[str, dict[str, Any]] | None:
            status = await self.status(ACME, DRA_HELD)
            if status.get("phase") != "Bound":
                return None
            claim = await self.admin.get_or_none(dra_path("resourceclaims", ACME, DRA_HELD))
            return (str(status["nodeName"]), claim) if claim is not None and allocated(claim) else None

        (node, claim), seconds = await until(held, f"gpudevice/{DRA_HELD} Bound and its claim allocated", started)
        say(f"   Bound on {node}; resourceclaim/{DRA_HELD} allocated {', '.join(allocated(claim))}, reserved for "
            f"{', '.join(reserved_for(claim))}, after {took(seconds)}")
        told["held"] = {"node": node, "allocated": allocated(claim), "reservedFor": reserved_for(claim)}

        say(f"   {ACME} starts virtualmachine/{DRA_VM}, whose template names gpudevice/{DRA_HELD}")
        started = time.monotonic()
        await self.admin.create(kubevirt_path("virtualmachines", ACME), vm_body(DRA_VM, DRA_HELD))

        async def running() -> dict[str, Any] | None:
            vmi = await self.admin.get_or_none(kubevirt_path("virtualmachineinstances", ACME, DRA_VM))
            return vmi if ((vmi or {}).get("status") or {}).get("phase") == "Running" else None

        vmi, seconds = await until(running, f"virtualmachineinstance/{DRA_VM} Running", started)
        pod = next(p for p in await self.launchers(ACME) if any(
            ref.get("uid") == vmi["metadata"]["uid"] for ref in p["metadata"].get("ownerReferences", [])))
        claim = await self.claim()
        gpus = [f"claim {g.get('claimName')}, request {g.get('requestName')}"
                for g in vmi["spec"]["domain"]["devices"].get("gpus", [])]
        pinned = "pinned" if pod["spec"].get("affinity") or pod["spec"].get("nodeSelector") else "not pinned"
        entries = ", ".join(str(e.get("resourceClaimName")) for e in vmi["spec"].get("resourceClaims") or [])
        say(f"   the VMI webhook gave the VMI the claim ({entries}) and {len(gpus)} GPU ({'; '.join(gpus)}); "
            f"the launcher pod {pod['metadata']['name']}, {pinned}, was placed on {pod['spec'].get('nodeName')} by "
            f"kube-scheduler from the claim's allocation and runs, the claim reserved for "
            f"{', '.join(reserved_for(claim))}: VMI Running on {vmi['status'].get('nodeName')} after {took(seconds)}")
        told["ran"] = {"podNode": pod["spec"].get("nodeName"), "pinned": pinned != "not pinned",
                       "resourceClaims": vmi["spec"]["resourceClaims"],
                       "gpus": vmi["spec"]["domain"]["devices"].get("gpus", []), "pod": pod["metadata"]["name"],
                       "reservedFor": reserved_for(claim), "allocated": allocated(claim)}

        say(f"   {ACME} stops virtualmachine/{DRA_VM}")
        started = time.monotonic()
        await self.admin.merge_patch(kubevirt_path("virtualmachines", ACME, DRA_VM), {"spec": {"running": False}})

        async def stopped() -> dict[str, Any] | None:
            # Stopped: the VMI and its pod gone, and the resourceclaim controller has dropped the pod from the claim.
            if await self.admin.get_or_none(kubevirt_path("virtualmachineinstances", ACME, DRA_VM)) is not None:
                return None
            if await self.launchers(ACME):
                return None
            claim = await self.claim()
            return claim if not any(r.startswith("pods/") for r in reserved_for(claim)) else None

        claim, seconds = await until(stopped, f"{DRA_VM}'s VMI and launcher pod gone and its claim left by the pod",
                                     started)
        say(f"   the VMI and its launcher pod are gone after {took(seconds)}; resourceclaim/{DRA_HELD} is still "
            f"allocated {', '.join(allocated(claim)) or 'nothing'}, reserved for "
            f"{', '.join(reserved_for(claim)) or 'no one'}: the GPU stays the tenant's while its VM is off")
        told["kept"] = {"allocated": allocated(claim), "reservedFor": reserved_for(claim)}

        say(f"   pod/{CLAIM_POD} in {LAB}, no tenant's namespace, asks for a GPU of the DeviceClass "
            f"{dra_driver.DEVICE_CLASS} on {node} with a claim of its own (resourceclaimtemplate/{CLAIM_TEMPLATE})")
        started = time.monotonic()
        await self.admin.create(dra_path("resourceclaimtemplates", LAB), claim_template_body(CLAIM_TEMPLATE))
        await self.admin.create(pods_path(LAB), claim_pod_body(CLAIM_POD, CLAIM_TEMPLATE, node))

        async def unschedulable() -> dict[str, Any] | None:
            pod = await self.admin.get(pods_path(LAB, CLAIM_POD))
            return next((c for c in (pod.get("status") or {}).get("conditions") or []
                         if c["type"] == "PodScheduled" and c["status"] == "False"), None)

        condition, seconds = await until(unschedulable, f"pod/{CLAIM_POD} refused by kube-scheduler", started)
        say(f"   {condition.get('reason')} after {took(seconds)}: {condition.get('message')}")
        told["foreign"] = {"reason": condition.get("reason"), "message": condition.get("message")}
        return told


async def clear(admin: Client) -> list[str]:
    """Delete the VMs, VMIs and GPUDevices an earlier run left in the story's namespaces, and step 8's pod and
    claim template in ``LAB``; wait until they are gone, and the hold claims with their devices (a new order of
    the same name gets a claim of that name); then step 10's class, if a run ended before deleting it.

    The controller must run: it releases the device finalizers once no VMI uses a device.
    """
    cleared: list[str] = []
    collections = [(kubevirt_path("virtualmachines", ns), "vm") for ns in NAMESPACES]
    collections += [(kubevirt_path("virtualmachineinstances", ns), "vmi") for ns in NAMESPACES]
    collections += [(device_path(ns), "gpudevice") for ns in NAMESPACES]
    collections += [(pods_path(LAB), "pod"), (dra_path("resourceclaimtemplates", LAB), "resourceclaimtemplate")]
    for path, kind in collections:
        for item in (await admin.list_objects(path))["items"]:
            meta = item["metadata"]
            cleared.append(f"{kind}/{meta['name']} -n {meta['namespace']}")
            with contextlib.suppress(errors.NotFound):
                await admin.delete(f"{path}/{meta['name']}")

    holds = [dra_path("resourceclaims", ns) for ns in NAMESPACES]

    async def empty() -> bool | None:
        for path in [*(path for path, _ in collections), *holds]:
            if (await admin.list_objects(path))["items"]:
                return None
        return True

    await until(empty, "clearing what an earlier run left", time.monotonic())
    # Its finalizer goes once no device holds it: its orders are gone now.
    with contextlib.suppress(errors.NotFound):
        await admin.delete(class_path(EXPIRING_CLASS))
        cleared.append(f"gpuclass/{EXPIRING_CLASS}")

    async def withdrawn() -> bool | None:
        return True if await admin.get_or_none(class_path(EXPIRING_CLASS)) is None else None

    await until(withdrawn, f"clearing class {EXPIRING_CLASS}", time.monotonic())
    return cleared
