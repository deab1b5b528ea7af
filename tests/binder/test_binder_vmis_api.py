"""The binder and VMIs against the real API server: running launchers, attachments, templates, the lazy VMI kind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cozygpu import keys
from cozygpu.binder.attachments import AttachmentsUnverified
from cozygpu.kube import Client, errors, resource_path
from cozygpu.views import specs
from tests.binder.support import VMI_CRD, VMIS, device_path
from tests.binder.world import RunningBinder, World, cache_until, running_binder, seen_by, stamp
from tests.support.crds import install_fixture_crd, uninstall_fixture_crd

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@pytest.fixture
async def binder(admin: Client) -> AsyncIterator[RunningBinder]:
    await install_fixture_crd(admin, VMI_CRD)
    async with running_binder(admin, attachment_grace=timedelta(seconds=30)) as running:
        yield running


async def vmi(world: World, name: str, *, status: dict[str, Any] | None = None) -> dict[str, Any]:
    path = resource_path(*VMIS, namespace=world.namespace)
    made: dict[str, Any] = await world.admin.create(path, {
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": name},
        "spec": {"domain": {"devices": {}}}})
    if status:
        made = await world.admin.merge_patch(f"{path}/{name}/status", {"status": status})
    return made


async def running_launcher(world: World, vmi_obj: dict[str, Any], node: str) -> dict[str, Any]:
    """A launcher pod Running on ``node`` and the VMI naming it in ``status.activePods``."""
    pods = resource_path("", "v1", "pods", namespace=world.namespace)
    name = vmi_obj["metadata"]["name"]
    pod = await world.admin.create(pods, {"metadata": {
        "name": f"virt-launcher-{name}-abcde", "labels": {"kubevirt.io": "virt-launcher",
                                                          "kubevirt.io/created-by": vmi_obj["metadata"]["uid"]}},
        "spec": {"nodeName": node, "containers": [{"name": "compute", "image": "virt-launcher"}]}})
    await world.admin.merge_patch(f"{pods}/{pod['metadata']['name']}/status", {"status": {"phase": "Running"}})
    updated: dict[str, Any] = await world.admin.merge_patch(
        resource_path(*VMIS, namespace=world.namespace, name=name, subresource="status"),
        {"status": {"phase": "Running", "nodeName": node, "activePods": {pod["metadata"]["uid"]: node}}})
    return updated


async def test_a_running_launchers_device_is_never_moved_off_its_not_ready_node(
        world: World, binder: RunningBinder) -> None:
    await world.node("n1", 1)
    await world.node("n2", 1)
    vm = await vmi(world, "vm")
    await world.order("d", status={**world.held("n1"), "attachment": {"vmi": "vm", "uid": vm["metadata"]["uid"],
                                                                        "attachedAt": stamp()}})
    vm = await running_launcher(world, vm, world.node_name("n1"))
    await world.set_ready("n1", False)
    await seen_by(binder, specs.VMIS.key, vm)
    await seen_by(binder, specs.NODES.key, await world.admin.get(f"/api/v1/nodes/{world.node_name('n1')}"))
    await seen_by(binder, specs.GPU_DEVICES.key, await world.device("d"))

    await binder.each_lane()

    kept = await world.device("d")
    assert (kept["status"]["phase"], kept["status"]["nodeName"]) == ("Bound", world.node_name("n1"))
    assert kept["status"]["attachment"]["vmi"] == "vm"


async def test_an_attachment_is_cleared_when_its_vmi_is_gone_or_never_came_and_the_hold_stays(
        world: World, binder: RunningBinder) -> None:
    await world.node("n1", 4)
    long_ago = stamp(datetime.now(UTC) - timedelta(minutes=5))
    await world.order("gone", status={**world.held("n1"), "attachment": {"vmi": "vm-gone", "uid": "u-gone"}})
    await world.order("never", status={**world.held("n1"), "attachment": {"vmi": "vm-never", "attachedAt": long_ago}})
    await world.order("young", status={**world.held("n1"), "attachment": {"vmi": "vm-young", "attachedAt": stamp()}})
    await seen_by(binder, specs.GPU_DEVICES.key, await world.device("young"))

    await binder.each_lane()

    for name in ("gone", "never"):
        cleared = (await world.device(name))["status"]
        assert "attachment" not in cleared, name
        assert (cleared["phase"], cleared["nodeName"]) == ("Bound", world.node_name("n1"))
    assert (await world.device("young"))["status"]["attachment"]["vmi"] == "vm-young"


async def test_a_vm_stopped_within_the_grace_is_detached_at_once_because_its_vmi_uid_was_recorded(
        world: World, binder: RunningBinder) -> None:
    # The webhook attaches before the VMI exists (no UID): the binder records the UID once the VMI is there,
    # so the VMI's deletion (a VM stopped seconds after it started) clears the attachment on the next pass.
    await world.node("n1", 4)
    await world.order("held", status={**world.held("n1"), "attachment": {"vmi": "vm-a", "attachedAt": stamp()}})
    made = await vmi(world, "vm-a")
    await seen_by(binder, specs.VMIS.key, made)

    await binder.each_lane()
    assert (await world.device("held"))["status"]["attachment"]["uid"] == made["metadata"]["uid"]

    await world.admin.delete(f"{resource_path(*VMIS, namespace=world.namespace)}/vm-a")
    await cache_until(binder, specs.VMIS, lambda: binder.cache.store(specs.VMIS).get(world.namespace, "vm-a") is None)
    await binder.each_lane()

    kept = (await world.device("held"))["status"]
    assert "attachment" not in kept, "the attachment waited out the grace (30 s) instead"
    assert (kept["phase"], kept["nodeName"]) == ("Bound", world.node_name("n1"))


async def test_a_template_device_goes_with_its_vmi(world: World, binder: RunningBinder) -> None:
    await world.node("n1", 2)
    vm = await vmi(world, "vm")
    made = await world.order("tpl", status={**world.held("n1"), "attachment": {
        "vmi": "vm", "uid": vm["metadata"]["uid"], "attachedAt": stamp()}})
    await world.admin.merge_patch(device_path(world.namespace, "tpl"),
                                  {"metadata": {"labels": {keys.TEMPLATE_DEVICE_LABEL: "true"}}})
    await seen_by(binder, specs.GPU_DEVICES.key, await world.device("tpl"))
    await binder.each_lane()
    assert (await world.device("tpl"))["metadata"]["uid"] == made["metadata"]["uid"]  # its VMI is there: kept

    await world.admin.delete(resource_path(*VMIS, namespace=world.namespace, name="vm"))
    await cache_until(binder, specs.VMIS, lambda: binder.cache.store(specs.VMIS).get(world.namespace, "vm") is None)
    await binder.each_lane()
    await binder.each_lane()  # the finalizer is released once nothing uses the device

    with pytest.raises(errors.NotFound):
        await world.device("tpl")


async def test_while_the_vmi_kind_is_not_served_an_attached_device_fails_the_pass_and_nothing_is_detached(
        admin: Client, world: World) -> None:
    await uninstall_fixture_crd(admin, VMI_CRD)
    await wait_gone(admin, f"{CRDS}/{VMI_CRD}")
    try:
        await world.node("n1", 1)
        await world.node("n2", 1)
        await world.order("d", status={**world.held("n1"), "attachment": {"vmi": "vm", "uid": "u-1",
                                                                            "attachedAt": stamp()}})
        await world.set_ready("n1", False)  # a node the device would be moved off, were the VMI known
        async with running_binder(admin) as binder:
            await seen_by(binder, specs.GPU_DEVICES.key, await world.device("d"))
            await seen_by(binder, specs.NODES.key, await admin.get(f"/api/v1/nodes/{world.node_name('n1')}"))

            with pytest.raises(AttachmentsUnverified):
                await binder.each_lane()

            held = await world.device("d")
            assert (held["status"]["nodeName"], held["status"]["attachment"]["uid"]) == (world.node_name("n1"), "u-1")
            verified = next(c for c in held["status"]["conditions"] if c["type"] == "AttachmentVerified")
            assert (verified["status"], verified["reason"]) == ("False", "VMIKindNotServed")

            # KubeVirt arrives: the binder's cache joins the VMI watch, and the VMI is gone for real now.
            await install_fixture_crd(admin, VMI_CRD)
            await binder.cache.wait_synced(specs.VMIS, timeout=60)
            await binder.each_lane()  # moves the device off n1: its VMI runs nowhere
            await binder.each_lane()  # and clears the attachment of a VMI that is gone
            await binder.each_lane()  # and says the attachment is judged again

            moved = (await world.device("d"))["status"]
            assert "attachment" not in moved
            assert moved["nodeName"] == world.node_name("n2")
            verified = next(c for c in moved["conditions"] if c["type"] == "AttachmentVerified")
            assert (verified["status"], verified["reason"]) == ("True", "VMIKindServed")
    finally:
        await install_fixture_crd(admin, VMI_CRD)


async def wait_gone(admin: Client, path: str, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while True:
            if await admin.get_or_none(path) is None:
                return
            await asyncio.sleep(0.1)


def placed(device: dict[str, Any]) -> tuple[str, str]:
    return device["status"]["phase"], device["status"].get("nodeName")


async def split_running_set(world: World, binder: RunningBinder, *, n1: int) -> None:
    """VMI vm's two devices split: a (1 unit) on n1, where its launcher runs, and b (2 units) on n2 (4 units)."""
    await world.node("n1", n1)
    await world.node("n2", 4)
    vm = await vmi(world, "vm")
    attached = {"attachment": {"vmi": "vm", "uid": vm["metadata"]["uid"], "attachedAt": stamp()}}
    await world.order("a", 1, status={**world.held("n1"), **attached})
    await world.order("b", 2, status={**world.held("n2"), **attached})
    vm = await running_launcher(world, vm, world.node_name("n1"))
    await seen_by(binder, specs.VMIS.key, vm)
    for name in ("a", "b"):
        await seen_by(binder, specs.GPU_DEVICES.key, await world.device(name))
    await cache_until(binder, specs.PODS, lambda: any(
        p["metadata"]["name"] == "virt-launcher-vm-abcde" and (p.get("status") or {}).get("phase") == "Running"
        for p in binder.cache.store(specs.PODS).list()))


