"""R-POL-4: only platform callers add or remove the device finalizer or the template-device label."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cozygpu import keys
from cozygpu.kube import Client
from tests.policies import support as s
from tests.policies.conftest import Callers

pytestmark = pytest.mark.both_minors

FINALIZER = keys.DEVICE_FINALIZER
TEMPLATE = keys.TEMPLATE_DEVICE_LABEL
PLATFORM_CALLERS = ["system:masters", "a cozy-system service account", "a kube-system service account",
                    "kube-controller-manager", "the cozygpu controller"]


@pytest.fixture
def device_path(tenant_ns: str, cleanup: Callable[[str], None]) -> str:
    """Where the test's device lives; deleted (finalizers stripped) afterwards."""
    path = f"{s.devices(tenant_ns)}/gpu1"
    cleanup(path)
    return path


async def test_a_tenant_order_may_come_with_the_finalizer_as_the_gpudevice_webhook_gives_it(
        callers: Callers, tenant_ns: str, device_path: str) -> None:
    made = await callers.tenant.create(s.devices(tenant_ns), s.gpu_device("gpu1", finalizers=[FINALIZER]))
    assert made["metadata"]["finalizers"] == [FINALIZER]
    await s.refused(callers.tenant.merge_patch(device_path, {"metadata": {"finalizers": None}}),
                    f"removing the finalizer {FINALIZER} from GPUDevice {tenant_ns}/gpu1")


async def test_a_tenant_ordering_a_device_with_the_template_label_is_refused(callers: Callers, tenant_ns: str) -> None:
    await s.refused(callers.tenant.create(s.devices(tenant_ns), s.gpu_device("gpu1", labels={TEMPLATE: "true"})),
                    f"adding the label {TEMPLATE} on GPUDevice {tenant_ns}/gpu1", "deletes with its VMI")


async def test_a_tenant_orders_and_relabels_a_plain_device(callers: Callers, tenant_ns: str, device_path: str) -> None:
    await callers.tenant.create(s.devices(tenant_ns), s.gpu_device("gpu1", labels={"team": "ml"}))
    await callers.tenant.merge_patch(device_path, {"metadata": {"labels": {"team": "cv"}}})


async def test_a_tenant_cannot_add_the_finalizer_or_the_label_later(
    callers: Callers, tenant_ns: str, device_path: str,
) -> None:
    await callers.tenant.create(s.devices(tenant_ns), s.gpu_device("gpu1"))
    await s.refused(callers.tenant.merge_patch(device_path, {"metadata": {"finalizers": [FINALIZER]}}),
                    f"adding the finalizer {FINALIZER}")
    await s.refused(callers.tenant.merge_patch(device_path, {"metadata": {"labels": {TEMPLATE: "true"}}}),
                    f"adding the label {TEMPLATE}")


async def test_a_tenant_cannot_remove_or_change_what_the_platform_set(
    admin: Client, callers: Callers, tenant_ns: str, device_path: str,
) -> None:
    await admin.create(s.devices(tenant_ns), s.gpu_device("gpu1", labels={TEMPLATE: "true"}, finalizers=[FINALIZER]))
    await s.refused(callers.tenant.merge_patch(device_path, {"metadata": {"finalizers": None}}),
                    f"removing the finalizer {FINALIZER} from GPUDevice {tenant_ns}/gpu1")
    await s.refused(callers.tenant.merge_patch(device_path, {"metadata": {"labels": {TEMPLATE: None}}}),
                    f"removing the label {TEMPLATE}")
    await s.refused(callers.tenant.merge_patch(device_path, {"metadata": {"labels": {TEMPLATE: "false"}}}),
                    f"changing the label {TEMPLATE}")
    # Other metadata of a protected device stays the tenant's.
    await callers.tenant.merge_patch(device_path, {"metadata": {"labels": {"team": "ml"}}})


@pytest.mark.parametrize("caller", PLATFORM_CALLERS)
async def test_each_platform_caller_adds_and_removes_the_finalizer_and_the_label(
    callers: Callers, tenant_ns: str, device_path: str, caller: str,
) -> None:
    platform = callers.platform[caller]
    made = await platform.create(s.devices(tenant_ns),
                                 s.gpu_device("gpu1", labels={TEMPLATE: "true"}, finalizers=[FINALIZER]))
    assert made["metadata"]["finalizers"] == [FINALIZER]
    await platform.merge_patch(device_path, {"metadata": {"finalizers": None, "labels": {TEMPLATE: None}}})
    again = await platform.merge_patch(device_path, {"metadata": {"finalizers": [FINALIZER],
                                                                  "labels": {TEMPLATE: "true"}}})
    assert again["metadata"]["labels"][TEMPLATE] == "true"


async def test_orphan_and_foreground_deletion_finalizers_stay_free_for_a_tenant(
    admin: Client, callers: Callers, tenant_ns: str, device_path: str,
) -> None:
    await admin.create(s.devices(tenant_ns), s.gpu_device("gpu1", finalizers=[FINALIZER]))
    for gc_finalizer in ("orphan", "foregroundDeletion"):  # the API server refuses both at once
        added = await callers.tenant.merge_patch(device_path, {"metadata": {"finalizers": [FINALIZER, gc_finalizer]}})
        assert added["metadata"]["finalizers"] == [FINALIZER, gc_finalizer]
        dropped = await callers.tenant.merge_patch(device_path, {"metadata": {"finalizers": [FINALIZER]}})
        assert dropped["metadata"]["finalizers"] == [FINALIZER]
    # A tenant's foreground deletion adds foregroundDeletion itself; the device finalizer keeps the device.
    await callers.tenant.request("DELETE", device_path, body={"kind": "DeleteOptions", "apiVersion": "v1",
                                                              "propagationPolicy": "Foreground"})
    deleting = await admin.get(device_path)
    assert deleting["metadata"]["deletionTimestamp"]
    assert set(deleting["metadata"]["finalizers"]) == {FINALIZER, "foregroundDeletion"}



async def test_the_status_subresource_is_no_way_around_the_policy(
    callers: Callers, tenant_ns: str, device_path: str,
) -> None:
    """The policy matches gpudevices, not gpudevices/status: a status write drops metadata changes itself."""
    await callers.tenant.create(s.devices(tenant_ns), s.gpu_device("gpu1"))
    patch = {"metadata": {"finalizers": [FINALIZER], "labels": {TEMPLATE: "true"}}, "status": {"phase": "Pending"}}
    await callers.tenant.merge_patch(f"{device_path}/status", patch)
    device = await callers.tenant.get(device_path)
    assert device["status"]["phase"] == "Pending"
    assert FINALIZER not in device["metadata"].get("finalizers", [])
    assert TEMPLATE not in device["metadata"].get("labels", {})
