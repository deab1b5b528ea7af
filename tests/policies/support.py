"""Objects, paths, identities and polling for the admission policy tests.

The policies are evaluated by the real API server; nothing here evaluates CEL.
A policy or binding just applied (or a parameter just changed) is enforced
after a short delay, so state changes are followed by ``in_force`` /
``lifted``, which poll dry-run writes against a deadline.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import pytest
import yaml

from cozygpu import keys
from cozygpu.devcluster import apply, chart
from cozygpu.kube import Client, errors, resource_path
from cozygpu.runtime.settings import settings_data

# -- the chart's names --------------------------------------------------------------------

CHART_VALUES: dict[str, Any] = yaml.safe_load((apply.chart_dir() / "values.yaml").read_text())
RELEASE_NAMESPACE = chart.DEFAULT_NAMESPACE
AGENT_SA = CHART_VALUES["serviceAccounts"]["agent"]
CONTROLLER_SA = CHART_VALUES["serviceAccounts"]["controller"]
KUBEVIRT_NAMESPACE = CHART_VALUES["kubevirt"]["namespace"]
KUBEVIRT_CONTROLLER_SA = CHART_VALUES["kubevirt"]["controllerServiceAccount"]

#: GPU resource names the settings ConfigMap lists in these tests.
GPU_NAME = "nvidia.com/GH100_H100_SXM5_80GB"
VGPU_NAME = "nvidia.com/NVIDIA_H100-4C"
#: A host device that is not a GPU (a ConnectX VF): never a GPU entry.
NON_GPU_NAME = "mellanox.com/MT2892_CX6_VF"

# -- paths --------------------------------------------------------------------------------

CLASSES = resource_path(keys.GROUP, keys.VERSION, keys.GPUCLASS_PLURAL)
NODES = resource_path(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL)
NAMESPACES = resource_path("", "v1", "namespaces")


def devices(namespace: str) -> str:
    return resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, namespace=namespace)


def pods(namespace: str) -> str:
    return resource_path("", "v1", "pods", namespace=namespace)


def configmaps(namespace: str) -> str:
    return resource_path("", "v1", "configmaps", namespace=namespace)


def secrets(namespace: str) -> str:
    return resource_path("", "v1", "secrets", namespace=namespace)


def vmis(namespace: str) -> str:
    return resource_path("kubevirt.io", "v1", "virtualmachineinstances", namespace=namespace)


def resource_claims(namespace: str) -> str:
    return resource_path("resource.k8s.io", "v1", "resourceclaims", namespace=namespace)


def resource_claim_templates(namespace: str) -> str:
    return resource_path("resource.k8s.io", "v1", "resourceclaimtemplates", namespace=namespace)


def settings_path() -> str:
    return f"{configmaps(RELEASE_NAMESPACE)}/{keys.SETTINGS_CONFIGMAP}"


def unique(prefix: str) -> str:
    return f"{prefix}-{os.urandom(4).hex()}"


# -- objects ------------------------------------------------------------------------------


def metadata(name: str, *, labels: Mapping[str, str] | None = None,
             finalizers: Iterable[str] = ()) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = dict(labels)
    if finalizers:
        meta["finalizers"] = list(finalizers)
    return meta


def gpu_class(name: str, *, finalized: bool = True, **spec: Any) -> dict[str, Any]:
    """A passthrough H100 class; ``finalized`` adds the class finalizer the controller sets."""
    body: dict[str, Any] = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.GPUCLASS_KIND,
        "metadata": metadata(name, finalizers=[keys.CLASS_FINALIZER] if finalized else []),
        "spec": {
            "vendor": "NVIDIA",
            "model": "H100 SXM5 80GB",
            "mode": "Passthrough",
            "memory": "80Gi",
            "resourceName": GPU_NAME,
            "source": {"devicePlugin": {}},
        },
    }
    body["spec"].update(spec)
    return body


def gpu_device(name: str, *, class_name: str = "h100", labels: Mapping[str, str] | None = None,
               finalizers: Iterable[str] = ()) -> dict[str, Any]:
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.GPUDEVICE_KIND,
        "metadata": metadata(name, labels=labels, finalizers=finalizers),
        "spec": {"className": class_name, "count": 1},
    }


def pod(name: str, *, gpu: str | None = None, init_gpu: str | None = None, owner_vmi: bool = False,
        labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A pod that never runs (no kubelet); ``gpu`` puts one unit of that name in its limits."""
    container: dict[str, Any] = {"name": "compute", "image": "cozygpu.invalid/compute"}
    if gpu is not None:
        container["resources"] = {"limits": {gpu: "1"}}
    spec: dict[str, Any] = {"containers": [container]}
    if init_gpu is not None:
        spec["initContainers"] = [{"name": "prepare", "image": "cozygpu.invalid/prepare",
                                   "resources": {"requests": {init_gpu: "1"}, "limits": {init_gpu: "1"}}}]
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata(name, labels=labels),
                            "spec": spec}
    if owner_vmi:
        body["metadata"]["ownerReferences"] = [{
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": "vm1",
            "uid": "00000000-0000-4000-8000-000000000001", "controller": True, "blockOwnerDeletion": True,
        }]
    return body


