"""A GPUDevice of a DRA class holds its GPU as a ResourceClaim the binder allocates (SPEC §1.5), on the full plane.

The real kube-scheduler and resourceclaim controller, kwok nodes, the simulated
NVIDIA driver's slices: the binder places an order of a ``source.dra`` class
on a node its DeviceClass's devices are on, creates the hold claim (named
after and owned by the device) and allocates it itself, reserved for the
GPUDevice. Then:

- a foreign pod with a claim of its own of that DeviceClass, on that node,
  cannot have the held GPU (kube-scheduler: "cannot allocate all claims"),
  though no VM runs and no pod uses the hold;
- nothing deallocates the hold while it stands;
- the catalog counts the class's free GPUs from the slices and claims, and
  ``why`` explains an order of it that cannot be placed;
- the order released (deleted), its claim goes, and a foreign pod runs on
  the GPU it freed;
- a set moved off a cordoned node (``onCordon: Move``), or off a GPU its
  driver tainted or an administrator's DeviceTaintRule selects (1.37), is
  allocated again on its new node (the driver's
  ``status.devices`` report of the old devices cleared with the allocation).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cozygpu import keys
from cozygpu.api import claims as claims_api
from cozygpu.commands import common, why
from cozygpu.commands.catalog import catalog_row
from cozygpu.devcluster import dra_driver, nodes
from cozygpu.kube import Client, errors, resource_path
from cozygpu.model.catalog import catalog
from cozygpu.model.dra import DeviceRef
from tests.binder.support import class_path, device_path
from tests.binder.world import driven_binder
from tests.devcluster.test_dra_plane import claim_pod, claim_spec, not_scheduled, results, running
from tests.support.planes import Fleet
from tests.support.waiting import eventually

NAMESPACES = resource_path("", "v1", "namespaces")


def claims_path(namespace: str, name: str | None = None) -> str:
    return resource_path(claims_api.API_GROUP, claims_api.API_VERSION, "resourceclaims", namespace=namespace,
                         name=name)


class DraWorld:
    """A namespace, kwok nodes with vfio GPUs labelled for this test only, and a DRA class that sells them."""

    def __init__(self, admin: Client, fleet: Fleet) -> None:
        self.admin, self.fleet = admin, fleet
        self.tag = uuid.uuid4().hex[:6]
        self.namespace = f"t-{self.tag}"
        self.gpu_class = f"dra-{self.tag}"

    async def make(self, *, on_cordon: str | None = None, match_attribute: str = "") -> None:
        """With ``match_attribute``, the class sells a DeviceClass of its own (a copy of the vfio one): the
        classes selling one DeviceClass read one offer, and other tests' classes sell the vfio one."""
        await self.admin.create(NAMESPACES, {"metadata": {"name": self.namespace}})
        device_class = dra_driver.DEVICE_CLASS
        if match_attribute:
            device_class = f"{self.tag}.{dra_driver.DEVICE_CLASS}"
            await dra_driver.ensure_device_class(self.admin)
            copy = dra_driver.device_class()
            copy["metadata"]["name"] = device_class
            await self.admin.create(dra_driver.DEVICE_CLASSES, copy)
        spec: dict[str, Any] = {
            "vendor": "NVIDIA", "model": "H100", "mode": "Passthrough", "memory": "80Gi",
            "resourceName": f"deviceclass.resource.kubernetes.io/{device_class}",
            "source": {"dra": {"deviceClassName": device_class,
                               **({"matchAttribute": match_attribute} if match_attribute else {})}},
            "nodeSelector": {"matchLabels": {"cozygpu-test": self.tag}}}
        if on_cordon:
            spec["onCordon"] = on_cordon
        await self.admin.create(class_path(), {"apiVersion": keys.API_VERSION, "kind": keys.GPUCLASS_KIND,
                                               "metadata": {"name": self.gpu_class}, "spec": spec})

    async def nodes(self, *gpus: int) -> list[str]:
        names = await self.fleet(*(nodes.SimNode(f"dra-{self.tag}-{i}", labels={"cozygpu-test": self.tag})
                                   for i in range(len(gpus))))
        await dra_driver.publish(self.admin, dict(zip(names, gpus, strict=True)))
        return names

    async def order(self, name: str, count: int = 1) -> dict[str, Any]:
        made: dict[str, Any] = await self.admin.create(device_path(self.namespace), {
            "apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND, "metadata": {"name": name},
            "spec": {"className": self.gpu_class, "count": count}})
        return made

    async def held(self, name: str, node: str, count: int = 1) -> dict[str, Any]:
        """The device's claim once it holds ``count`` devices of ``node``, reserved for the device alone."""

        async def check() -> dict[str, Any] | None:
            try:
                found = await self.admin.get(claims_path(self.namespace, name))
            except errors.NotFound:
                return None
            status = found.get("status") or {}
            held = results(found)
            if len(held) == count and {pool for _driver, pool, _device in held} == {node} \
                    and [r.get("resource") for r in status.get("reservedFor") or ()] == [keys.GPUDEVICE_PLURAL]:
                return found
            return None

        claim: dict[str, Any] = await eventually(check, timeout=60, what=f"claim {name} never held {count} on {node}")
        return claim

    async def catalog_row(self, *, count: int | None = None) -> dict[str, Any]:
        """The catalog's row of the class, as ``cozygpu catalog [--count N]`` prints it for this namespace."""
        snapshot = (await common.read_cluster(self.admin)).snapshot
        [entry] = [e for e in catalog(snapshot, self.namespace) if e.class_name == self.gpu_class]
        return catalog_row(entry, snapshot, count)

    async def why(self, name: str) -> dict[str, Any]:
        """``cozygpu why`` of a device, once the binder has decided it."""

        async def decided() -> dict[str, Any] | None:
            cluster = await common.read_cluster(self.admin)
            report = await why.explain_device(self.admin, cluster, self.namespace, name)
            return report if report is not None and report.get("bound") else None

        report: dict[str, Any] = await eventually(decided, timeout=60, what=f"{name} never decided")
        return report

    async def bound_node(self, name: str) -> str:
        async def check() -> str | None:
            status = (await self.admin.get(device_path(self.namespace, name))).get("status") or {}
            node: str | None = status.get("nodeName") if status.get("phase") == "Bound" else None
            return node

        node: str = await eventually(check, timeout=60, what=f"{name} never Bound")
        return node

    def foreign_pod(self, name: str, node: str) -> dict[str, Any]:
        """A pod with a claim of its own of the vfio DeviceClass, on ``node`` (its hostname label)."""
        pod = claim_pod(name, template=f"{name}-gpu")
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        return pod

    async def foreign_template(self, name: str) -> None:
        await self.admin.create(resource_path(claims_api.API_GROUP, claims_api.API_VERSION, "resourceclaimtemplates",
                                              namespace=self.namespace),
                                {"metadata": {"name": f"{name}-gpu"}, "spec": {"spec": claim_spec()}})


