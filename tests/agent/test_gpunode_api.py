"""The agent against the real API server: its GPUNode, its fields only, its identity's limits."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from cozygpu import keys
from cozygpu.agent.pods import ApiPodLookup
from cozygpu.agent.report import GPUNodeWriter
from cozygpu.agent.runner import Agent
from cozygpu.devcluster import apply, chart
from cozygpu.devcluster import sysfs_tree as layouts
from cozygpu.devcluster.fake_kubelet import Device, FakeKubelet, Pod
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.devcluster.sysfs_tree import SysfsTree
from cozygpu.kube import Client, resource_path
from cozygpu.kube import errors as kube_errors

AGENT_NAMESPACE = chart.DEFAULT_NAMESPACE
BINDER_CONDITION = {"type": "Eligible", "status": "True", "reason": "Schedulable", "message": "set by the binder",
                    "lastTransitionTime": "2026-12-01T08:00:00Z"}


def gpunode_path(name: str | None = None, subresource: str | None = None) -> str:
    return resource_path(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL, name=name, subresource=subresource)


def node_name() -> str:
    return f"gpu-node-{uuid.uuid4().hex[:8]}"


def is_agent_object(obj: dict[str, Any]) -> bool:
    name = obj["metadata"]["name"]
    return name in {"cozygpu-agent", "cozygpu-agent-own-node"} and obj["kind"] != "DaemonSet"


@pytest.fixture
async def agent_identity(
    plane: ControlPlane, admin: Client,
) -> AsyncIterator[Callable[[str | None], Awaitable[Client]]]:
    """The chart's agent ServiceAccount, role and policy installed; ``await identity(node)``: a client with
    the agent's pod-bound token for ``node`` (``None``: a token bound to no pod, so naming no node)."""
    objects = [obj for obj in await asyncio.to_thread(chart.render, {"gpu": {"enabled": True}})
               if is_agent_object(obj)]
    assert {obj["kind"] for obj in objects} == {
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    if await admin.get_or_none(resource_path("", "v1", "namespaces", name=AGENT_NAMESPACE)) is None:
        await admin.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": AGENT_NAMESPACE}})
    await apply.apply_objects(admin, objects, namespace=AGENT_NAMESPACE)
    made: list[Client] = []

    async def identity(node: str | None) -> Client:
        token = await plane.service_account_token(admin, namespace=AGENT_NAMESPACE,
                                                  service_account="cozygpu-agent", node_name=node)
        client = plane.token_client(token)
        made.append(client)
        return client

    yield identity
    for client in made:
        await client.close()


def make_agent(client: Client, node: str, tree: SysfsTree, socket_path: str) -> Agent:
    return Agent(sysfs_root=tree.root, socket_path=socket_path, writer=GPUNodeWriter(client, node),
                 pod_lookup=ApiPodLookup(client, node), interval=15.0, kubelet_timeout=5.0)


async def test_the_agent_creates_its_missing_gpunode_and_leaves_other_nodes_alone(
    admin: Client, agent_identity: Callable[[str | None], Awaitable[Client]], tree: SysfsTree,
    kubelet: FakeKubelet, socket_path: str,
) -> None:
    mine, other = node_name(), node_name()
    await admin.create(gpunode_path(), {"apiVersion": keys.API_VERSION, "kind": keys.GPUNODE_KIND,
                                        "metadata": {"name": other}})
    other_before = await admin.merge_patch(gpunode_path(other, "status"), {"status": {
        "resourceNames": ["nvidia.com/other"], "conditions": [BINDER_CONDITION]}})
    hgx = layouts.hgx_passthrough(tree)
    kubelet.allocatable = [Device(hgx.resource, "30", (0,)), Device(hgx.resource, "120", (1,))]
    client = await agent_identity(mine)

    assert await make_agent(client, mine, tree, socket_path).cycle() == 15.0

    stored = await admin.get(gpunode_path(mine))
    assert stored["status"]["resourceNames"] == [hgx.resource]
    assert [(d["address"], d["allocatable"]) for d in stored["status"]["devices"]] == [
        (hgx.gpus[0], 1), (hgx.gpus[1], 1)]
    assert (stored["status"]["deviceCount"], stored["status"]["allocatable"]) == (2, 2)
    assert stored["status"]["agent"]["problems"] == []
    assert "conditions" not in stored["status"]
    assert await admin.get(gpunode_path(other)) == other_before


async def test_a_condition_written_by_the_binder_survives_every_patch_of_the_agent(
    admin: Client, tree: SysfsTree, kubelet: FakeKubelet, socket_path: str,
) -> None:
    node = node_name()
    layout = layouts.mdev_parent(tree)
    kubelet.allocatable = [Device(layout.small_resource, uuid) for uuid in layout.small]
    agent = make_agent(admin, node, tree, socket_path)
    await agent.cycle()
    await admin.merge_patch(gpunode_path(node, "status"), {"status": {"conditions": [BINDER_CONDITION]}})
    first = (await admin.get(gpunode_path(node)))["status"]

    kubelet.allocatable = kubelet.allocatable[:2]  # one mdev went unhealthy
    await agent.cycle()
    changed = (await admin.get(gpunode_path(node)))["status"]
    assert changed["conditions"] == [BINDER_CONDITION]
    assert changed["devices"][0]["allocatable"] == 2

    await kubelet.stop()  # kubelet gone: the last report stays, the reason is added
    await agent.cycle()
    kept = (await admin.get(gpunode_path(node)))["status"]
    assert kept["conditions"] == [BINDER_CONDITION]
    assert kept["devices"] == changed["devices"]
    assert kept["resourceNames"] == changed["resourceNames"]
    assert kept["agent"]["lastReport"] == changed["agent"]["lastReport"]
    assert kept["agent"]["problems"][-1] == "the last complete report is kept"
    assert first["agent"]["problems"] == []


#: Written by the agent, not yet in the GPUNode schema (asked of the CRD's owner): pruned on write.


async def write_every_layout(admin: Client, tree: SysfsTree, kubelet: FakeKubelet,
                             socket_path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    layouts.hgx_passthrough(tree)
    mdev = layouts.mdev_parent(tree)
    vgpu = layouts.vgpu_vfs(tree)
    layouts.unbound_gpu(tree)
    layouts.container_plugin_gpu(tree)
    layouts.connectx_vf(tree)
    tree.function("0000:e2:00.0", vendor="10de", device="20b5", pci_class="0x030200")  # IOMMU off: no group
    kubelet.allocatable = [Device(mdev.small_resource, mdev.small[0]), Device(vgpu.resource, str(vgpu.groups[0])),
                           Device(layouts.CONTAINER_RESOURCE, layouts.CONTAINER_UUID)]
    node = node_name()
    _, written = await make_agent(admin, node, tree, socket_path).once()
    stored: dict[str, Any] = (await admin.get(gpunode_path(node)))["status"]
    return written, stored


async def test_the_schema_stores_exactly_the_status_the_agent_wrote_for_every_layout(
    admin: Client, tree: SysfsTree, kubelet: FakeKubelet, socket_path: str,
) -> None:
    written, stored = await write_every_layout(admin, tree, kubelet, socket_path)

    assert stored == written


async def test_the_agent_role_allows_its_own_writes_and_pod_reads_and_nothing_wider(
    admin: Client, agent_identity: Callable[[str | None], Awaitable[Client]], namespace: str,
) -> None:
    node = node_name()
    client = await agent_identity(node)
    pod = await admin.create(resource_path("", "v1", "pods", namespace=namespace), {
        "metadata": {"name": "virt-launcher-vm"}, "spec": {"nodeName": node, "containers": [
            {"name": "compute", "image": "cozygpu.invalid/launcher"}]}})

    await GPUNodeWriter(client, node).write({"resourceNames": []})
    assert (await client.get(resource_path("", "v1", "pods", namespace=namespace, name="virt-launcher-vm"))
            )["metadata"]["uid"] == pod["metadata"]["uid"]

    refused = [
        client.list_objects(resource_path("", "v1", "pods", namespace=namespace)),
        client.delete(gpunode_path(node)),
        client.merge_patch(gpunode_path(node), {"metadata": {"labels": {"x": "y"}}}),
        client.get(gpunode_path(node)),
        client.create(resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, namespace=namespace),
                      {"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND, "metadata": {"name": "d"},
                       "spec": {"className": "c", "count": 1}}),
    ]
    for call in refused:
        with pytest.raises(kube_errors.Forbidden):
            await call


async def refused_within(write: Callable[[], Awaitable[Any]], seconds: float = 15.0) -> kube_errors.Forbidden:
    """The policy is enforced once the API server has loaded it, a moment after it is created."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            await write()
        except kube_errors.Forbidden as err:
            return err
        if time.monotonic() > deadline:
            raise AssertionError("the write was never refused")
        await asyncio.sleep(0.2)


async def test_with_the_agent_policy_installed_writing_another_nodes_gpunode_is_refused(
    admin: Client, agent_identity: Callable[[str | None], Awaitable[Client]],
) -> None:
    mine, other = node_name(), node_name()
    client = await agent_identity(mine)
    # Wait until the API server enforces the policy with a write that leaves no trace (a dry run).
    probe = {"apiVersion": keys.API_VERSION, "kind": keys.GPUNODE_KIND, "metadata": {"name": node_name()}}
    await refused_within(lambda: client.create(gpunode_path(), probe, dry_run=True))

    with pytest.raises(kube_errors.Forbidden) as refused:
        await GPUNodeWriter(client, other).write({"resourceNames": ["x/y"]})

    assert "may write only GPUNode " + mine in refused.value.message
    assert await admin.get_or_none(gpunode_path(other)) is None
    await GPUNodeWriter(client, mine).write({"resourceNames": []})  # its own node's is fine
    await admin.create(gpunode_path(), {"apiVersion": keys.API_VERSION, "kind": keys.GPUNODE_KIND,
                                        "metadata": {"name": other}})
    with pytest.raises(kube_errors.Forbidden):
        await GPUNodeWriter(client, other).write({"resourceNames": ["x/y"]})
    assert "status" not in await admin.get(gpunode_path(other))


async def test_an_agent_token_naming_no_node_writes_nothing(
    admin: Client, agent_identity: Callable[[str | None], Awaitable[Client]],
) -> None:
    node = node_name()
    client = await agent_identity(None)

    refusal = await refused_within(lambda: GPUNodeWriter(client, node).write({"resourceNames": []}))

    assert "names no node" in refusal.message


async def agent_once(plane: ControlPlane, node: str, tree: SysfsTree, socket_path: str) -> tuple[int, Any]:
    """Run ``cozygpu agent --once`` as a person would; its exit code and the JSON it printed."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cozygpu.cli", "agent", "--once", "--node", node, "--sysfs-root", str(tree.root),
        "--podresources-socket", socket_path, "--kubeconfig", str(plane.kubeconfig),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=Path(__file__).parents[2])
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    assert out, err.decode()
    return proc.returncode, json.loads(out)


