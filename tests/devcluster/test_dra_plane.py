"""Dynamic Resource Allocation on the full local plane: the simulated NVIDIA driver's
slices, the real kube-scheduler allocating from them, and the real resourceclaim
controller; above all, a claim allocated by its holder (as cozygpu will hold a GPU
for a stopped VM) and reserved for a non-pod consumer keeps its device.

What the holder must write, as Kubernetes 1.36 showed: an ``allocationTimestamp``
(without one the scheduler's reservation for a pod is refused: the allocation is
immutable), and the permission on ``resourceclaims/binding`` cluster-wide besides
``resourceclaims/status``."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from cozygpu import keys
from cozygpu.api import claims as claims_api
from cozygpu.devcluster import dra_driver, nodes
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, errors, resource_path
from cozygpu.model.dra import DeviceRef
from tests.support.planes import Fleet
from tests.support.waiting import eventually

NAMESPACES = resource_path("", "v1", "namespaces")
#: The scheduler's finalizer on a claim it allocated (resourceapi.Finalizer).
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"


def claims_path(namespace: str) -> str:
    return resource_path(dra_driver.API_GROUP, dra_driver.API_VERSION, "resourceclaims", namespace=namespace)


def claim_spec() -> dict[str, Any]:
    """One vfio GPU, in one request named ``gpu``."""
    return {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": dra_driver.DEVICE_CLASS}}]}}


def claim(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": claim_spec()}


def claim_pod(name: str, *, claim_name: str | None = None, template: str | None = None) -> dict[str, Any]:
    """A pod whose one container uses the claim ``claim_name``, or one made for it from ``template``."""
    source = {"resourceClaimName": claim_name} if claim_name else {"resourceClaimTemplateName": template}
    container = {"name": "compute", "image": "cozygpu.invalid/compute", "resources": {"claims": [{"name": "gpu"}]}}
    return {"metadata": {"name": name}, "spec": {
        "resourceClaims": [{"name": "gpu", **source}], "containers": [container], "terminationGracePeriodSeconds": 0,
    }}


def held_status(node: str, device: str, holder: dict[str, str]) -> dict[str, Any]:
    """What cozygpu writes to hold ``device`` of ``node`` (``api.claims.hold_status``): the allocation itself,
    reserved for the GPUDevice ``holder``."""
    return claims_api.hold_status(node, [DeviceRef(dra_driver.DRIVER, node, device)], device_name=holder["name"],
                                  device_uid=holder["uid"], now=datetime.now(UTC))


async def gpudevice(admin: Client, namespace: str, name: str) -> dict[str, str]:
    """A GPUDevice to hold for (no controller runs here: it stays as made); the claim's owner and consumer."""
    made = await admin.create(resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, namespace=namespace),
                              {"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND, "metadata": {"name": name},
                               "spec": {"className": "dra-h100", "count": 1}})
    return claims_api.consumer(name, made["metadata"]["uid"])


async def new_namespace(admin: Client) -> tuple[str, str, str]:
    """A fresh namespace: its name and the paths of its ResourceClaims and Pods."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    await admin.create(NAMESPACES, {"metadata": {"name": name}})
    return name, claims_path(name), resource_path("", "v1", "pods", namespace=name)


async def gpu_nodes(admin: Client, fleet: Fleet, prefix: str, *gpus: int) -> list[str]:
    """Simulated nodes with ``gpus[i]`` vfio GPUs published on the i-th (none on a 0)."""
    tag = uuid.uuid4().hex[:6]
    names = await fleet(*(nodes.SimNode(f"{prefix}-{tag}-{i}") for i in range(len(gpus))))
    await dra_driver.publish(admin, {name: count for name, count in zip(names, gpus, strict=True) if count})
    return names


async def running(admin: Client, path: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        found = await admin.get(path)
        return found if found.get("status", {}).get("phase") == "Running" else None

    result: dict[str, Any] = await eventually(check, what=f"{path} never reached Running")
    return result


async def not_scheduled(admin: Client, path: str, *, what: str) -> dict[str, Any]:
    """The pod's PodScheduled=False condition, once the scheduler has written one."""

    async def check() -> dict[str, Any] | None:
        found = await admin.get(path)
        for condition in found.get("status", {}).get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition["status"] == "False":
                return dict(condition)
        return None

    condition: dict[str, Any] = await eventually(check, what=what)
    return condition