@pytest.fixture
async def dra_world(full_admin: Client, fleet: Fleet) -> DraWorld:
    world = DraWorld(full_admin, fleet)
    await world.make()
    return world


async def test_a_held_dra_gpu_is_kept_from_a_foreign_pod_until_its_order_is_released(dra_world: DraWorld) -> None:
    world, admin = dra_world, dra_world.admin
    [node] = await world.nodes(1)
    pods = resource_path("", "v1", "pods", namespace=world.namespace)
    row = await world.catalog_row()
    assert (row["freeInCluster"], row["bestNode"], row["orderable"]) == (1, node, True), row
    async with driven_binder(admin, timedelta(seconds=30)):
        device = await world.order("held")
        assert await world.bound_node("held") == node
        claim = await world.held("held", node)
        owner = claim["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            keys.GPUDEVICE_KIND, "held", device["metadata"]["uid"], True)
        assert results(claim) == [(dra_driver.DRIVER, node, dra_driver.device_name(0))]
        assert claim["spec"]["devices"]["requests"][0]["name"] == claims_api.request_name(0)

        await world.foreign_template("foreign")
        await admin.create(pods, world.foreign_pod("foreign", node))
        condition = await not_scheduled(admin, f"{pods}/foreign", what="the foreign pod was never refused")
        assert "cannot allocate all claims" in condition["message"], condition
        again = await admin.get(claims_path(world.namespace, "held"))
        assert results(again) == results(claim), "the hold stays allocated while no pod uses it"
        row = await world.catalog_row()
        assert (row["freeInCluster"], row["orderable"]) == (0, False), row
        await world.order("more")
        report = await world.why("more")
        assert (report["phase"], report["reason"]) == ("Pending", "NoNodeWithRoom"), report
        await admin.delete(device_path(world.namespace, "more"))

        await admin.delete(f"{pods}/foreign")
        await admin.delete(device_path(world.namespace, "held"))

        async def claim_gone() -> bool:
            try:
                await admin.get(claims_path(world.namespace, "held"))
            except errors.NotFound:
                return True
            return False

        await eventually(claim_gone, timeout=60, what="the released order's claim never went")
        await world.foreign_template("after")
        await admin.create(pods, world.foreign_pod("after", node))
        await running(admin, f"{pods}/after")


async def test_a_set_moved_off_a_cordoned_node_is_allocated_again_on_its_new_node(full_admin: Client,
                                                                                    fleet: Fleet) -> None:
    world = DraWorld(full_admin, fleet)
    await world.make(on_cordon="Move")
    first, second = await world.nodes(2, 2)
    async with driven_binder(full_admin, timedelta(seconds=30)):
        await world.order("pair", count=2)
        placed = await world.bound_node("pair")
        claim = await world.held("pair", placed, count=2)
        other = second if placed == first else first
        # The driver reports on the devices it prepared (``status.devices``, GA in 1.37): the report must not keep
        # the set from moving, and must not outlive the allocation it was about.
        reported = [{"driver": driver, "pool": pool, "device": device, "data": {"pciBusID": f"0000:{i:02x}:00.0"},
                     "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared", "message": "",
                                     "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
                    for i, (driver, pool, device) in enumerate(results(claim))]
        status_path = f"{claims_path(world.namespace, 'pair')}/status"
        await full_admin.merge_patch(status_path, {"status": {"devices": reported}},
                                     resource_version=claim["metadata"]["resourceVersion"])
        await full_admin.merge_patch(resource_path("", "v1", "nodes", name=placed), {"spec": {"unschedulable": True}})

        async def moved() -> str | None:
            node = await world.bound_node("pair")
            return node if node == other else None

        await eventually(moved, timeout=60, what="the set never moved off the cordoned node")
        claim = await world.held("pair", other, count=2)
        assert sorted(device for _driver, _pool, device in results(claim)) == [
            dra_driver.device_name(0), dra_driver.device_name(1)]
        assert not claim["status"].get("devices"), "the old node's device status went with its allocation"


async def test_a_set_whose_gpu_the_driver_tainted_moves_and_is_allocated_again(full_admin: Client,
                                                                                fleet: Fleet) -> None:
    """DeviceTaints (beta in 1.36): the driver taints the held GPU; the node serves one GPU fewer than is held,
    capacity is lost (R-BIND-5) and the stopped set moves to the other node, its claim allocated there."""
    world = DraWorld(full_admin, fleet)
    await world.make()
    first, second = await world.nodes(1, 1)
    async with driven_binder(full_admin, timedelta(seconds=30)):
        await world.order("one")
        placed = await world.bound_node("one")
        await world.held("one", placed)
        other = second if placed == first else first
        path = f"{dra_driver.RESOURCE_SLICES}/{dra_driver.slice_name(placed)}"
        tainted = await full_admin.get(path)
        tainted["spec"]["devices"][0]["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79",
                                                    "effect": "NoSchedule"}]
        stored = await full_admin.replace(path, tainted)
        assert stored["spec"]["devices"][0].get("taints"), "the API server kept the device's taint (DeviceTaints)"

        async def moved() -> str | None:
            node = await world.bound_node("one")
            return node if node == other else None

        await eventually(moved, timeout=60, what="the set never moved off the tainted GPU")
        await world.held("one", other)


async def test_a_set_whose_gpu_an_administrators_taint_rule_selects_moves_and_is_allocated_again(
        full_admin: Client, fleet: Fleet) -> None:
    """DeviceTaintRule (``resource.k8s.io/v1``, GA in 1.37): an administrator takes the held GPU out for
    maintenance by driver, pool and device; the stopped set moves off it as off a driver's taint, and once the
    rule is gone the GPU serves again."""
    world = DraWorld(full_admin, fleet)
    await world.make()
    first, second = await world.nodes(1, 1)
    rules = resource_path(claims_api.API_GROUP, claims_api.API_VERSION, "devicetaintrules")
    async with driven_binder(full_admin, timedelta(seconds=30)):
        await world.order("one")
        placed = await world.bound_node("one")
        claim = await world.held("one", placed)
        [(driver, pool, device)] = results(claim)
        other = second if placed == first else first
        rule = f"maintenance-{world.tag}"
        await full_admin.create(rules, {"metadata": {"name": rule}, "spec": {
            "deviceSelector": {"driver": driver, "pool": pool, "device": device},
            "taint": {"key": "example.com/maintenance", "value": "firmware", "effect": "NoSchedule"}}})
        try:
            async def moved() -> str | None:
                node = await world.bound_node("one")
                return node if node == other else None

            await eventually(moved, timeout=60, what="the set never moved off the GPU the rule tainted")
            await world.held("one", other)

            async def says_why() -> str | None:
                status = (await full_admin.get(class_path(world.gpu_class))).get("status") or {}
                [offer] = [c for c in status.get("conditions") or () if c.get("type") == "OfferPublished"] or [{}]
                message: str = offer.get("message") or ""
                return message if f"DeviceTaintRule {rule}" in message else None

            await eventually(says_why, timeout=60, what="the class never named the rule that keeps its GPU out")
        finally:
            await full_admin.delete(f"{rules}/{rule}")


async def test_an_order_no_node_has_room_for_is_held_after_a_stopped_dra_hold_moved_and_its_claim_followed(
        full_admin: Client, fleet: Fleet) -> None:
    """Compaction of a DRA class (R-BIND-11): two nodes of two vfio GPUs, one stopped single-GPU hold on each; an
    order of two is Bound after one hold moves, the moved hold's claim is allocated again on its new node, and the
    order's claim holds both GPUs of the node it emptied."""
    world = DraWorld(full_admin, fleet)
    await world.make()
    first, second = sorted(await world.nodes(2, 2))
    async with driven_binder(full_admin, timedelta(seconds=30)):
        # The fullest node with room takes "a" and "filler" (first, by name), "b" the other; "filler" released,
        # each node has one stopped hold and one free GPU.
        for name, node in (("a", first), ("filler", first), ("b", second)):
            await world.order(name)
            assert await world.bound_node(name) == node
            await world.held(name, node)
        await full_admin.delete(device_path(world.namespace, "filler"))

        async def released() -> bool | None:
            gone = await full_admin.get_or_none(device_path(world.namespace, "filler")) is None
            return True if gone and await full_admin.get_or_none(claims_path(world.namespace, "filler")) is None \
                else None

        await eventually(released, timeout=60, what="the filler and its claim never went")
        await world.order("pair", count=2)
        # Both nodes need one move; the first by name wins: "a" moves to the second node.
        assert await world.bound_node("pair") == first
        assert await world.bound_node("a") == second
        await world.held("a", second)
        claim = await world.held("pair", first, count=2)
        assert sorted(device for _driver, _pool, device in results(claim)) == [
            dra_driver.device_name(0), dra_driver.device_name(1)]
        events = await full_admin.list_objects(resource_path("", "v1", "events", namespace=world.namespace),
                                               params={"fieldSelector": "involvedObject.name=a,reason=Moved"})
        assert any(f"compaction: room made on node {first} for GPUDevice {world.namespace}/pair" in e["message"]
                   for e in events["items"])


async def test_a_set_that_must_share_a_pcie_root_goes_where_one_root_has_room(full_admin: Client,
                                                                              fleet: Fleet) -> None:
    """Topology (``matchAttribute``): the first node has two GPUs free but on two roots (someone else's claims
    hold one of each); the second has two on one root. An order of two is placed on the second, and its claim
    holds two GPUs of one root. An order larger than any root's room is refused naming the attribute (the
    GPUDevice webhook's check), and one the binder cannot keep together stays Pending."""
    pcie = "resource.kubernetes.io/pcieRoot"
    world = DraWorld(full_admin, fleet)
    await world.make(match_attribute=pcie)
    split, whole = await world.nodes(4, 2)
    for index in (0, 2):  # one GPU of each of the first node's roots, in a claim of no GPUDevice's
        name = f"other-{index}"
        body = claims_api.hold_claim(name, "no-uid", device_class=dra_driver.DEVICE_CLASS, count=1)
        body["metadata"]["ownerReferences"] = []
        await full_admin.create(claims_path(world.namespace), body)
        status = claims_api.hold_status(split, [DeviceRef(dra_driver.DRIVER, split, dra_driver.device_name(index))],
                                        device_name=name, device_uid="no-uid", now=datetime.now(UTC))
        await full_admin.merge_patch(f"{claims_path(world.namespace, name)}/status", {"status": status})
    row = await world.catalog_row(count=3)  # the GPUDevice webhook's own check of an order of three
    assert (row["reason"], row["freeInCluster"], row["freeOnBestNode"]) == ("NoNodeWithRoom", 3, 2), row
    assert f"at most 2 units sharing one {pcie} free on one node (node {whole})" in row["message"], row
    async with driven_binder(full_admin, timedelta(seconds=30)):
        await world.order("pair", count=2)
        assert await world.bound_node("pair") == whole
        claim = await world.held("pair", whole, count=2)
        assert sorted(device for _driver, _pool, device in results(claim)) == [
            dra_driver.device_name(0), dra_driver.device_name(1)]
        assert claim["spec"]["devices"]["constraints"] == [{"requests": ["gpu-0", "gpu-1"], "matchAttribute": pcie}]
        await world.order("more", count=2)
        report = await world.why("more")
        assert (report["phase"], report["reason"]) == ("Pending", "NoNodeWithRoom"), report



async def test_a_pair_that_must_share_a_pcie_root_is_placed_after_moving_the_hold_of_one_root(
        full_admin: Client, fleet: Fleet) -> None:
    """Compaction of a ``matchAttribute`` class (R-BIND-11): two nodes of two roots of two GPUs. The first's first
    root is full (a, b), its second has c and one free GPU; the second node has d and e, one on each root, and a
    free GPU beside each. No root has two free: an order of two is Bound after c moves (the one hold whose move
    frees a root: moving a, the first by name, would leave two free GPUs on two roots), and its claim holds both
    GPUs of that root."""
    pcie = "resource.kubernetes.io/pcieRoot"
    world = DraWorld(full_admin, fleet)
    await world.make(match_attribute=pcie)
    first, second = sorted(await world.nodes(4, 4))
    async with driven_binder(full_admin, timedelta(seconds=30)):
        # The fullest node with room, and there the smallest root that fits: a, b, c, f1 fill the first node in
        # order, d, f2, e, f3 the second; the fillers released leave one free GPU on each root but the first.
        placed = {}
        for name, node in (("a", first), ("b", first), ("c", first), ("f1", first),
                           ("d", second), ("f2", second), ("e", second), ("f3", second)):
            await world.order(name)
            assert await world.bound_node(name) == node, name
            claim = await world.held(name, node)
            placed[name] = [device for _driver, _pool, device in results(claim)]
        assert placed["c"] == [dra_driver.device_name(2)], placed
        for filler in ("f1", "f2", "f3"):
            await full_admin.delete(device_path(world.namespace, filler))

        async def released() -> bool:
            for filler in ("f1", "f2", "f3"):
                if await full_admin.get_or_none(claims_path(world.namespace, filler)) is not None:
                    return False
            return True

        await eventually(released, timeout=60, what="the fillers' claims never went")
        await world.order("pair", count=2)
        assert await world.bound_node("pair") == first
        assert await world.bound_node("c") == second
        claim = await world.held("pair", first, count=2)
        assert sorted(device for _driver, _pool, device in results(claim)) == [
            dra_driver.device_name(2), dra_driver.device_name(3)]
        await world.held("c", second)
        for name in ("a", "b", "d", "e"):
            assert await world.bound_node(name) == (first if name in ("a", "b") else second), name
        events = await full_admin.list_objects(resource_path("", "v1", "events", namespace=world.namespace),
                                               params={"fieldSelector": "involvedObject.name=c,reason=Moved"})
        assert any(f"compaction: room made on node {first} for GPUDevice {world.namespace}/pair" in e["message"]
                   for e in events["items"])
