"""R-POL-1 / SPEC §1.5, raw use of DRA: with raw names forbidden, no tenant claim of a DeviceClass a GPUClass sells.

A tenant's own ResourceClaim or ResourceClaimTemplate of a sold DeviceClass
would take the devices the binder holds for GPUDevices; a pod asking for that
DeviceClass's extended resource name is refused by name (the class's
``resourceName`` is that name, so the settings list it). The claims policy
matches ``resource.k8s.io/v1``, which 1.33 does not serve: the claim cases run
on 1.36, the pod case on both minors.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from cozygpu import keys
from cozygpu.api import claims
from cozygpu.devcluster import apply, chart
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, errors
from cozygpu.model.dra import DeviceRef
from tests.policies import support as s
from tests.policies.conftest import Callers, PolicyPlane, Settings

POLICY = "cozygpu-raw-gpu-claims"
SETTINGS = f"{s.RELEASE_NAMESPACE}/{keys.SETTINGS_CONFIGMAP} rawNames=forbid"
THE_WAY = "a GPU reaches a workload only through a GPUDevice referenced by a VM"
#: The DeviceClass a GPUClass sells in these tests (NVIDIA's vfio class), and one no class sells.
SOLD = "vfio.gpu.nvidia.com"
UNSOLD = "gpu.example.com"
#: The sold DeviceClass's extended resource name: the class's ``resourceName``, so in ``resourceNames``.
SOLD_NAME = f"deviceclass.resource.kubernetes.io/{SOLD}"
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"

KINDS: dict[str, tuple[Callable[[str], str], Callable[..., dict[str, Any]]]] = {
    "ResourceClaim": (s.resource_claims, s.resource_claim),
    "ResourceClaimTemplate": (s.resource_claim_templates, s.resource_claim_template),
}


def selling_settings(*, raw_names: str = keys.RAW_NAMES_FORBID) -> dict[str, Any]:
    """The settings ConfigMap as the publisher writes it while a DRA-sourced GPUClass sells ``SOLD``."""
    return s.settings_configmap_selling([SOLD], raw_names=raw_names, names=(s.GPU_NAME, s.VGPU_NAME, SOLD_NAME))


async def serves(admin: Client, group_version: str) -> bool:
    try:
        await admin.get(f"/apis/{group_version}")
    except errors.NotFound:
        return False
    return True


@pytest.fixture
async def selling(admin: Client, policies: PolicyPlane) -> bool:
    """The settings ConfigMap says ``SOLD`` is sold (written if it does not); True where claims are served.

    Other tests put the plane's ConfigMap back to the default (nothing sold),
    so each test writes it again when needed and waits until it is read.
    """
    wanted = selling_settings()
    current = await admin.get_or_none(s.settings_path())
    if current is None or (current.get("data") or {}) != wanted["data"]:
        await apply.apply_objects(admin, [wanted])
    probe = policies.probe_namespace
    await s.in_force(lambda: admin.create(s.pods(probe), s.pod("probe", gpu=SOLD_NAME), dry_run=True),
                     what=f"the pod policy reading {SOLD_NAME}", says=f"container compute requests {SOLD_NAME}")
    if not await serves(admin, "resource.k8s.io/v1"):
        return False
    await s.in_force(lambda: admin.create(s.resource_claims(probe), s.resource_claim("probe", SOLD), dry_run=True),
                     what=f"the claims policy reading {SOLD} as sold", says=f"DeviceClass {SOLD}")
    return True


@pytest.fixture
def sold(selling: bool, plane: ControlPlane) -> str:
    """``SOLD``, on a plane that serves resource.k8s.io/v1 (the claim cases run on 1.36 only)."""
    assert selling, f"Kubernetes {plane.minor} does not serve resource.k8s.io/v1, the version the policy matches"
    return SOLD


@pytest.fixture
async def claims_ns(admin: Client, tenant_ns: str) -> str:
    """A tenant namespace in which everyone may also write resource.k8s.io objects."""
    await s.grant_resource_claims(admin, tenant_ns)
    return tenant_ns


def refusal(kind: str, namespace: str, name: str, *requests: str) -> tuple[str, ...]:
    """What a refusal of a raw claim must say."""
    return (f"{kind} {namespace}/{name} is refused: ", *requests, "raw GPU names are forbidden", SETTINGS, THE_WAY)


# -- refused and allowed ------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_a_tenant_claim_of_a_sold_device_class_is_refused(
    callers: Callers, claims_ns: str, sold: str, kind: str,
) -> None:
    path, body = KINDS[kind]
    message = await s.refused(callers.tenant.create(path(claims_ns), body("raw", sold)),
                              *refusal(kind, claims_ns, "raw", f"request gpu asks for DeviceClass {sold}"))
    assert f"ValidatingAdmissionPolicy '{POLICY}'" in message


@pytest.mark.parametrize("kind", KINDS)
async def test_a_tenant_claim_of_a_device_class_no_class_sells_is_allowed(
    callers: Callers, claims_ns: str, sold: str, kind: str, cleanup: Callable[[str], None],
) -> None:
    path, body = KINDS[kind]
    await callers.tenant.create(path(claims_ns), body("nic", UNSOLD, (UNSOLD, "other.example.com")))
    cleanup(f"{path(claims_ns)}/nic")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_sold_device_class_among_first_available_choices_is_refused(
    callers: Callers, claims_ns: str, sold: str, kind: str,
) -> None:
    path, body = KINDS[kind]
    asks = f"request gpu asks for DeviceClass {sold} (firstAvailable choice-1)"
    await s.refused(callers.tenant.create(path(claims_ns), body("fallback", (UNSOLD, sold))),
                    *refusal(kind, claims_ns, "fallback", asks))


async def test_every_request_of_a_sold_device_class_is_named_and_no_other(
    callers: Callers, claims_ns: str, sold: str,
) -> None:
    body = s.resource_claim("mixed", UNSOLD, sold, (sold, UNSOLD))
    message = await s.refused(callers.tenant.create(s.resource_claims(claims_ns), body),
                              f"request gpu-1 asks for DeviceClass {sold}; "
                              f"request gpu-2 asks for DeviceClass {sold} (firstAvailable choice-0)")
    assert "request gpu asks" not in message


async def test_a_claim_named_by_generate_name_is_refused_under_its_generated_name(
    callers: Callers, claims_ns: str, sold: str,
) -> None:
    """The resourceclaim controller names the claims it makes of templates so: the message still names one."""
    await s.refused(callers.tenant.create(s.resource_claims(claims_ns), s.resource_claim("raw", sold, generate=True)),
                    f"ResourceClaim {claims_ns}/raw-", f"request gpu asks for DeviceClass {sold}")


# -- who and where ------------------------------------------------------------------------


async def test_cozygpu_s_controller_creates_the_hold_claim_of_a_gpudevice(
    callers: Callers, claims_ns: str, sold: str, cleanup: Callable[[str], None],
) -> None:
    controller = callers.platform["the cozygpu controller"]
    device = await controller.create(s.devices(claims_ns), s.gpu_device("vm1-gpu"))
    cleanup(f"{s.devices(claims_ns)}/vm1-gpu")
    hold = claims.hold_claim("vm1-gpu", device["metadata"]["uid"], device_class=sold, count=2)
    made = await controller.create(s.resource_claims(claims_ns), hold)
    cleanup(f"{s.resource_claims(claims_ns)}/vm1-gpu")
    assert made["metadata"]["ownerReferences"][0]["kind"] == keys.GPUDEVICE_KIND


@pytest.mark.parametrize("caller", ["system:masters", "kube-controller-manager"])
async def test_no_other_platform_caller_is_exempt(callers: Callers, claims_ns: str, sold: str, caller: str) -> None:
    """kube-controller-manager makes claims of a pod's templates: a template of a sold class made before
    raw names were forbidden still makes none."""
    await s.refused(callers.platform[caller].create(s.resource_claims(claims_ns), s.resource_claim("raw", sold)),
                    *refusal("ResourceClaim", claims_ns, "raw", f"request gpu asks for DeviceClass {sold}"))


async def test_outside_tenant_namespaces_claims_of_a_sold_device_class_are_allowed(
    admin: Client, callers: Callers, plain_ns: str, sold: str, cleanup: Callable[[str], None],
) -> None:
    await s.grant_resource_claims(admin, plain_ns)
    for path, body in KINDS.values():
        await callers.tenant.create(path(plain_ns), body("raw", sold))
        cleanup(f"{path(plain_ns)}/raw")


async def test_with_raw_names_allowed_a_claim_of_a_sold_device_class_is_allowed(
    admin: Client, callers: Callers, claims_ns: str, sold: str, settings: Settings, cleanup: Callable[[str], None],
) -> None:
    await apply.apply_objects(admin, [selling_settings(raw_names=keys.RAW_NAMES_ALLOW)])
    await s.lifted(lambda: callers.tenant.create(s.resource_claims(claims_ns), s.resource_claim("raw", sold),
                                                 dry_run=True),
                   what="rawNames=allow read by the claims policy")
    for path, body in KINDS.values():
        await callers.tenant.create(path(claims_ns), body("raw", sold))
        cleanup(f"{path(claims_ns)}/raw")


# -- updates and subresources -------------------------------------------------------------


async def test_a_claim_that_exists_keeps_its_status_and_metadata_writes_and_its_spec_cannot_change(
    admin: Client, callers: Callers, claims_ns: str, sold: str, cleanup: Callable[[str], None],
) -> None:
    """CREATE only: kube-scheduler adds its finalizer and the resourceclaim controller removes it with
    updates of the claim itself, and the status goes to ``resourceclaims/status``; none of them is refused,
    while an UPDATE that would change the requests is refused by the API server (the spec is immutable)."""
    controller = callers.platform["the cozygpu controller"]
    device = await controller.create(s.devices(claims_ns), s.gpu_device("vm1-gpu"))
    cleanup(f"{s.devices(claims_ns)}/vm1-gpu")
    uid = device["metadata"]["uid"]
    await controller.create(s.resource_claims(claims_ns), claims.hold_claim("vm1-gpu", uid, device_class=sold, count=1))
    path = f"{s.resource_claims(claims_ns)}/vm1-gpu"
    cleanup(path)

    # Status (subresource): the binder's allocation, written here by a caller the policy does not exempt.
    status = claims.hold_status("node-a", [DeviceRef(driver="gpu.nvidia.com", pool="node-a", device="gpu-0")],
                                device_name="vm1-gpu", device_uid=uid, now=datetime.now(UTC))
    written = await admin.merge_patch(f"{path}/status", {"status": status})
    assert written["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"

    # The claim itself: the scheduler's finalizer comes and goes; a tenant's label too.
    kcm = callers.platform["kube-controller-manager"]
    await kcm.merge_patch(path, {"metadata": {"finalizers": [DELETE_PROTECTION]}})
    await callers.tenant.merge_patch(path, {"metadata": {"labels": {"team": "ml"}}})
    done = await kcm.merge_patch(path, {"metadata": {"finalizers": None}})
    assert DELETE_PROTECTION not in done["metadata"].get("finalizers", [])

    # What an UPDATE matched by the policy would have guarded: the API server refuses it first.
    with pytest.raises(errors.Invalid) as caught:
        await callers.tenant.merge_patch(path, {"spec": {"devices": {"requests": s.claim_requests(UNSOLD)}}})
    assert "immutable" in caught.value.message


# -- the settings ConfigMap ---------------------------------------------------------------


async def test_without_the_settings_configmap_claims_in_tenant_namespaces_fail_closed(
    admin: Client, callers: Callers, claims_ns: str, sold: str, settings: Settings,
) -> None:
    """The parameter is resolved before the match conditions run: cozygpu's own hold claims wait too."""
    await settings.delete()
    await s.in_force(lambda: admin.create(s.resource_claims(claims_ns), s.resource_claim("plain", UNSOLD),
                                          dry_run=True),
                     what="a missing settings ConfigMap failing closed", says=POLICY)
    no_params = "no params found for policy binding with `Deny` parameterNotFoundAction"
    for caller in (callers.tenant, callers.platform["the cozygpu controller"]):
        await s.refused(caller.create(s.resource_claims(claims_ns), s.resource_claim("plain", UNSOLD)),
                        f"ValidatingAdmissionPolicy '{POLICY}'", no_params, status=errors.Invalid)


