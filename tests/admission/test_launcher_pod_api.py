"""The launcher pod webhook on the full plane: the stand-in's pod is pinned, kube-scheduler obeys, kwok runs it."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path
from typing import Any

import pytest

from cozygpu import keys
from cozygpu.admission.pods import pin_patch
from cozygpu.devcluster import nodes
from cozygpu.devcluster.kubevirt import KubeVirtStandIn
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, errors, resource_path
from cozygpu.views import specs
from tests.admission.harness import VMIS, admission, vmi_body, with_binder
from tests.admission.test_vmi_webhook_api import status, until
from tests.binder.support import VMI_CRD, device_path
from tests.binder.world import World
from tests.support.crds import install_fixture_crd
from tests.support.planes import Fleet


async def test_the_launcher_pod_is_pinned_to_its_devices_node_and_the_scheduler_places_it_there(
        full_plane: ControlPlane, full_admin: Client, fleet: Fleet, tmp_path: Path) -> None:
    admin = full_admin
    for crd in ("virtualmachines.kubevirt.io", VMI_CRD):  # the stand-in watches both
        await install_fixture_crd(admin, crd)
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    await admin.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": namespace}})
    world = await World.make(admin, namespace)
    # The target serves the class; the decoys carry the same device-plugin resource (so the scheduler may
    # put the pod there) but report no unit to cozygpu, and are far emptier: without the pin the scheduler's
    # least-allocated scoring sends the pod to a decoy.
    target = world.node_name("target")
    decoys = [world.node_name(f"decoy{i}") for i in range(3)]
    await fleet(nodes.SimNode(target, {world.resource: 2}),
                *(nodes.SimNode(d, {world.resource: 2}, cpu="512", memory="4Ti") for d in decoys))
    await world.node("target", 2, create_node=False)
    standin = asyncio.create_task(KubeVirtStandIn(admin, namespace=namespace).run())
    try:
        async with admission(full_plane, admin, namespace, tmp_path) as served, with_binder(admin, served.cache):
            refs = [{"template": "gpu", "class": world.gpu_class, "count": 1}]
            vmi = await admin.create(VMIS.format(namespace), vmi_body("vm", refs))
            uid = vmi["metadata"]["uid"]
            pods = resource_path("", "v1", "pods", namespace=namespace)

            async def running() -> dict[str, Any]:
                async with asyncio.timeout(60):
                    while True:
                        listed = await admin.list_objects(pods, params={"labelSelector":
                                                                        f"kubevirt.io/created-by={uid}"})
                        for pod in listed["items"]:
                            if (pod.get("status") or {}).get("phase") == "Running":
                                found: dict[str, Any] = pod
                                return found
                        await asyncio.sleep(0.2)

            try:
                pod = await running()
            except TimeoutError:
                listed = await admin.list_objects(pods)
                now = await admin.get(f"{VMIS.format(namespace)}/vm")
                seen = [(p["metadata"]["name"], p["spec"].get("nodeName"), p.get("status")) for p in listed["items"]]
                raise AssertionError(f"no Running launcher: VMI status {now.get('status')}, pods {seen}") from None
            assert pod["spec"]["nodeName"] == target
            terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            assert terms["nodeSelectorTerms"] == [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                                    "values": [target]}]}]
            await until(served.cache, lambda: bool(served.cache.store(specs.GPU_DEVICES).list(namespace)))
            assert any(status(served.cache, namespace, d["metadata"]["name"]).get("nodeName") == target
                       for d in served.cache.store(specs.GPU_DEVICES).list(namespace))
    finally:
        standin.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await standin
        await world.cleanup()


def test_the_pin_is_anded_into_every_term_the_pod_has_and_adds_only_missing_tolerations() -> None:
    pod = {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                              {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}},
        "tolerations": [{"key": "gpu", "operator": "Exists"}]}}
    patch = pin_patch(pod, "n7", [{"key": "gpu", "operator": "Exists"}, {"key": "dedicated", "operator": "Exists"}])
    pin = {"key": "metadata.name", "operator": "In", "values": ["n7"]}
    assert patch == [
        {"op": "replace", "path": "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/"
                                  "nodeSelectorTerms",
         "value": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}], "matchFields": [pin]},
                   {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}], "matchFields": [pin]}]},
        {"op": "add", "path": "/spec/tolerations/-", "value": {"key": "dedicated", "operator": "Exists"}},
    ]
    assert pin_patch({"spec": {}}, "n1", []) == [{"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}]


async def test_a_launcher_pod_whose_devices_are_not_bound_on_one_node_is_refused_with_the_reason(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    await install_fixture_crd(admin, VMI_CRD)
    world = await World.make(admin, namespace)
    pods = resource_path("", "v1", "pods", namespace=namespace)

    def launcher(vmi: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "generateName": f"virt-launcher-{vmi}-", "labels": {keys.DEVICE_REFS_LABEL: "true",
                                                               "kubevirt.io": "virt-launcher"},
            "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": vmi,
                                 "uid": str(uuid.uuid4()), "controller": True}]},
            "spec": {"containers": [{"name": "compute", "image": "cozygpu.invalid/virt-launcher"}]}}

    try:
        await world.node("n1", 2)
        async with admission(plane, admin, namespace, tmp_path) as served:
            with pytest.raises(errors.ApiError, match=f"launcher pod of VMI {namespace}/none: no GPUDevice is "
                                                      "attached to the VMI"):
                await admin.create(pods, launcher("none"), dry_run=True)
            await world.order("waiting", 1, status={"attachment": {"vmi": "vm"}})
            await until(served.cache, lambda: bool(status(served.cache, namespace, "waiting").get("attachment")))
            with pytest.raises(errors.ApiError, match=r"GPUDevices not Bound: waiting \(Pending\)"):
                await admin.create(pods, launcher("vm"), dry_run=True)
            await admin.merge_patch(f"{device_path(namespace, 'waiting', status=True)}",
                                    {"status": world.held("n1")})
            await until(served.cache, lambda: status(served.cache, namespace, "waiting").get("phase") == "Bound")
            pinned = await admin.create(pods, launcher("vm"), dry_run=True)
            terms = pinned["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [world.node_name("n1")]
    finally:
        await world.cleanup()
