"""A VM started on a DRA-held GPU, with the real components on the full plane (SPEC §1.5 "Start", R-BIND-7).

The webhooks served and registered with the API server, a binder over the
same cache on its pass driver, the KubeVirt stand-in, the real kube-scheduler
and resourceclaim controller, kwok nodes whose vfio GPUs the simulated NVIDIA
driver publishes. A tenant orders a GPUDevice of a ``source.dra`` class; the
binder holds it as a ResourceClaim. Then:

- a VMI naming the device is stored with a ``resourceClaims`` entry for the
  hold and a ``gpus`` entry naming the entry and its request, no
  ``deviceName``;
- its launcher pod, as the stand-in renders it, carries no node pin: the
  scheduler places it by the claim's allocation (an emptier node with a free
  vfio GPU of its own is passed over) and kwok runs it; the claim is reserved
  for the GPUDevice and the pod;
- the VM stopped, the pod goes and the resourceclaim controller removes only
  the pod: the claim never left its allocation and is reserved for the
  GPUDevice alone;
- R-BIND-7: with ``onCordon: Move`` the running VM's node cordoned, the set
  stays (``StaysWhileVMRuns``) and its claim where the VM runs; once the VM
  stopped the set moves and the claim is allocated on the other node.

Every claim event from the hold's allocation on is recorded (``ClaimHistory``),
so a deallocation the binder repaired at once is still seen.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs

from cozygpu.api import claims as claims_api
from cozygpu.binder.status import BOUND_CONDITION, REASON_MOVED, REASON_STAYS_RUNNING
from cozygpu.devcluster import dra_driver, nodes
from cozygpu.devcluster.kubevirt import KubeVirtStandIn
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, Obj, resource_path
from tests.admission.harness import VMIS, Served, admission, vmi_body, with_binder
from tests.binder.support import VMI_CRD, device_path
from tests.binder.test_dra_holds_full_plane_api import DraWorld, claims_path
from tests.devcluster.test_dra_plane import results
from tests.support.crds import install_fixture_crd
from tests.support.planes import Fleet
from tests.support.waiting import eventually

HELD = "held"
VM = "vm"
#: The hold as the VMI's ``resourceClaims`` entry and its one GPU as a ``gpus`` entry (SPEC §1.5).
CLAIM_ENTRY = {"name": HELD, "resourceClaimName": HELD}
GPU_ENTRY = {"name": "cozygpu-gpu0", "claimName": HELD, "requestName": claims_api.request_name(0)}


def pods_path(namespace: str, name: str | None = None) -> str:
    return resource_path("", "v1", "pods", namespace=namespace, name=name)


def pod_consumer(pod: Obj) -> dict[str, str]:
    """A pod as a claim's ``reservedFor`` entry (what kube-scheduler writes)."""
    return {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}


@attrs.define
class ClaimHistory:
    """Every status a claim showed after a resourceVersion, as ``(allocation results, reservedFor)``, watched."""

    admin: Client
    path: str
    name: str
    seen: list[tuple[list[tuple[str, str, str]], list[dict[str, Any]]]] = attrs.field(factory=list)

    async def follow(self, since: str) -> None:
        params: dict[str, str | int | bool] = {"fieldSelector": f"metadata.name={self.name}", "resourceVersion": since}
        while True:
            async for event in self.admin.watch(self.path, params=params, read_timeout=300):
                obj = event["object"]
                if event["type"] in ("ADDED", "MODIFIED"):
                    self.seen.append((results(obj), list((obj.get("status") or {}).get("reservedFor") or ())))
                params["resourceVersion"] = obj["metadata"]["resourceVersion"]

    def allocations(self) -> list[list[tuple[str, str, str]]]:
        return [allocated for allocated, _reserved in self.seen]