async def hold(admin: Client, namespace: str, node: str, device: str, *,
               stamped: bool = True) -> tuple[dict[str, str], dict[str, Any]]:
    """A GPUDevice ``held`` and its hold as cozygpu builds it (``api.claims``), allocated by the test standing in
    for the binder: the claim's consumer and the stored claim."""
    consumer, claims = await gpudevice(admin, namespace, "held"), claims_path(namespace)
    await admin.create(claims, claims_api.hold_claim("held", consumer["uid"], device_class=dra_driver.DEVICE_CLASS,
                                                     count=1))
    status = held_status(node, device, consumer)
    if not stamped:
        del status["allocation"]["allocationTimestamp"]
    return consumer, await admin.merge_patch(f"{claims}/held/status", {"status": status})


def results(found_claim: dict[str, Any]) -> list[tuple[str, str, str]]:
    allocation = found_claim.get("status", {}).get("allocation") or {}
    return [(r["driver"], r["pool"], r["device"]) for r in allocation.get("devices", {}).get("results") or []]


async def test_publishing_again_changes_nothing_a_new_count_raises_the_generation_and_the_node_takes_its_slice(
    full_admin: Client, fleet: Fleet
) -> None:
    [node] = await gpu_nodes(full_admin, fleet, "pub", 3)
    path = f"{dra_driver.RESOURCE_SLICES}/{dra_driver.slice_name(node)}"
    first = await full_admin.get(path)
    await dra_driver.publish(full_admin, {node: 3})
    again = await full_admin.get(path)
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert [d["name"] for d in again["spec"]["devices"]] == ["gpu-vfio-0", "gpu-vfio-1", "gpu-vfio-2"]
    assert again["spec"]["pool"] == {"name": node, "generation": 1, "resourceSliceCount": 1}
    await dra_driver.publish(full_admin, {node: 4})
    grown = await full_admin.get(path)
    assert len(grown["spec"]["devices"]) == 4
    assert grown["spec"]["pool"]["generation"] == 2
    await nodes.remove_nodes(full_admin, [node])

    async def collected() -> bool:
        return await full_admin.get_or_none(path) is None

    await eventually(collected, what="the slice outlived its Node: the garbage collector did not take it")


async def test_a_pod_with_a_claim_from_a_template_runs_on_the_node_with_vfio_gpus(
    full_admin: Client, fleet: Fleet
) -> None:
    gpu_node, _plain = await gpu_nodes(full_admin, fleet, "dra", 1, 0)
    namespace, claims, pods = await new_namespace(full_admin)
    templates = resource_path(dra_driver.API_GROUP, dra_driver.API_VERSION, "resourceclaimtemplates",
                              namespace=namespace)
    await full_admin.create(templates, {"metadata": {"name": "one-gpu"}, "spec": {"spec": claim_spec()}})
    await full_admin.create(pods, claim_pod("vm", template="one-gpu"))

    pod = await running(full_admin, f"{pods}/vm")
    assert pod["spec"]["nodeName"] == gpu_node
    # The resourceclaim controller made the claim; the scheduler allocated it and reserved it for the pod.
    [status] = pod["status"]["resourceClaimStatuses"]
    made = await full_admin.get(f"{claims}/{status['resourceClaimName']}")
    assert results(made) == [(dra_driver.DRIVER, gpu_node, "gpu-vfio-0")]
    assert [(r["resource"], r["name"]) for r in made["status"]["reservedFor"]] == [("pods", "vm")]
    assert DELETE_PROTECTION in made["metadata"]["finalizers"]


