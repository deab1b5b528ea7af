"""The order's finalizer from the MutatingAdmissionPolicy (R-BIND-9), on the real API server of the current minor.

No webhook is registered here: whatever finalizer an order comes out with,
the API server gave it. The policy is ``finalizer_policy()``, the one the
chart renders (``tests/chart/test_admission_render.py`` pins the two), bound
to this test's namespace only.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from cozygpu import keys
from cozygpu.admission.webhooks import finalizer_policy
from cozygpu.kube import Client, errors, resource_path
from tests.admission.harness import scope
from tests.binder.support import device_path
from tests.support.waiting import eventually

POLICIES = resource_path("admissionregistration.k8s.io", "v1", "mutatingadmissionpolicies")
BINDINGS = resource_path("admissionregistration.k8s.io", "v1", "mutatingadmissionpolicybindings")


def order(name: str, finalizers: list[str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if finalizers is not None:
        metadata["finalizers"] = finalizers
    return {"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND, "metadata": metadata,
            "spec": {"className": "any", "count": 1}}


@contextlib.asynccontextmanager
async def policy_in_force(admin: Client, namespace: str) -> AsyncIterator[None]:
    """The policy and its binding for ``namespace``, once the API server applies them (it loads them a moment
    after they are written), removed afterwards."""
    policy, binding = finalizer_policy(namespace_selector=scope(namespace),
                                       name=f"cozygpu-test-{uuid.uuid4().hex[:8]}")
    await admin.create(POLICIES, policy)
    await admin.create(BINDINGS, binding)
    try:
        await eventually(lambda: given(admin, namespace), what="the policy giving a dry-run order its finalizer")
        yield
    finally:
        for path in (f"{BINDINGS}/{binding['metadata']['name']}", f"{POLICIES}/{policy['metadata']['name']}"):
            with contextlib.suppress(errors.NotFound):
                await admin.delete(path)


async def given(admin: Client, namespace: str) -> bool:
    """A dry-run order comes out with the finalizer (False too while the API server does not serve GPUDevices yet:
    a plane just started may still be loading the CRDs)."""
    try:
        made = await admin.create(device_path(namespace), order("probe"), dry_run=True)
    except errors.ServerError as error:
        if error.status == 503:
            return False
        raise
    return keys.DEVICE_FINALIZER in made["metadata"].get("finalizers", [])


async def test_every_order_is_created_with_the_finalizer_once_whatever_finalizers_it_brings(
        admin: Client, namespace: str) -> None:
    async with policy_in_force(admin, namespace):
        made = [await admin.create(device_path(namespace), order(name, finalizers)) for name, finalizers in (
            ("none", None), ("empty", []), ("theirs", ["example.com/keep"]),
            ("already", [keys.DEVICE_FINALIZER]), ("both", [keys.DEVICE_FINALIZER, "example.com/keep"]))]
    try:
        assert {m["metadata"]["name"]: m["metadata"]["finalizers"] for m in made} == {
            "none": [keys.DEVICE_FINALIZER], "empty": [keys.DEVICE_FINALIZER],
            "theirs": ["example.com/keep", keys.DEVICE_FINALIZER], "already": [keys.DEVICE_FINALIZER],
            "both": [keys.DEVICE_FINALIZER, "example.com/keep"]}
        # Only a create: an update that drops it is left to the device-protection policy and the binder.
        path = device_path(namespace, "none")
        updated = await admin.merge_patch(path, {"metadata": {"finalizers": None}})
        assert "finalizers" not in updated["metadata"]
    finally:
        for m in made:
            path = device_path(namespace, m["metadata"]["name"])
            with contextlib.suppress(errors.NotFound):
                await admin.merge_patch(path, {"metadata": {"finalizers": None}})
                await admin.delete(path)


async def test_outside_its_binding_an_order_is_left_as_written(admin: Client, namespace: str) -> None:
    other = f"t-{uuid.uuid4().hex[:10]}"
    await admin.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": other}})
    async with policy_in_force(admin, namespace):
        made = await admin.create(device_path(other), order("elsewhere"), dry_run=True)
    assert "finalizers" not in made["metadata"]
