"""Finalizers against the real API server: class and device deletion complete at the right time (R-BIND-9)."""

from __future__ import annotations

from cozygpu import keys
from cozygpu.binder.finalizers import (
    class_finalizer_changes,
    device_finalizer_changes,
    finalizer_writes,
    vmi_uids,
)
from cozygpu.binder.patcher import Sent, send
from cozygpu.kube import Client, resource_path
from cozygpu.passes.writes import Writes
from tests.binder.support import VMI_CRD, VMIS, class_path, device_path, items, offer, order, unique
from tests.support.crds import install_fixture_crd


async def reconcile(admin: Client, *, vmis_served: bool = True) -> Sent:
    """One run of both finalizer reconcilers over what the server holds now (VMIs: None while not served)."""
    classes = await items(admin, class_path())
    devices = await items(admin, device_path(None))
    listed = await admin.get_or_none(resource_path(*VMIS)) if vmis_served else None
    vmis = vmi_uids(listed["items"]) if listed is not None else None
    changes = class_finalizer_changes(classes, devices) + device_finalizer_changes(devices, vmis)
    return await send(admin, finalizer_writes(changes), Writes())


async def test_a_class_deletion_waits_for_the_devices_that_hold_it(admin: Client, namespace: str) -> None:
    name = unique("h100")
    await offer(admin, name)
    await order(admin, namespace, "d1", class_name=name, status={"phase": "Bound", "nodeName": "n1"})
    await reconcile(admin)
    assert keys.CLASS_FINALIZER in (await admin.get(class_path(name)))["metadata"]["finalizers"]
    await admin.delete(class_path(name))
    await reconcile(admin)
    assert await admin.get_or_none(class_path(name)) is not None
    await admin.delete(device_path(namespace, "d1"))
    await reconcile(admin)  # releases the device (no VMI uses it)
    assert await admin.get_or_none(device_path(namespace, "d1")) is None
    await reconcile(admin)  # and then the class, which nothing holds any more
    assert await admin.get_or_none(class_path(name)) is None


async def test_a_deleted_device_stays_until_no_vmi_uses_it(admin: Client, namespace: str) -> None:
    await install_fixture_crd(admin, VMI_CRD)
    vmi = await admin.create(resource_path(*VMIS, namespace=namespace),
                             {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                              "metadata": {"name": "vm"}, "spec": {}})
    await order(admin, namespace, "d1", status={"phase": "Bound", "nodeName": "n1",
                                                "attachment": {"vmi": "vm", "uid": vmi["metadata"]["uid"]}})
    await reconcile(admin)
    assert (await admin.get(device_path(namespace, "d1")))["metadata"]["finalizers"] == [keys.DEVICE_FINALIZER]
    await admin.delete(device_path(namespace, "d1"))
    await reconcile(admin)
    await reconcile(admin, vmis_served=False)
    assert await admin.get_or_none(device_path(namespace, "d1")) is not None
    await admin.delete(resource_path(*VMIS, namespace=namespace, name="vm"))
    await reconcile(admin)
    assert await admin.get_or_none(device_path(namespace, "d1")) is None


async def test_a_finalizer_change_on_a_stale_version_is_left_to_the_next_pass(admin: Client, namespace: str) -> None:
    await order(admin, namespace, "d1")
    devices = await items(admin, device_path(namespace))
    changes = device_finalizer_changes(devices, {})
    await admin.merge_patch(device_path(namespace, "d1"), {"metadata": {"finalizers": ["someone/else"]}})
    report = await send(admin, finalizer_writes(changes), Writes())
    assert report.requeue
    assert (await admin.get(device_path(namespace, "d1")))["metadata"]["finalizers"] == ["someone/else"]
    await admin.merge_patch(device_path(namespace, "d1"), {"metadata": {"finalizers": None}})