async def test_a_claim_held_for_a_gpudevice_keeps_its_device_from_other_pods(
    full_admin: Client, fleet: Fleet
) -> None:
    [node] = await gpu_nodes(full_admin, fleet, "held", 2)
    namespace, claims, pods = await new_namespace(full_admin)
    _consumer, held = await hold(full_admin, namespace, node, "gpu-vfio-0")
    for name in ("foreign-1", "foreign-2"):
        await full_admin.create(claims, claim(name))

    await full_admin.create(pods, claim_pod("foreign-1", claim_name="foreign-1"))
    first = await running(full_admin, f"{pods}/foreign-1")
    assert first["spec"]["nodeName"] == node
    assert results(await full_admin.get(f"{claims}/foreign-1")) == [(dra_driver.DRIVER, node, "gpu-vfio-1")]

    await full_admin.create(pods, claim_pod("foreign-2", claim_name="foreign-2"))
    condition = await not_scheduled(full_admin, f"{pods}/foreign-2",
                                    what="the pod beyond the free GPUs got no PodScheduled=False")
    assert condition["reason"] == "Unschedulable"
    assert "cannot allocate all claims" in condition["message"]
    assert not (await full_admin.get(f"{pods}/foreign-2"))["spec"].get("nodeName")
    assert not results(await full_admin.get(f"{claims}/foreign-2"))
    still = await full_admin.get(f"{claims}/held")
    assert still["status"] == held["status"]


async def test_a_pod_naming_the_held_claim_joins_its_consumer_and_leaves_the_allocation_when_deleted(
    full_admin: Client, fleet: Fleet
) -> None:
    _other, node = await gpu_nodes(full_admin, fleet, "join", 2, 2)
    namespace, claims, pods = await new_namespace(full_admin)
    consumer, held = await hold(full_admin, namespace, node, "gpu-vfio-1")
    allocation = held["status"]["allocation"]

    await full_admin.create(pods, claim_pod("vm", claim_name="held"))
    pod = await running(full_admin, f"{pods}/vm")
    assert pod["spec"]["nodeName"] == node  # the claim's node selector, not a free choice of two nodes
    joined = await full_admin.get(f"{claims}/held")
    vm_ref = {"resource": "pods", "name": "vm", "uid": pod["metadata"]["uid"]}
    assert joined["status"]["reservedFor"] == [consumer, vm_ref]
    assert joined["status"]["allocation"] == allocation
    # The scheduler adds its finalizer only to an allocation of its own.
    assert DELETE_PROTECTION not in (joined["metadata"].get("finalizers") or [])

    await full_admin.delete(f"{pods}/vm")

    async def left() -> dict[str, Any] | None:
        found = await full_admin.get(f"{claims}/held")
        return found if found["status"].get("reservedFor") == [consumer] else None

    after = await eventually(left, what="the resourceclaim controller did not drop the deleted pod from reservedFor")
    assert await full_admin.get_or_none(f"{pods}/vm") is None
    assert after["status"]["allocation"] == allocation


async def test_a_namespace_holding_a_pods_allocated_claim_finishes_deleting(
    full_admin: Client, fleet: Fleet
) -> None:
    await gpu_nodes(full_admin, fleet, "nsdel", 1)
    namespace, claims, pods = await new_namespace(full_admin)
    await full_admin.create(claims, claim("gpu"))
    await full_admin.create(pods, claim_pod("vm", claim_name="gpu"))
    await running(full_admin, f"{pods}/vm")
    allocated = await full_admin.get(f"{claims}/gpu")
    assert DELETE_PROTECTION in allocated["metadata"]["finalizers"]
    assert [r["name"] for r in allocated["status"]["reservedFor"]] == ["vm"]

    await full_admin.delete(f"{NAMESPACES}/{namespace}")

    async def gone() -> bool:
        return await full_admin.get_or_none(f"{NAMESPACES}/{namespace}") is None

    await eventually(gone, timeout=60, what=f"namespace {namespace} never finished deleting: its claim stayed reserved")