def vmi(name: str, *, gpus: Iterable[str] = (), host_devices: Iterable[str] = (),
        resources: Mapping[str, Any] | None = None, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    devices_: dict[str, Any] = {}
    if gpus:
        devices_["gpus"] = [{"name": f"gpu{i}", "deviceName": n} for i, n in enumerate(gpus)]
    if host_devices:
        devices_["hostDevices"] = [{"name": f"hostdev{i}", "deviceName": n} for i, n in enumerate(host_devices)]
    domain: dict[str, Any] = {"devices": devices_}
    if resources is not None:
        domain["resources"] = dict(resources)
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": metadata(name, labels=labels),
        "spec": {"domain": domain},
    }


def configmap(name: str, *, labels: Mapping[str, str] | None = None,
              finalizers: Iterable[str] = ()) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(name, labels=labels, finalizers=finalizers),
            "data": {"k": "v"}}


def settings_configmap(*, raw_names: str = keys.RAW_NAMES_FORBID,
                       names: Iterable[str] = (GPU_NAME, VGPU_NAME)) -> dict[str, Any]:
    """The settings ConfigMap with the data the controller's publisher writes (SPEC §1.4)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": keys.SETTINGS_CONFIGMAP, "namespace": RELEASE_NAMESPACE},
        "data": settings_data(resource_names=names, raw_names=raw_names, gpu_enabled=True),
    }


def claim_requests(*device_classes: str | tuple[str, ...]) -> list[dict[str, Any]]:
    """``spec.devices.requests`` (resource.k8s.io/v1), one per argument, named ``gpu``, ``gpu-1``, …:
    a name asks for exactly one device of that DeviceClass, a tuple for the first available of its classes
    (choices named ``choice-0``, …)."""
    requests: list[dict[str, Any]] = []
    for i, wanted in enumerate(device_classes):
        request: dict[str, Any] = {"name": "gpu" if i == 0 else f"gpu-{i}"}
        if isinstance(wanted, str):
            request["exactly"] = {"deviceClassName": wanted, "allocationMode": "ExactCount", "count": 1}
        else:
            request["firstAvailable"] = [{"name": f"choice-{j}", "deviceClassName": name,
                                          "allocationMode": "ExactCount", "count": 1}
                                         for j, name in enumerate(wanted)]
        requests.append(request)
    return requests


def resource_claim(name: str, *device_classes: str | tuple[str, ...], generate: bool = False) -> dict[str, Any]:
    """A ResourceClaim asking for ``device_classes`` (``claim_requests``); ``generate`` names it by generateName."""
    meta: dict[str, Any] = {"generateName": f"{name}-"} if generate else {"name": name}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": {"requests": claim_requests(*device_classes)}}}


def resource_claim_template(name: str, *device_classes: str | tuple[str, ...]) -> dict[str, Any]:
    """A ResourceClaimTemplate whose claims ask for ``device_classes`` (``claim_requests``)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": claim_requests(*device_classes)}}}}


def settings_configmap_selling(device_classes: Iterable[str], *, raw_names: str = keys.RAW_NAMES_FORBID,
                               names: Iterable[str] = (GPU_NAME, VGPU_NAME)) -> dict[str, Any]:
    """``settings_configmap`` with GPUClasses selling ``device_classes`` (SPEC §1.5) as the publisher writes it."""
    body = settings_configmap(raw_names=raw_names, names=names)
    body["data"] = settings_data(resource_names=names, raw_names=raw_names, gpu_enabled=True,
                                 device_class_names=device_classes)
    return body


# -- namespaces and RBAC ------------------------------------------------------------------

#: Who the tests act as inside a tenant namespace. RBAC lets each of them do
#: anything there (the control plane has no aggregated roles), so a refusal
#: can only come from a policy.
TENANT_USER = "tenant-alice"
TENANT_GROUPS = ("tenant-acme-admin",)
KCM_USER = "system:kube-controller-manager"
SERVICE_ACCOUNTS = {
    "kubevirt-controller": (KUBEVIRT_NAMESPACE, KUBEVIRT_CONTROLLER_SA),
    "cozy-system": ("cozy-system", "cozystack-controller"),
    "kube-system": ("kube-system", "generic-garbage-collector"),
    "cozygpu-controller": (RELEASE_NAMESPACE, CONTROLLER_SA),
}


async def ensure_namespace(admin: Client, name: str, *, labels: Mapping[str, str] | None = None) -> None:
    if await admin.get_or_none(f"{NAMESPACES}/{name}") is None:
        await admin.create(NAMESPACES, {"metadata": metadata(name, labels=labels)})


