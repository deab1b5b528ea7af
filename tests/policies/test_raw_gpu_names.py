"""R-POL-1 / R-ADM-5: with raw names forbidden, a GPU reaches a workload only through a GPUDevice reference."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cozygpu import keys
from cozygpu.kube import Client, errors
from tests.policies import support as s
from tests.policies.conftest import Callers, PolicyPlane, Settings

pytestmark = pytest.mark.both_minors

SETTINGS = f"{s.RELEASE_NAMESPACE}/{keys.SETTINGS_CONFIGMAP} rawNames=forbid"
DEVICE_REFS = {keys.DEVICE_REFS_LABEL: "true"}

# -- pods ---------------------------------------------------------------------------------


async def test_kubevirt_controller_creating_a_launcher_pod_owned_by_a_vmi_is_allowed(
    callers: Callers, tenant_ns: str, cleanup: Callable[[str], None],
) -> None:
    made = await callers.kubevirt_controller.create(
        s.pods(tenant_ns), s.pod("virt-launcher-vm1-abcde", gpu=s.GPU_NAME, owner_vmi=True))
    cleanup(f"{s.pods(tenant_ns)}/{made['metadata']['name']}")


async def test_kubevirt_controller_creating_a_gpu_pod_without_a_vmi_owner_is_refused(
    callers: Callers, tenant_ns: str,
) -> None:
    await s.refused(callers.kubevirt_controller.create(s.pods(tenant_ns), s.pod("stray", gpu=s.GPU_NAME)),
                    f"pod {tenant_ns}/stray", f"container compute requests {s.GPU_NAME}", SETTINGS)


async def test_a_tenant_writing_a_vmi_owner_onto_a_gpu_pod_is_refused(callers: Callers, tenant_ns: str) -> None:
    """Owner references are written by whoever creates the pod; only kubevirt-controller's count."""
    await s.refused(callers.tenant.create(s.pods(tenant_ns), s.pod("fake-launcher", gpu=s.GPU_NAME, owner_vmi=True)),
                    f"pod {tenant_ns}/fake-launcher", s.GPU_NAME)


@pytest.mark.parametrize("where", ["container", "init container"])
async def test_a_tenant_pod_requesting_a_gpu_resource_name_is_refused_under_forbid(
    callers: Callers, tenant_ns: str, where: str,
) -> None:
    body = s.pod("cuda", gpu=s.VGPU_NAME) if where == "container" else s.pod("cuda", init_gpu=s.VGPU_NAME)
    container = "compute" if where == "container" else "prepare"
    message = await s.refused(callers.tenant.create(s.pods(tenant_ns), body),
                              f"pod {tenant_ns}/cuda", f"container {container} requests {s.VGPU_NAME}",
                              "raw GPU names are forbidden", SETTINGS)
    assert "ValidatingAdmissionPolicy 'cozygpu-raw-gpu-names-pods'" in message


async def test_a_tenant_pod_requesting_other_extended_resources_is_allowed(
    callers: Callers, tenant_ns: str, cleanup: Callable[[str], None],
) -> None:
    await callers.tenant.create(s.pods(tenant_ns), s.pod("nic", gpu=s.NON_GPU_NAME))
    cleanup(f"{s.pods(tenant_ns)}/nic")


async def test_a_tenant_pod_requesting_a_gpu_resource_name_is_allowed_under_allow(
    callers: Callers, tenant_ns: str, settings: Settings, cleanup: Callable[[str], None],
) -> None:
    await settings.write(raw_names=keys.RAW_NAMES_ALLOW)
    await s.lifted(lambda: callers.tenant.create(s.pods(tenant_ns), s.pod("cuda", gpu=s.GPU_NAME), dry_run=True),
                   what="rawNames=allow read by the pod policy")
    await callers.tenant.create(s.pods(tenant_ns), s.pod("cuda", gpu=s.GPU_NAME))
    cleanup(f"{s.pods(tenant_ns)}/cuda")
    made = await callers.tenant.create(s.vmis(tenant_ns), s.vmi("raw", gpus=[s.GPU_NAME]))
    cleanup(f"{s.vmis(tenant_ns)}/raw")
    assert made["spec"]["domain"]["devices"]["gpus"][0]["deviceName"] == s.GPU_NAME


# -- VMIs ---------------------------------------------------------------------------------

GPU_ENTRIES: dict[str, tuple[dict[str, Any], str]] = {
    "a gpus entry": ({"gpus": [s.GPU_NAME]}, f"gpus entry gpu0 ({s.GPU_NAME})"),
    "a hostDevices entry of a GPU name": ({"host_devices": [s.GPU_NAME]}, f"hostDevices entry hostdev0 ({s.GPU_NAME})"),
    "a GPU resource limit": ({"resources": {"limits": {s.VGPU_NAME: "1"}}}, f"resource {s.VGPU_NAME}"),
    "a GPU resource request": ({"resources": {"requests": {s.VGPU_NAME: "1"}}}, f"resource {s.VGPU_NAME}"),
}