async def test_a_configmap_without_device_class_names_fails_closed_with_a_message_saying_so(
    admin: Client, callers: Callers, claims_ns: str, sold: str, settings: Settings,
) -> None:
    """An older controller's ConfigMap: nothing says which DeviceClasses are sold, so no claim is let through."""
    older = selling_settings()
    del older["data"][keys.SETTINGS_DEVICE_CLASS_NAMES]
    await apply.apply_objects(admin, [older])  # the same field manager: the key it no longer applies goes
    await s.in_force(lambda: admin.create(s.resource_claims(claims_ns), s.resource_claim("plain", UNSOLD),
                                          dry_run=True),
                     what="a ConfigMap without deviceClassNames failing closed", says="no deviceClassNames")
    await s.refused(callers.tenant.create(s.resource_claims(claims_ns), s.resource_claim("plain", UNSOLD)),
                    f"refusing CREATE of resourceclaims {claims_ns}/plain",
                    f"the GPU settings ConfigMap {s.RELEASE_NAMESPACE}/{keys.SETTINGS_CONFIGMAP} has no "
                    "deviceClassNames JSON list")


# -- by name: pods ------------------------------------------------------------------------


@pytest.mark.both_minors
async def test_a_tenant_pod_asking_for_a_sold_device_class_s_extended_resource_name_is_refused(
    callers: Callers, tenant_ns: str, selling: bool,
) -> None:
    """Raw use by name (SPEC §1.5): the pods policy refuses it, since the name is in ``resourceNames``."""
    await s.refused(callers.tenant.create(s.pods(tenant_ns), s.pod("cuda", gpu=SOLD_NAME)),
                    f"pod {tenant_ns}/cuda", f"container compute requests {SOLD_NAME}", SETTINGS)


