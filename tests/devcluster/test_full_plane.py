"""The full local plane is the real thing: namespace deletion, garbage collection,
scheduling onto simulated GPU nodes, and node lifecycle, each done by the real
component (kube-controller-manager, kube-scheduler, kwok)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from cozygpu.devcluster import nodes
from cozygpu.devcluster.plane import NODE_MONITOR_PERIOD
from cozygpu.kube import Client, errors, resource_path
from tests.support.planes import Fleet
from tests.support.waiting import eventually

NAMESPACES = resource_path("", "v1", "namespaces")


def gpu_name() -> str:
    return f"nvidia.com/TEST_{uuid.uuid4().hex[:8]}"


def pod(name: str, *, resource: str | None = None, affinity_node: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "compute", "image": "cozygpu.invalid/compute"}
    if resource:
        container["resources"] = {"limits": {resource: "1"}, "requests": {resource: "1"}}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 0}
    if affinity_node:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [affinity_node]}]}]}}}
    return {"metadata": {"name": name}, "spec": spec}


async def new_namespace(admin: Client) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    await admin.create(NAMESPACES, {"metadata": {"name": name}})
    return name


async def test_deleting_a_namespace_that_holds_objects_completes(full_admin: Client) -> None:
    namespace = await new_namespace(full_admin)
    configmaps = resource_path("", "v1", "configmaps", namespace=namespace)
    for i in range(3):
        await full_admin.create(configmaps, {"metadata": {"name": f"cm-{i}", "finalizers": []}})
    await full_admin.delete(f"{NAMESPACES}/{namespace}")

    async def gone() -> bool:
        return await full_admin.get_or_none(f"{NAMESPACES}/{namespace}") is None

    await eventually(gone, what=f"namespace {namespace} still exists: the namespace controller did not empty it")


async def test_an_object_whose_owner_is_deleted_is_garbage_collected(full_admin: Client) -> None:
    namespace = await new_namespace(full_admin)
    configmaps = resource_path("", "v1", "configmaps", namespace=namespace)
    owner = await full_admin.create(configmaps, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    await full_admin.create(configmaps, {"metadata": {"name": "dependent", "ownerReferences": [ref]}})
    await full_admin.delete(f"{configmaps}/owner")

    async def collected() -> bool:
        return await full_admin.get_or_none(f"{configmaps}/dependent") is None

    await eventually(collected, what="the dependent ConfigMap outlived its owner: no garbage collector ran")


async def test_a_gpu_pod_lands_on_the_one_node_with_that_resource_and_runs(
    full_admin: Client, fleet: Fleet
) -> None:
    resource, tag = gpu_name(), uuid.uuid4().hex[:6]
    gpu_node, plain_node = f"gpu-{tag}", f"cpu-{tag}"
    await fleet(nodes.SimNode(gpu_node, {resource: 1}), nodes.SimNode(plain_node))
    namespace = await new_namespace(full_admin)
    pods = resource_path("", "v1", "pods", namespace=namespace)
    await full_admin.create(pods, pod("first", resource=resource))

    async def running() -> dict[str, Any] | None:
        found = await full_admin.get(f"{pods}/first")
        return found if found.get("status", {}).get("phase") == "Running" else None

    first = await eventually(running, what="the GPU pod never reached Running")
    assert first["spec"]["nodeName"] == gpu_node

    await full_admin.create(pods, pod("second", resource=resource))

    async def unschedulable() -> dict[str, Any] | None:
        found = await full_admin.get(f"{pods}/second")
        for condition in found.get("status", {}).get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return dict(condition)
        return None

    condition = await eventually(unschedulable, what="the pod beyond capacity got no Unschedulable condition")
    assert f"Insufficient {resource}" in condition["message"]
    second = await full_admin.get(f"{pods}/second")
    assert second["status"]["phase"] == "Pending"
    assert not second["spec"].get("nodeName")


async def test_a_pod_with_a_required_node_affinity_lands_only_on_that_node(full_admin: Client, fleet: Fleet) -> None:
    tag = uuid.uuid4().hex[:6]
    names = await fleet(*(nodes.SimNode(f"aff-{tag}-{i}") for i in range(3)))
    namespace = await new_namespace(full_admin)
    pods = resource_path("", "v1", "pods", namespace=namespace)
    for i in range(4):
        await full_admin.create(pods, pod(f"pinned-{i}", affinity_node=names[2]))

    async def all_bound() -> list[str] | None:
        listed = await full_admin.list_objects(pods)
        placed = [p["spec"].get("nodeName") for p in listed["items"]]
        return placed if all(placed) else None

    assert await eventually(all_bound, what="the pinned pods were not all scheduled") == [names[2]] * 4


async def test_a_node_whose_heartbeats_stop_goes_not_ready_is_tainted_unreachable_and_recovers(
    full_admin: Client, fleet: Fleet
) -> None:
    tag = uuid.uuid4().hex[:6]
    kept, dead = await fleet(nodes.SimNode(f"kept-{tag}"), nodes.SimNode(f"dead-{tag}"))
    path = f"{nodes.NODES}/{dead}"
    # The case that wedged the node-lifecycle controller: it has seen kwok's last renewal when the heartbeats
    # stop. Wait for a renewal, then for two of its passes over the nodes (it reads the Lease on each).
    lease = f"{nodes.NODE_LEASES}/{dead}"
    first = (await full_admin.get(lease))["spec"]["renewTime"]

    async def renewed() -> bool:
        return bool((await full_admin.get(lease))["spec"]["renewTime"] != first)

    await eventually(renewed, timeout=60, what=f"kwok never renewed {dead}'s Lease")
    await asyncio.sleep(2 * NODE_MONITOR_PERIOD)  # its passes are timed, not events: nothing to await
    await nodes.stop_heartbeats(full_admin, dead)

    async def unreachable() -> dict[str, Any] | None:
        node = await full_admin.get(path)
        taints = {t["key"]: t["effect"] for t in node["spec"].get("taints") or []}
        if not nodes.is_ready(node) and taints.get("node.kubernetes.io/unreachable") == "NoExecute":
            return node
        return None

    node = await eventually(unreachable, timeout=90, what=f"{dead} never went NotReady/unreachable")
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "Unknown"
    assert ready["reason"] == "NodeStatusUnknown"
    still = await full_admin.get(f"{nodes.NODES}/{kept}")
    assert nodes.is_ready(still)
    assert nodes.schedulable_taints(still) == []
    # Heartbeats back: kwok reports Ready again and the node-lifecycle controller lifts the taints.
    await nodes.resume_heartbeats(full_admin, dead)
    await nodes.wait_ready(full_admin, [dead], timeout=90)
    assert nodes.schedulable_taints(await full_admin.get(path)) == []


async def test_removed_nodes_are_deleted(full_admin: Client, fleet: Fleet) -> None:
    names = await fleet(nodes.SimNode(f"rm-{uuid.uuid4().hex[:6]}"))
    await nodes.remove_nodes(full_admin, names)
    for name in names:
        with pytest.raises(errors.NotFound):
            await full_admin.get(f"{nodes.NODES}/{name}")