async def test_agent_once_with_kubelet_missing_exits_1_and_writes_only_why(
    plane: ControlPlane, admin: Client, tree: SysfsTree, socket_path: str,
) -> None:
    node = node_name()
    layouts.hgx_passthrough(tree)

    returncode, printed = await agent_once(plane, node, tree, socket_path)

    assert returncode == 1
    assert set(printed) == {"agent"}
    assert printed["agent"]["problems"][0] == f"kubelet pod-resources socket {socket_path} is missing " \
        "(is kubelet running, is the path right?)"
    assert (await admin.get(gpunode_path(node)))["status"] == printed


async def test_agent_once_prints_the_status_it_writes_skipping_a_completed_pod(
    plane: ControlPlane, admin: Client, namespace: str, tree: SysfsTree, kubelet: FakeKubelet,
    socket_path: str,
) -> None:
    node = node_name()
    hgx = layouts.hgx_passthrough(tree)
    pods_path = resource_path("", "v1", "pods", namespace=namespace)
    for name in ("virt-launcher-done", "virt-launcher-running"):
        await admin.create(pods_path, {"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [
            {"name": "compute", "image": "cozygpu.invalid/launcher"}]}})
    await admin.merge_patch(resource_path("", "v1", "pods", namespace=namespace, name="virt-launcher-done",
                                          subresource="status"), {"status": {"phase": "Succeeded"}})
    kubelet.allocatable = [Device(hgx.resource, "30"), Device(hgx.resource, "120")]
    kubelet.pods = [Pod(namespace, "virt-launcher-done", [("compute", [Device(hgx.resource, "30")])]),
                            Pod(namespace, "virt-launcher-running", [("compute", [Device(hgx.resource, "120")])])]

    returncode, printed = await agent_once(plane, node, tree, socket_path)

    assert returncode == 0
    assert [(d["address"], d["allocatable"], d["allocated"]) for d in printed["devices"]] == [
        (hgx.gpus[0], 1, 0), (hgx.gpus[1], 1, 1)]
    stored = (await admin.get(gpunode_path(node)))["status"]
    assert stored["agent"] == printed["agent"]
    assert stored["resourceNames"] == printed["resourceNames"]
    assert [d["address"] for d in stored["devices"]] == [d["address"] for d in printed["devices"]]
