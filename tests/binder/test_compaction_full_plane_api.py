"""Compaction beside a running VM, on the full plane (R-BIND-11, R-BIND-7): real kube-scheduler, kwok and the
KubeVirt stand-in.

Four 4-GPU nodes with three single-GPU holds each; one hold on the first node is a VM's, and the VM runs (its
launcher placed there by kube-scheduler, listed in the VMI's ``activePods``). An order of four is Bound on the
second node after its three stopped holds move, one to each other node, each with a ``Moved`` Event naming the
order; the VM's hold never moves and its VM keeps running.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

from cozygpu.devcluster import nodes
from cozygpu.devcluster.kubevirt import KubeVirtStandIn
from cozygpu.kube import Client, resource_path
from tests.binder.support import VMI_CRD, VMIS, device_path
from tests.binder.world import World, driven_binder
from tests.support.crds import install_fixture_crd
from tests.support.planes import Fleet
from tests.support.waiting import eventually

NAMESPACES = "/api/v1/namespaces"
NODES = ("c0", "c1", "c2", "c3")


def vmis(namespace: str, name: str | None = None) -> str:
    return resource_path(*VMIS, namespace=namespace, name=name)


async def test_an_order_of_four_moves_only_stopped_holds_while_a_vm_runs_on_the_first_node(
        full_admin: Client, fleet: Fleet) -> None:
    admin = full_admin
    for crd in ("virtualmachines.kubevirt.io", VMI_CRD):
        await install_fixture_crd(admin, crd)
    namespace = f"t-c{uuid.uuid4().hex[:8]}"
    await admin.create(NAMESPACES, {"metadata": {"name": namespace}})
    world = await World.make(admin, namespace)
    await fleet(*(nodes.SimNode(world.node_name(short), gpus={world.resource: 4}) for short in NODES))
    holds: dict[str, str] = {}
    for short in NODES:
        await world.node(short, 4, create_node=False)
        for j in range(3):
            name = f"hold-{short}-{j}"
            status: dict[str, Any] = dict(world.held(short))
            if name == "hold-c0-0":
                status["attachment"] = {"vmi": "vm"}  # what the VMI webhook writes for the start below
            await world.order(name, 1, status=status)
            holds[name] = world.node_name(short)
    first, second = world.node_name("c0"), world.node_name("c1")
    async with driven_binder(admin, timedelta(seconds=30)), asyncio.TaskGroup() as tasks:
        standin = tasks.create_task(KubeVirtStandIn(admin, namespace=namespace).run())
        await admin.create(vmis(namespace), {
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "vm"},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": first},  # the VMI webhook's pin to its hold
                     "domain": {"devices": {"gpus": [{"name": "gpu0", "deviceName": world.resource}]},
                                "memory": {"guest": "1Gi"}}}})

        async def runs_on_first() -> bool:
            found = (await admin.get(vmis(namespace, "vm"))).get("status") or {}
            return found.get("phase") == "Running" and list((found.get("activePods") or {}).values()) == [first]

        await eventually(runs_on_first, timeout=60, what="the VM running on the first node")
        await world.order("big", 4)

        async def bound(name: str) -> str | None:
            found = (await world.device(name)).get("status") or {}
            node = found.get("nodeName")
            return str(node) if found.get("phase") == "Bound" and node else None

        assert await eventually(lambda: bound("big"), timeout=60, what="the order of four Bound") == second
        now = {name: await bound(name) for name in holds}
        moved = {name for name in holds if now[name] != holds[name]}
        assert moved == {f"hold-c1-{j}" for j in range(3)}, now
        assert sorted(now[name] or "" for name in moved) == sorted(world.node_name(s) for s in ("c0", "c2", "c3"))
        assert now["hold-c0-0"] == first, "the VM's hold never moves (R-BIND-7)"
        assert await runs_on_first(), "and its VM runs on"
        for name in sorted(moved):
            events = await admin.list_objects(resource_path("", "v1", "events", namespace=namespace),
                                              params={"fieldSelector": f"involvedObject.name={name},reason=Moved"})
            assert any(f"compaction: room made on node {second} for GPUDevice {namespace}/big" in e["message"]
                       for e in events["items"]), name
        attachment = ((await admin.get(device_path(namespace, "hold-c0-0"))).get("status") or {}).get("attachment")
        assert attachment is not None
        assert attachment["vmi"] == "vm"
        standin.cancel()