@attrs.define
class Platform:
    """One test's world: the DRA class and nodes, the webhooks and binder serving, the stand-in running."""

    world: DraWorld
    served: Served
    standin: asyncio.Task[None]

    @property
    def admin(self) -> Client:
        return self.world.admin

    @property
    def namespace(self) -> str:
        return self.world.namespace

    def alive(self) -> None:
        if self.standin.done():
            raise AssertionError("the KubeVirt stand-in stopped") from self.standin.exception()

    async def held(self) -> tuple[str, Obj, ClaimHistory, asyncio.Task[None]]:
        """Order ``held``; once Bound and its claim allocated on its node: the node, the claim, and the claim's
        history from then on (followed by the task returned, which the caller cancels)."""
        await self.world.order(HELD)
        node = await self.world.bound_node(HELD)
        claim = await self.world.held(HELD, node)
        history = ClaimHistory(self.admin, claims_path(self.namespace), HELD)
        follower = asyncio.create_task(history.follow(claim["metadata"]["resourceVersion"]))
        return node, claim, history, follower

    async def start(self) -> Obj:
        """The VMI naming ``held`` by reference, as the API server stored it once admitted."""
        await self.admin.create(VMIS.format(self.namespace), vmi_body(VM, [{"device": HELD}]))
        stored: Obj = await self.admin.get(f"{VMIS.format(self.namespace)}/{VM}")
        return stored

    async def launcher(self, vmi: Obj) -> Obj:
        """The VMI's launcher pod once Running, and the VMI listing it as active."""
        uid = vmi["metadata"]["uid"]

        async def running() -> Obj | None:
            self.alive()
            listed = await self.admin.list_objects(pods_path(self.namespace),
                                                   params={"labelSelector": f"kubevirt.io/created-by={uid}"})
            pod = next((p for p in listed["items"] if (p.get("status") or {}).get("phase") == "Running"), None)
            if pod is None:
                return None
            active = ((await self.admin.get(f"{VMIS.format(self.namespace)}/{VM}")).get("status") or {}).get(
                "activePods") or {}
            return pod if pod["metadata"]["uid"] in active else None

        pod: Obj = await eventually(running, timeout=60, what="the VM's launcher pod never ran")
        return pod

    async def stop(self, vmi: Obj) -> None:
        """Delete the VMI; return once it and its launcher pod are gone."""
        await self.admin.delete(f"{VMIS.format(self.namespace)}/{VM}")
        uid = vmi["metadata"]["uid"]

        async def stopped() -> bool:
            self.alive()
            if await self.admin.get_or_none(f"{VMIS.format(self.namespace)}/{VM}") is not None:
                return False
            listed = await self.admin.list_objects(pods_path(self.namespace),
                                                   params={"labelSelector": f"kubevirt.io/created-by={uid}"})
            return not listed["items"]

        await eventually(stopped, timeout=60, what="the VMI and its launcher pod never went")

    async def reserved_for_the_device_only(self) -> Obj:
        """The hold claim once the resourceclaim controller has left only the GPUDevice in ``reservedFor``."""
        device = await self.admin.get(device_path(self.namespace, HELD))
        consumer = claims_api.consumer(HELD, device["metadata"]["uid"])

        async def check() -> Obj | None:
            found = await self.admin.get(claims_path(self.namespace, HELD))
            return found if (found.get("status") or {}).get("reservedFor") == [consumer] else None

        claim: Obj = await eventually(check, timeout=60, what="the claim's reservedFor never came back to the device")
        return claim


@contextlib.asynccontextmanager
async def platform(plane: ControlPlane, admin: Client, fleet: Fleet, directory: Path, *,
                   on_cordon: str | None = None) -> AsyncIterator[Platform]:
    for crd in ("virtualmachines.kubevirt.io", VMI_CRD):  # the stand-in watches both
        await install_fixture_crd(admin, crd)
    world = DraWorld(admin, fleet)
    await world.make(on_cordon=on_cordon)
    standin = asyncio.create_task(KubeVirtStandIn(admin, namespace=world.namespace).run())
    try:
        async with admission(plane, admin, world.namespace, directory) as served, with_binder(admin, served.cache):
            yield Platform(world, served, standin)
    finally:
        standin.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await standin


async def dra_nodes(world: DraWorld, *, served: int, decoy: bool = False) -> list[str]:
    """``served`` kwok nodes with one vfio GPU each, labelled for the world's class only; with ``decoy`` one more,
    far emptier (the scheduler's choice for a pod free to go anywhere), with a free vfio GPU of its own but not
    the class's label (its name last)."""
    made = [nodes.SimNode(f"dra-{world.tag}-{i}", labels={"cozygpu-test": world.tag}) for i in range(served)]
    if decoy:
        made.append(nodes.SimNode(f"decoy-{world.tag}", cpu="512", memory="4Ti"))
    names = await world.fleet(*made)
    await dra_driver.publish(world.admin, dict.fromkeys(names, 1))
    return names


