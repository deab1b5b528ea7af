"""The KubeVirt stand-in does at the API boundary what the reference says virt-controller does.

Facts checked (``kubernetes-kubevirt-kubelet.md`` §1.2–1.4): the launcher
pod's name, labels (the VMI's, the device-refs label among them, then
KubeVirt's), its controller ownerReference to the VMI, one ``compute``
container whose requests and limits carry one unit per ``gpus`` /
``hostDevices`` entry, a VMI ``resources`` key replacing a count instead of
adding to it, placement fields copied, ``status.activePods`` as
``{pod uid: node}``, the phases, and VM start/stop.

On the fast plane (API server only) the test plays kube-scheduler (a
``pods/binding``) and kwok (``pods/status`` Running) itself, and nothing but
the stand-in deletes anything; on the full plane the real scheduler places
the pod on a kwok node and kwok runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest

from cozygpu import keys
from cozygpu.devcluster import nodes
from cozygpu.devcluster.kubevirt import KubeVirtStandIn
from cozygpu.kube import Client, Obj, resource_path
from tests.support.crds import install_fixture_crd
from tests.support.planes import Fleet

TIMEOUT = 60.0
GPU_A = "nvidia.com/GH100_H100_SXM5_80GB"
GPU_B = "nvidia.com/GA102GL_A10"


def vmis_of(namespace: str) -> str:
    return resource_path("kubevirt.io", "v1", "virtualmachineinstances", namespace=namespace)


def vms_of(namespace: str) -> str:
    return resource_path("kubevirt.io", "v1", "virtualmachines", namespace=namespace)


def pods_of(namespace: str) -> str:
    return resource_path("", "v1", "pods", namespace=namespace)


def vmi_spec(*, gpus: list[str], host_devices: tuple[str, ...] = (), **extra: Any) -> Obj:
    devices: Obj = {"gpus": [{"name": f"gpu{i}", "deviceName": name} for i, name in enumerate(gpus)]}
    if host_devices:
        devices["hostDevices"] = [{"name": f"hd{i}", "deviceName": name} for i, name in enumerate(host_devices)]
    return {"domain": {"devices": devices, "memory": {"guest": "1Gi"}}, **extra}


PLACEMENT: Obj = {
    "nodeSelector": {"pool": "gpu"},
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}},
    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
}


class StandIn:
    """A stand-in running for one test, and waits that fail at once when it dies."""

    def __init__(self, client: Client, namespace: str, task: asyncio.Task[None]) -> None:
        self.client, self.namespace, self.task = client, namespace, task

    async def until(self, collection: str, check: Callable[[list[Obj]], Any], *,
                    params: Mapping[str, str] | None = None, what: str) -> Any:
        """List then watch ``collection`` until ``check(objects)`` is truthy; return what it returned."""
        waiter = asyncio.ensure_future(self._until(collection, check, dict(params or {})))
        done, _ = await asyncio.wait({waiter, self.task}, timeout=TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            return waiter.result()
        waiter.cancel()
        if self.task in done:
            raise AssertionError(f"the stand-in stopped while waiting for {what}") from self.task.exception()
        raise AssertionError(f"never saw {what}")

    async def _until(self, collection: str, check: Callable[[list[Obj]], Any], params: dict[str, str]) -> Any:
        while True:
            listed = await self.client.list_objects(collection, params=params)
            objects = {o["metadata"]["uid"]: o for o in listed["items"]}
            if result := check(list(objects.values())):
                return result
            watch = {**params, "resourceVersion": listed["metadata"]["resourceVersion"]}
            async for event in self.client.watch(collection, params=watch, read_timeout=TIMEOUT):
                obj = event["object"]
                if event["type"] == "DELETED":
                    objects.pop(obj["metadata"]["uid"], None)
                elif event["type"] in ("ADDED", "MODIFIED"):
                    objects[obj["metadata"]["uid"]] = obj
                if result := check(list(objects.values())):
                    return result

    async def vmi_where(self, name: str, check: Callable[[Obj], bool], *, what: str) -> Obj:
        def found(items: list[Obj]) -> Obj | None:
            return next((o for o in items if check(o)), None)

        result: Obj = await self.until(vmis_of(self.namespace), found, what=f"VMI {name} {what}",
                                       params={"fieldSelector": f"metadata.name={name}"})
        return result

    async def launchers(self, vmi_uid: str, check: Callable[[list[Obj]], bool], *, what: str) -> list[Obj]:
        def found(items: list[Obj]) -> list[Obj] | None:
            return items if check(items) else None

        result: list[Obj] = await self.until(pods_of(self.namespace), found, what=what,
                                             params={"labelSelector": f"kubevirt.io/created-by={vmi_uid}"})
        return result


@contextlib.asynccontextmanager
async def running_standin(client: Client) -> AsyncIterator[StandIn]:
    for crd in ("virtualmachines.kubevirt.io", "virtualmachineinstances.kubevirt.io"):
        await install_fixture_crd(client, crd)
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    await client.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": namespace}})
    task = asyncio.create_task(KubeVirtStandIn(client, namespace=namespace).run())
    try:
        yield StandIn(client, namespace, task)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
async def standin(admin: Client) -> AsyncIterator[StandIn]:
    async with running_standin(admin) as running:
        yield running


@pytest.fixture
async def full_standin(full_admin: Client) -> AsyncIterator[StandIn]:
    async with running_standin(full_admin) as running:
        yield running


async def create_vmi(standin: StandIn, name: str, spec: Obj, *, labels: Mapping[str, str] | None = None) -> Obj:
    body = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "labels": dict(labels or {})}, "spec": spec}
    created: Obj = await standin.client.create(vmis_of(standin.namespace), body)
    return created


def phase_is(*phases: str) -> Callable[[Obj], bool]:
    return lambda vmi: (vmi.get("status") or {}).get("phase") in phases


def one(pods: list[Obj]) -> bool:
    return len(pods) == 1


def expect_launcher_shape(pod: Obj, vmi: Obj, *, vm_name: str, labels: Mapping[str, str]) -> None:
    """The reference's facts (§1.3) about a launcher pod's metadata."""
    name, uid = vmi["metadata"]["name"], vmi["metadata"]["uid"]
    assert re.fullmatch(rf"virt-launcher-{re.escape(name)}-[a-z0-9]{{5}}", pod["metadata"]["name"])
    assert pod["metadata"]["labels"] == {
        **labels,
        "kubevirt.io": "virt-launcher",
        "kubevirt.io/created-by": uid,
        "vm.kubevirt.io/name": vm_name,
        "vmi.kubevirt.io/id": name,
    }
    assert pod["metadata"]["ownerReferences"] == [{
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": name, "uid": uid,
        "controller": True, "blockOwnerDeletion": True,
    }]


async def test_a_vmi_gets_one_launcher_pod_with_its_labels_owner_devices_and_placement(standin: StandIn) -> None:
    labels = {keys.DEVICE_REFS_LABEL: "true", "app": "db"}
    spec = vmi_spec(gpus=[GPU_A, GPU_A, GPU_B], host_devices=(GPU_A,), **PLACEMENT)
    vmi = await create_vmi(standin, "vm-1.example", spec, labels=labels)

    [pod] = await standin.launchers(vmi["metadata"]["uid"], one, what="the launcher pod")

    expect_launcher_shape(pod, vmi, vm_name="vm-1", labels=labels)
    [compute] = pod["spec"]["containers"]
    assert compute["name"] == "compute"
    resources = compute["resources"]
    # One unit per gpus and hostDevices entry, summed per deviceName, on requests and limits alike.
    assert resources["limits"] == {GPU_A: "3", GPU_B: "1"}
    assert {k: v for k, v in resources["requests"].items() if k.startswith("nvidia.com/")} == {GPU_A: "3", GPU_B: "1"}
    assert set(resources["requests"]) == {GPU_A, GPU_B, "cpu", "memory"}
    assert "resources" not in pod["spec"]
    assert pod["spec"]["nodeSelector"] == PLACEMENT["nodeSelector"]
    assert pod["spec"]["affinity"] == PLACEMENT["affinity"]
    # The API server's DefaultTolerationSeconds adds its own beside the VMI's.
    assert PLACEMENT["tolerations"][0] in pod["spec"]["tolerations"]