async def test_a_held_claim_written_without_allocation_timestamp_takes_no_pod(
    full_admin: Client, fleet: Fleet
) -> None:
    [node] = await gpu_nodes(full_admin, fleet, "nots", 1)
    namespace, claims, pods = await new_namespace(full_admin)
    await hold(full_admin, namespace, node, "gpu-vfio-0", stamped=False)
    await full_admin.create(pods, claim_pod("vm", claim_name="held"))
    # With DRADeviceBindingConditions (beta, on in 1.36) the scheduler stamps a missing allocationTimestamp when it
    # reserves the claim for the pod, and the API server refuses that as a change to an immutable allocation.
    condition = await not_scheduled(full_admin, f"{pods}/vm",
                                    what="the pod naming a claim without allocationTimestamp was not refused")
    assert condition["reason"] == "SchedulerError"
    assert f'add reservation to claim {namespace}/held' in condition["message"]
    assert "status.allocation: Invalid value" in condition["message"]
    # 1.36 says "field is immutable"; 1.37's declarative validation "field cannot be modified once set".
    assert condition["message"].endswith(("field is immutable", "field cannot be modified once set"))
    assert not (await full_admin.get(f"{pods}/vm"))["spec"].get("nodeName")
    assert [r["resource"] for r in (await full_admin.get(f"{claims}/held"))["status"]["reservedFor"]] == ["gpudevices"]


async def test_writing_a_hold_needs_the_binding_permission_beside_status(
    full_plane: ControlPlane, full_admin: Client
) -> None:
    namespace, claims, _pods = await new_namespace(full_admin)
    holder_device = await gpudevice(full_admin, namespace, "held")
    await full_admin.create(claims, claims_api.hold_claim("held", holder_device["uid"],
                                                          device_class=dra_driver.DEVICE_CLASS, count=1))
    user, rbac = f"holder-{uuid.uuid4().hex[:6]}", "rbac.authorization.k8s.io"
    status_rule = {"apiGroups": [dra_driver.API_GROUP], "resources": ["resourceclaims", "resourceclaims/status"],
                   "verbs": ["get", "patch", "update"]}
    binding_rule = {"apiGroups": [dra_driver.API_GROUP], "resources": ["resourceclaims/binding"],
                    "verbs": ["patch", "update"]}
    role_path = resource_path(rbac, "v1", "clusterroles")
    await full_admin.create(role_path, {"metadata": {"name": user}, "rules": [status_rule]})
    await full_admin.create(resource_path(rbac, "v1", "clusterrolebindings"), {
        "metadata": {"name": user}, "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": user},
        "subjects": [{"apiGroup": rbac, "kind": "User", "name": user}],
    })
    hold = {"status": held_status("some-node", "gpu-vfio-0", holder_device)}
    async with full_plane.client(user, ()) as holder:
        # DRAResourceClaimGranularStatusAuthorization (beta, on in 1.36): status.allocation and status.reservedFor
        # are written only with the synthetic subresource resourceclaims/binding, granted cluster-wide.
        with pytest.raises(errors.Invalid) as refused:
            await holder.merge_patch(f"{claims}/held/status", hold)
        assert "status.allocation: Forbidden: changing status.allocation or status.reservedFor requires " \
               'resource="resourceclaims/binding", verb="patch" permission' in refused.value.message
        assert "at the cluster scope" in refused.value.message
        await full_admin.merge_patch(f"{role_path}/{user}", {"rules": [status_rule, binding_rule]})

        async def allowed() -> dict[str, Any] | None:
            try:
                return await holder.merge_patch(f"{claims}/held/status", hold)
            except errors.Invalid:
                return None

        written = await eventually(allowed, what="the hold was refused with the binding permission granted")
    assert results(written) == [(dra_driver.DRIVER, "some-node", "gpu-vfio-0")]