async def test_a_vm_of_a_dra_held_gpu_runs_on_its_claim_and_stopped_leaves_the_claim_held_for_the_device(
        full_plane: ControlPlane, full_admin: Client, fleet: Fleet, tmp_path: Path) -> None:
    async with platform(full_plane, full_admin, fleet, tmp_path) as started:
        admin, namespace = started.admin, started.namespace
        target, _decoy = await dra_nodes(started.world, served=1, decoy=True)
        node, claim, history, follower = await started.held()
        assert node == target
        allocated = results(claim)
        assert allocated == [(dra_driver.DRIVER, target, dra_driver.device_name(0))]
        consumer = claims_api.consumer(HELD, claim["metadata"]["ownerReferences"][0]["uid"])
        try:
            vmi = await started.start()
            # The VMI as stored: the hold as a resourceClaims entry, the GPU naming it and its request.
            assert vmi["spec"]["resourceClaims"] == [CLAIM_ENTRY]
            assert vmi["spec"]["domain"]["devices"]["gpus"] == [GPU_ENTRY]
            assert "resources" not in vmi["spec"]["domain"]
            device = await admin.get(device_path(namespace, HELD))
            assert device["status"]["attachment"]["vmi"] == VM

            pod = await started.launcher(vmi)
            # Rendered by the stand-in as KubeVirt 1.9 does: the claim on the pod and on compute, no GPU resource.
            assert pod["spec"]["resourceClaims"] == [CLAIM_ENTRY]
            [compute] = pod["spec"]["containers"]
            assert compute["resources"]["claims"] == [{"name": HELD, "request": claims_api.request_name(0)}]
            assert not any(name.startswith(("nvidia.com/", "deviceclass.resource.kubernetes.io/"))
                           for name in compute["resources"].get("requests") or {})
            # No pin from the pod webhook: kube-scheduler placed it by the claim's allocation, not on the emptier
            # decoy whose own vfio GPU is free; kwok runs it there.
            assert "affinity" not in pod["spec"], pod["spec"].get("affinity")
            assert not pod["spec"].get("nodeSelector"), pod["spec"]["nodeSelector"]
            assert pod["spec"]["nodeName"] == target
            running = await admin.get(claims_path(namespace, HELD))
            assert running["status"]["reservedFor"] == [consumer, pod_consumer(pod)]
            assert results(running) == allocated

            await started.stop(vmi)
            kept = await started.reserved_for_the_device_only()
            assert results(kept) == allocated
            assert kept["status"]["allocation"] == claim["status"]["allocation"], "the same allocation, never redone"
            status = (await admin.get(device_path(namespace, HELD)))["status"]
            assert (status["phase"], status["nodeName"]) == ("Bound", target)
            # The claim never left its allocation, and the pod was among its consumers while it ran.
            assert history.allocations(), "the watch saw the claim's changes"
            assert all(a == allocated for a in history.allocations()), history.seen
            assert [consumer, pod_consumer(pod)] in [reserved for _a, reserved in history.seen], history.seen
        finally:
            follower.cancel()


async def test_a_running_vms_claim_stays_on_its_cordoned_node_and_moves_with_its_set_once_the_vm_stopped(
        full_plane: ControlPlane, full_admin: Client, fleet: Fleet, tmp_path: Path) -> None:
    async with platform(full_plane, full_admin, fleet, tmp_path, on_cordon="Move") as started:
        admin, namespace = started.admin, started.namespace
        first, second = await dra_nodes(started.world, served=2)
        placed, claim, history, follower = await started.held()  # the node the test cordons
        other = second if placed == first else first
        nodes_path = resource_path("", "v1", "nodes", name=placed)
        try:
            vmi = await started.start()
            assert vmi["spec"]["domain"]["devices"]["gpus"] == [GPU_ENTRY]
            pod = await started.launcher(vmi)
            assert pod["spec"]["nodeName"] == placed

            await admin.merge_patch(nodes_path, {"spec": {"unschedulable": True}})
            condition = await eventually(lambda: _bound_condition(admin, namespace, REASON_STAYS_RUNNING), timeout=60,
                                         what="the binder never kept the set on its cordoned node for its VM")
            assert f"stays on node {placed} (its VM runs there)" in condition["message"], condition
            assert (await admin.get(device_path(namespace, HELD)))["status"]["nodeName"] == placed
            while_running = await admin.get(claims_path(namespace, HELD))
            assert results(while_running) == results(claim), "the claim stays where the VM runs"
            assert pod_consumer(pod) in while_running["status"]["reservedFor"]
            assert (await admin.get(pods_path(namespace, pod["metadata"]["name"])))["status"]["phase"] == "Running"
            assert all(a == results(claim) for a in history.allocations()), history.seen

            await started.stop(vmi)
            moved = await eventually(lambda: _bound_condition(admin, namespace, REASON_MOVED), timeout=60,
                                     what="the set never moved off the cordoned node once its VM stopped")
            assert f"moved from node {placed} to node {other}" in moved["message"], moved
            again = await started.world.held(HELD, other)
            assert [pool for _driver, pool, _device in results(again)] == [other]
        finally:
            follower.cancel()
            await admin.merge_patch(nodes_path, {"spec": {"unschedulable": False}})


async def _bound_condition(admin: Client, namespace: str, reason: str) -> dict[str, Any] | None:
    status = (await admin.get(device_path(namespace, HELD))).get("status") or {}
    conditions = status.get("conditions") or ()
    return next((dict(c) for c in conditions if c["type"] == BOUND_CONDITION and c["reason"] == reason), None)