# -- the chart ----------------------------------------------------------------------------


def test_the_policy_reads_the_publisher_s_key_and_renders_only_with_gpu_on() -> None:
    """Pure rendering (tests/chart pins the other policies' keys the same way)."""
    on = chart.render({"gpu": {"enabled": True}}, namespace="gpu-system")
    policies = {o["metadata"]["name"]: o for o in on if o["kind"] == "ValidatingAdmissionPolicy"}
    bindings = {o["metadata"]["name"]: o for o in on if o["kind"] == "ValidatingAdmissionPolicyBinding"}
    variables = {v["name"]: v["expression"] for v in policies[POLICY]["spec"]["variables"]}
    assert f"params.?data.?{keys.SETTINGS_DEVICE_CLASS_NAMES}.orValue('')" == variables["soldClasses"]
    assert bindings[POLICY]["spec"]["paramRef"] == {
        "name": keys.SETTINGS_CONFIGMAP, "namespace": "gpu-system", "parameterNotFoundAction": "Deny"}
    assert bindings[POLICY]["spec"]["matchResources"]["namespaceSelector"] == {
        "matchExpressions": [{"key": keys.TENANT_NAMESPACE_LABEL, "operator": "Exists"}]}
    conditions = {c["name"]: c["expression"] for c in policies[POLICY]["spec"]["matchConditions"]}
    assert "'system:serviceaccount:gpu-system:cozygpu-controller'" in conditions["not-cozygpu"]
    assert [rule["operations"] for rule in policies[POLICY]["spec"]["matchConstraints"]["resourceRules"]] == [
        ["CREATE"]]
    off = chart.render({})
    assert POLICY not in {o["metadata"]["name"] for o in off}
