"""R-MOD-7's launcher window on the full plane: a neighbour's VM starts and stops, the other hold stays.

A node serves 2 units, both held: tenant X's ``d2`` and tenant Y's ``d1``,
both VMs off. X's VM starts on ``d2`` ten times and stops again. The real
kube-scheduler binds each launcher pod to the node before the KubeVirt
stand-in lists it in the VMI's ``activePods``, so for a moment the pod's GPU
is uncovered; Y's hold must never leave Bound for it (before the window it
went Lost and came back some 30 ms later, every start). A pod that claims
the VMI but is never listed (virt-controller down) moves a hold, but only
once the grace is over.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from cozygpu import keys
from cozygpu.devcluster import nodes
from cozygpu.devcluster.kubevirt import KubeVirtStandIn
from cozygpu.kube import Client, Obj, resource_path
from tests.binder.support import VMI_CRD, VMIS, device_path
from tests.binder.world import World, driven_binder
from tests.support.crds import install_fixture_crd
from tests.support.planes import Fleet
from tests.support.waiting import eventually

NAMESPACES = "/api/v1/namespaces"
STARTS = 10


def vmis(namespace: str, name: str | None = None) -> str:
    return resource_path(*VMIS, namespace=namespace, name=name)


def pods(namespace: str) -> str:
    return resource_path("", "v1", "pods", namespace=namespace)


def when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


class Tenants:
    """Two tenants' holds on one full kwok node: X's ``d2`` (its VM's) and Y's ``d1`` (idle)."""

    def __init__(self, admin: Client, world: World, y: str) -> None:
        self.admin, self.world, self.x, self.y = admin, world, world.namespace, y

    @classmethod
    async def make(cls, admin: Client, fleet: Fleet) -> Tenants:
        for crd in ("virtualmachines.kubevirt.io", VMI_CRD):  # the stand-in reads VMs too
            await install_fixture_crd(admin, crd)
        x, y = f"t-x-{uuid.uuid4().hex[:8]}", f"t-y-{uuid.uuid4().hex[:8]}"
        for namespace in (x, y):
            await admin.create(NAMESPACES, {"metadata": {"name": namespace}})
        world = await World.make(admin, x)
        await fleet(nodes.SimNode(world.node_name("gpu"), gpus={world.resource: 2}))
        await world.node("gpu", 2, create_node=False)
        await world.order("d2", 1, status=world.held("gpu"))
        await admin.create(device_path(y), {"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND,
                                            "metadata": {"name": "d1"},
                                            "spec": {"className": world.gpu_class, "count": 1}})
        await admin.merge_patch(device_path(y, "d1", status=True), {"status": world.held("gpu")})
        return cls(admin, world, y)

    @property
    def node(self) -> str:
        return self.world.node_name("gpu")

    async def attach(self, vmi: str, uid: str = "") -> None:
        """What the VMI webhook writes when a start names ``d2``."""
        attachment = {"vmi": vmi, "uid": uid} if uid else {"vmi": vmi}
        await self.admin.merge_patch(device_path(self.x, "d2", status=True), {"status": {"attachment": attachment}})

    def vmi(self, name: str) -> Obj:
        return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": name},
                "spec": {"domain": {"devices": {"gpus": [{"name": "gpu0", "deviceName": self.world.resource}]},
                                    "memory": {"guest": "1Gi"}}}}

    async def phase(self, namespace: str, name: str) -> str | None:
        status = (await self.admin.get(device_path(namespace, name))).get("status") or {}
        found = status.get("phase")
        return str(found) if found is not None else None


async def phases_of(admin: Client, namespace: str, name: str, since: str, seen: list[str]) -> None:
    """Append every phase the device shows after resourceVersion ``since`` (until cancelled)."""
    params = {"fieldSelector": f"metadata.name={name}", "resourceVersion": since}
    while True:
        async for event in admin.watch(device_path(namespace), params=params, read_timeout=300):
            obj = event["object"]
            if event["type"] in ("ADDED", "MODIFIED"):
                seen.append(str((obj.get("status") or {}).get("phase")))
                params["resourceVersion"] = obj["metadata"]["resourceVersion"]


async def start_and_stop(admin: Client, tenants: Tenants, *, grace: timedelta, starts: int,
                         runs_past_grace: bool) -> list[str]:
    """Start and stop X's VM ``starts`` times; the phases Y's hold showed meanwhile."""
    d1 = await admin.get(device_path(tenants.y, "d1"))
    seen: list[str] = []
    async with driven_binder(admin, grace), asyncio.TaskGroup() as tasks:
        standin = tasks.create_task(KubeVirtStandIn(admin, namespace=tenants.x).run())
        watcher = tasks.create_task(phases_of(admin, tenants.y, "d1", d1["metadata"]["resourceVersion"], seen))
        for start in range(starts):
            await tenants.attach("vm-x")
            made = await admin.create(vmis(tenants.x), tenants.vmi("vm-x"))

            async def running() -> bool:
                status = (await admin.get(vmis(tenants.x, "vm-x"))).get("status") or {}
                return status.get("phase") == "Running" and bool(status.get("activePods"))

            await eventually(running, timeout=60, what=f"start {start}: the VM running with its launcher listed")
            uid, node = next(iter((await admin.get(vmis(tenants.x, "vm-x")))["status"]["activePods"].items()))
            assert node == tenants.node, "the launcher runs where its hold is"
            if runs_past_grace:
                # The stop must not lean on the window: the VM runs until its launcher's window is over.
                launcher = next(p for p in (await admin.list_objects(pods(tenants.x)))["items"]
                                if p["metadata"]["uid"] == uid)
                over = when(launcher["metadata"]["creationTimestamp"]) + grace + timedelta(seconds=1)
                await asyncio.sleep(max((over - datetime.now(UTC)).total_seconds(), 0.0))
            await admin.delete(vmis(tenants.x, "vm-x"))

            last: dict[str, Any] = {}

            async def stopped(uid: str = made["metadata"]["uid"], last: dict[str, Any] = last) -> bool:
                listed = await admin.list_objects(pods(tenants.x), params={
                    "labelSelector": f"kubevirt.io/created-by={uid}"})
                status = (await admin.get(device_path(tenants.x, "d2"))).get("status") or {}
                vmi = await admin.get_or_none(vmis(tenants.x, "vm-x"))
                last.update(launchers=[(p["metadata"]["name"], (p.get("status") or {}).get("phase"),
                                        p["metadata"].get("deletionTimestamp")) for p in listed["items"]],
                            attachment=status.get("attachment"),
                            vmi=None if vmi is None else ((vmi.get("status") or {}).get("phase"),
                                                          vmi["metadata"].get("finalizers"),
                                                          vmi["metadata"].get("deletionTimestamp")))
                return not listed["items"] and "attachment" not in status

            try:
                await eventually(stopped, timeout=60, what=f"stop {start}: the launcher gone and d2 detached")
            except AssertionError as error:
                raise AssertionError(f"{error}; last seen: {last}") from None
            assert await tenants.phase(tenants.x, "d2") == "Bound"
        watcher.cancel()
        standin.cancel()
    return seen


async def assert_untouched(admin: Client, tenants: Tenants, seen: list[str]) -> None:
    assert await tenants.phase(tenants.y, "d1") == "Bound"
    assert set(seen) <= {"Bound"}, f"tenant Y's idle hold left Bound while X's VM started and stopped: {seen}"
    events = await admin.list_objects(resource_path("", "v1", "events", namespace=tenants.y),
                                      params={"fieldSelector": "involvedObject.name=d1"})
    reasons = sorted({e.get("reason") for e in events["items"]})
    assert "Lost" not in reasons, reasons
    assert "Rebound" not in reasons, reasons


async def test_a_neighbours_vm_started_and_stopped_ten_times_never_moves_the_other_hold_on_a_full_node(
        full_admin: Client, fleet: Fleet) -> None:
    tenants = await Tenants.make(full_admin, fleet)
    seen = await start_and_stop(full_admin, tenants, grace=timedelta(seconds=30), starts=STARTS,
                                runs_past_grace=False)
    await assert_untouched(full_admin, tenants, seen)


async def test_a_neighbours_vm_stopped_after_its_window_is_over_still_moves_no_other_hold(
        full_admin: Client, fleet: Fleet) -> None:
    # While the VMI is deleted its launcher stays listed in activePods until it is gone (the VMI's finalizer).
    tenants = await Tenants.make(full_admin, fleet)
    seen = await start_and_stop(full_admin, tenants, grace=timedelta(seconds=3), starts=2, runs_past_grace=True)
    await assert_untouched(full_admin, tenants, seen)


async def test_a_pod_that_claims_a_vmi_but_is_never_listed_moves_a_hold_only_after_the_grace(
        full_admin: Client, fleet: Fleet) -> None:
    admin = full_admin
    tenants = await Tenants.make(admin, fleet)
    grace = timedelta(seconds=6)
    async with driven_binder(admin, grace):
        # virt-controller is down: nothing will list the pod in the VMI's activePods.
        vmi = await admin.create(vmis(tenants.x), tenants.vmi("vm-x"))
        await tenants.attach("vm-x", vmi["metadata"]["uid"])
        pod: dict[str, Any] = {
            "metadata": {"name": "claims-vm-x", "labels": {keys.KUBEVIRT_LAUNCHER_LABEL: keys.KUBEVIRT_LAUNCHER_VALUE},
                         "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                                              "name": "vm-x", "uid": vmi["metadata"]["uid"], "controller": True}]},
            "spec": {"containers": [{"name": "compute", "image": "compute",
                                     "resources": {"limits": {tenants.world.resource: "1"}}}]},
        }
        made = await admin.create(pods(tenants.x), pod)

        async def scheduled() -> bool:
            return bool(((await admin.get(f"{pods(tenants.x)}/claims-vm-x")).get("spec") or {}).get("nodeName"))

        await eventually(scheduled, timeout=60, what="the claiming pod bound by kube-scheduler")

        async def a_hold_left() -> tuple[str, Obj] | None:
            for namespace, name in ((tenants.y, "d1"), (tenants.x, "d2")):
                device = await admin.get(device_path(namespace, name))
                if ((device.get("status") or {}).get("phase")) != "Bound" or \
                        device["status"].get("nodeName") != tenants.node:
                    return name, device
            return None

        await eventually(a_hold_left, timeout=60, what="a hold leaving the node the unlisted pod uses")
        left = await a_hold_left()
        assert left is not None
        name, device = left
        condition = next(c for c in device["status"]["conditions"] if c["type"] == "Bound")
        assert "serves 2" in condition["message"], condition
        waited = when(condition["lastTransitionTime"]) - when(made["metadata"]["creationTimestamp"])
        # Both stamps are whole seconds: the hold left no earlier than the grace, less one second of rounding.
        assert waited >= grace - timedelta(seconds=1), f"{name} left {waited} after the pod, inside the grace"