async def test_a_split_set_whose_vm_runs_is_gathered_onto_the_launchers_node_never_moving_its_member(
        world: World, binder: RunningBinder) -> None:
    # n2 holds more of the set and has room for all of it: an idle set would gather there, moving a off the
    # node its VM runs on. R-BIND-7: b joins a on n1 instead.
    await split_running_set(world, binder, n1=3)

    await binder.each_lane()

    a, b = await world.device("a"), await world.device("b")
    assert placed(a) == ("Bound", world.node_name("n1")), "the member the running VM uses was moved"
    assert placed(b) == ("Bound", world.node_name("n1"))
    assert a["status"]["attachment"]["vmi"] == b["status"]["attachment"]["vmi"] == "vm"


async def test_a_split_set_whose_vm_runs_is_left_split_with_a_condition_when_the_launchers_node_has_no_room(
        world: World, binder: RunningBinder) -> None:
    # n1 serves 1 unit: b cannot join a there. n2 has room for the whole set, but going there moves a.
    await split_running_set(world, binder, n1=1)

    await binder.each_lane()

    a, b = await world.device("a"), await world.device("b")
    assert placed(a) == ("Bound", world.node_name("n1")), "the member the running VM uses was moved"
    assert placed(b) == ("Bound", world.node_name("n2"))
    for device in (a, b):
        (bound,) = [c for c in device["status"]["conditions"] if c["type"] == "Bound"]
        assert bound["reason"] == "SplitWhileVMRuns", bound
        assert f"runs on node {world.node_name('n1')}" in bound["message"], bound["message"]