@pytest.mark.parametrize("entry", GPU_ENTRIES)
async def test_a_vmi_with_a_gpu_entry_and_no_device_refs_label_is_refused(
    callers: Callers, tenant_ns: str, entry: str,
) -> None:
    fields, described = GPU_ENTRIES[entry]
    await s.refused(callers.tenant.create(s.vmis(tenant_ns), s.vmi("vm1", **fields)),
                    f"VirtualMachineInstance {tenant_ns}/vm1", described, keys.DEVICE_REFS_LABEL, SETTINGS)


@pytest.mark.parametrize("entry", GPU_ENTRIES)
async def test_a_vmi_with_a_gpu_entry_and_the_device_refs_label_is_allowed(
    callers: Callers, tenant_ns: str, entry: str, cleanup: Callable[[str], None],
) -> None:
    fields, _ = GPU_ENTRIES[entry]
    await callers.tenant.create(s.vmis(tenant_ns), s.vmi("vm1", labels=DEVICE_REFS, **fields))
    cleanup(f"{s.vmis(tenant_ns)}/vm1")


async def test_a_vmi_with_a_host_device_that_is_no_gpu_is_allowed(
    callers: Callers, tenant_ns: str, cleanup: Callable[[str], None],
) -> None:
    await callers.tenant.create(s.vmis(tenant_ns), s.vmi("vm1", host_devices=[s.NON_GPU_NAME]))
    cleanup(f"{s.vmis(tenant_ns)}/vm1")


async def test_every_gpu_entry_of_a_refused_vmi_is_named(callers: Callers, tenant_ns: str) -> None:
    body = s.vmi("vm1", gpus=[s.GPU_NAME, s.VGPU_NAME], host_devices=[s.NON_GPU_NAME, s.GPU_NAME])
    message = await s.refused(callers.tenant.create(s.vmis(tenant_ns), body),
                              f"gpus entry gpu0 ({s.GPU_NAME})", f"gpus entry gpu1 ({s.VGPU_NAME})",
                              f"hostDevices entry hostdev1 ({s.GPU_NAME})")
    assert s.NON_GPU_NAME not in message


# -- the settings ConfigMap ---------------------------------------------------------------


async def test_without_the_settings_configmap_tenant_namespaces_fail_closed_and_others_are_untouched(
    admin: Client, callers: Callers, tenant_ns: str, plain_ns: str, settings: Settings,
    policies: PolicyPlane, cleanup: Callable[[str], None],
) -> None:
    await settings.delete()
    await s.in_force(lambda: admin.create(s.pods(tenant_ns), s.pod("plain"), dry_run=True),
                     what="a missing settings ConfigMap failing closed", says="cozygpu-raw-gpu-names-pods")

    # Every pod and VMI in a tenant namespace is refused, GPU or not, launcher or not.
    no_params = "no params found for policy binding with `Deny` parameterNotFoundAction"
    await s.refused(callers.tenant.create(s.pods(tenant_ns), s.pod("plain")),
                    'pods "plain"', "ValidatingAdmissionPolicy 'cozygpu-raw-gpu-names-pods'", no_params,
                    status=errors.Invalid)
    await s.refused(callers.kubevirt_controller.create(
        s.pods(tenant_ns), s.pod("virt-launcher-vm1-abcde", gpu=s.GPU_NAME, owner_vmi=True)),
        "cozygpu-raw-gpu-names-pods", no_params, status=errors.Invalid)
    await s.refused(callers.tenant.create(s.vmis(tenant_ns), s.vmi("plain")),
                    "cozygpu-raw-gpu-names-vmis", no_params, status=errors.Invalid)

    # Outside tenant namespaces nothing changes, raw GPU names included.
    for name, body in (("plain", s.pod("plain")), ("cuda", s.pod("cuda", gpu=s.GPU_NAME))):
        await callers.tenant.create(s.pods(plain_ns), body)
        cleanup(f"{s.pods(plain_ns)}/{name}")
    await callers.tenant.create(s.vmis(plain_ns), s.vmi("raw", gpus=[s.GPU_NAME]))
    cleanup(f"{s.vmis(plain_ns)}/raw")
    # Other writes in tenant namespaces are not the raw-name policies' business.
    await callers.tenant.create(s.configmaps(tenant_ns), s.configmap("unrelated"))
    cleanup(f"{s.configmaps(tenant_ns)}/unrelated")


async def test_a_malformed_settings_configmap_fails_closed_with_a_message_saying_so(
    admin: Client, callers: Callers, tenant_ns: str, settings: Settings,
) -> None:
    await settings.write(raw_names="Forbid")
    await s.in_force(lambda: admin.create(s.pods(tenant_ns), s.pod("plain"), dry_run=True),
                     what="a malformed settings ConfigMap failing closed", says="is malformed")
    await s.refused(callers.tenant.create(s.pods(tenant_ns), s.pod("plain")),
                    f"refusing CREATE of pods {tenant_ns}/plain",
                    f"the GPU settings ConfigMap {s.RELEASE_NAMESPACE}/{keys.SETTINGS_CONFIGMAP} is malformed")