async def tenant_namespace(admin: Client, *, tenant: bool = True) -> str:
    """A fresh namespace, labelled as a Cozystack tenant namespace unless ``tenant=False``, with RBAC for everyone."""
    name = unique("tenant-pol" if tenant else "plain-pol")
    labels = {keys.TENANT_NAMESPACE_LABEL: ""} if tenant else None
    await admin.create(NAMESPACES, {"metadata": metadata(name, labels=labels)})
    await grant_everything(admin, name)
    return name


async def _grant(admin: Client, namespace: str, name: str, rules: list[dict[str, Any]]) -> None:
    """A Role of ``rules`` in ``namespace``, bound to the tenant, kube-controller-manager and the service
    accounts the policy tests act as."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    await admin.create(f"{rbac}/namespaces/{namespace}/roles", {"metadata": {"name": name}, "rules": rules})
    subjects = [
        {"kind": "User", "name": TENANT_USER, "apiGroup": "rbac.authorization.k8s.io"},
        {"kind": "User", "name": KCM_USER, "apiGroup": "rbac.authorization.k8s.io"},
        *({"kind": "ServiceAccount", "namespace": ns, "name": sa} for ns, sa in SERVICE_ACCOUNTS.values()),
    ]
    await admin.create(f"{rbac}/namespaces/{namespace}/rolebindings", {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": subjects,
    })


async def grant_everything(admin: Client, namespace: str) -> None:
    await _grant(admin, namespace, "policy-tests",
                 [{"apiGroups": ["", keys.GROUP, "kubevirt.io"], "resources": ["*"], "verbs": ["*"]}])
    await rbac_in_force(admin, namespace)


async def grant_resource_claims(admin: Client, namespace: str) -> None:
    """``grant_everything`` for ``resource.k8s.io`` too (claims and claim templates, status included)."""
    await _grant(admin, namespace, "policy-tests-dra",
                 [{"apiGroups": ["resource.k8s.io"], "resources": ["*"], "verbs": ["*"]}])
    review = {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": TENANT_USER, "groups": list(TENANT_GROUPS),
                 "resourceAttributes": {"namespace": namespace, "verb": "create", "group": "resource.k8s.io",
                                        "resource": "resourceclaims"}},
    }

    async def allowed() -> bool:
        answer = await admin.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
        return bool(answer["status"].get("allowed"))

    await _poll(allowed, what=f"RBAC for resource claims in {namespace}", timeout=30.0)


async def rbac_in_force(admin: Client, namespace: str) -> None:
    """Wait until the API server's authorizer has seen the new Role and RoleBinding (they arrive by watch)."""
    review = {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": TENANT_USER, "groups": list(TENANT_GROUPS),
                 "resourceAttributes": {"namespace": namespace, "verb": "create", "group": keys.GROUP,
                                        "resource": keys.GPUDEVICE_PLURAL}},
    }

    async def allowed() -> bool:
        answer = await admin.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
        return bool(answer["status"].get("allowed"))

    await _poll(allowed, what=f"RBAC of the policy tests in {namespace}", timeout=30.0)


async def delete_token_pods(admin: Client, node: str) -> None:
    """Delete the pods bound service-account tokens were issued for on ``node`` (they never run)."""
    listing = await admin.list_objects(pods(RELEASE_NAMESPACE), params={"fieldSelector": f"spec.nodeName={node}"})
    for item in listing["items"]:
        await admin.delete(f"{pods(RELEASE_NAMESPACE)}/{item['metadata']['name']}", grace_period_seconds=0)


# -- outcomes -----------------------------------------------------------------------------


async def refused(write: Awaitable[Any], *says: str, status: type[errors.ApiError] = errors.Forbidden) -> str:
    """Await a write a policy must refuse, its message naming every ``says``.

    The policies' own refusals are 403 (``reason: Forbidden``); the API
    server's failure to resolve a binding's parameter is a 422.
    """
    with pytest.raises(status) as caught:
        await write
    message = caught.value.message
    for part in says:
        assert part in message, f"{part!r} not in the refusal: {message}"
    return message


async def _poll(attempt: Callable[[], Awaitable[bool]], *, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if await attempt():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        await asyncio.sleep(0.1)


async def in_force(write: Callable[[], Awaitable[Any]], *, what: str, says: str = "",
                   timeout: float = 30.0) -> None:
    """Poll ``write`` (a dry run) until a policy refuses it with a message containing ``says``.

    A 422 counts too: a binding whose parameter is missing refuses with it.
    """

    async def attempt() -> bool:
        try:
            await write()
        except (errors.Forbidden, errors.Invalid) as err:
            return says in err.message
        return False

    await _poll(attempt, what=what, timeout=timeout)


async def lifted(write: Callable[[], Awaitable[Any]], *, what: str, timeout: float = 30.0) -> None:
    """Poll ``write`` (a dry run) until it is accepted."""

    async def attempt() -> bool:
        try:
            await write()
        except errors.Forbidden:
            return False
        return True

    await _poll(attempt, what=what, timeout=timeout)


def dry_run() -> dict[str, Any]:
    """Request parameters of a dry run (admission runs, nothing is stored)."""
    return {"params": {"dryRun": "All"}}
