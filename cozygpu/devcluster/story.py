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
   an Event saying from, to and why; the node is uncordoned again.

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
#: Every wait of the story ends after this long, with a line saying what did not happen.
WAIT: Final = 60.0


class StoryError(Exception):
    """A step did not end as the story says it should; the message names what was expected."""


def device_path(namespace: str, name: str | None = None) -> str:
    return resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, namespace=namespace, name=name)


def kubevirt_path(plural: str, namespace: str, name: str | None = None) -> str:
    return resource_path("kubevirt.io", "v1", plural, namespace=namespace, name=name)


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

    async def tell(self) -> dict[str, Any]:
        """The seven steps; returns what each ended with (for the caller to print or check)."""
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
        return told


async def clear(admin: Client) -> list[str]:
    """Delete the VMs, VMIs and GPUDevices an earlier run left in the story's namespaces; wait until they are gone.

    The controller must run: it releases the device finalizers once no VMI uses a device.
    """
    cleared: list[str] = []
    collections = [(kubevirt_path("virtualmachines", ns), "vm") for ns in NAMESPACES]
    collections += [(kubevirt_path("virtualmachineinstances", ns), "vmi") for ns in NAMESPACES]
    collections += [(device_path(ns), "gpudevice") for ns in NAMESPACES]
    for path, kind in collections:
        for item in (await admin.list_objects(path))["items"]:
            meta = item["metadata"]
            cleared.append(f"{kind}/{meta['name']} -n {meta['namespace']}")
            with contextlib.suppress(errors.NotFound):
                await admin.delete(f"{path}/{meta['name']}")

    async def empty() -> bool | None:
        for path, _ in collections:
            if (await admin.list_objects(path))["items"]:
                return None
        return True

    await until(empty, "clearing what an earlier run left", time.monotonic())
    return cleared
