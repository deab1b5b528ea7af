"""R-POL-5: a finalized class's offer is frozen (judged on the stored class); a deleting class takes no orders."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from cozygpu import keys
from cozygpu.kube import Client, errors
from tests.policies import support as s
from tests.policies.conftest import Callers, PolicyPlane

pytestmark = pytest.mark.both_minors

FINALIZER = keys.CLASS_FINALIZER

#: change -> (the class's spec before, the merge patch of spec, the fields the refusal names)
OFFER_CHANGES: dict[str, tuple[dict[str, Any], dict[str, Any], list[str]]] = {
    "vendor": ({}, {"vendor": "AMD"}, ["spec.vendor"]),
    "model": ({}, {"model": "H200 SXM5 141GB"}, ["spec.model"]),
    "mode (and so profile)": ({}, {"mode": "VGPU", "profile": "H100-4C"}, ["spec.mode", "spec.profile"]),
    "profile": ({"mode": "VGPU", "profile": "H100-4C", "resourceName": s.VGPU_NAME},
                {"profile": "H100-8C"}, ["spec.profile"]),
    "memory": ({}, {"memory": "40Gi"}, ["spec.memory"]),
    "maxCount set": ({}, {"maxCount": 2}, ["spec.maxCount"]),
    "maxCount changed": ({"maxCount": 2}, {"maxCount": 4}, ["spec.maxCount"]),
    "maxCount unset": ({"maxCount": 2}, {"maxCount": None}, ["spec.maxCount"]),
}

NewClass = Callable[..., Awaitable[str]]


@pytest.fixture
async def new_class(admin: Client, policies: PolicyPlane) -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """``await new_class(finalized=True, **spec)``: a class's path; released (finalizer dropped, deleted) after."""
    made: list[str] = []

    async def create(*, finalized: bool = True, **spec: Any) -> str:
        name = s.unique("pol")
        await admin.create(s.CLASSES, s.gpu_class(name, finalized=finalized, **spec))
        made.append(f"{s.CLASSES}/{name}")
        return made[-1]

    yield create
    for path in made:
        try:
            await admin.merge_patch(path, {"metadata": {"finalizers": None}})
            await admin.delete(path)
        except errors.NotFound:
            continue


@pytest.mark.parametrize("change", OFFER_CHANGES)
async def test_changing_the_offer_of_a_finalized_class_is_refused_even_for_a_cluster_admin(
    admin: Client, new_class: NewClass, change: str,
) -> None:
    before, patch, fields = OFFER_CHANGES[change]
    path = await new_class(**before)
    name = path.rsplit("/", 1)[1]
    message = await s.refused(admin.merge_patch(path, {"spec": patch}),
                              f"changing {', '.join(fields)} of GPUClass {name} is refused", FINALIZER,
                              "offer a new class instead")
    assert "removes the finalizer" not in message


async def test_changing_the_source_member_of_a_finalized_class_is_refused(
    admin: Client, new_class: NewClass,
) -> None:
    """devicePlugin to dra, and one DRA offer to another: what the class sells, fixed while it is finalized."""
    path = await new_class()
    name = path.rsplit("/", 1)[1]
    await s.refused(admin.merge_patch(path, {"spec": {"source": {"devicePlugin": None, "dra": {
        "deviceClassName": "vfio.gpu.nvidia.com"}}}}), f"changing the member of spec.source of GPUClass {name}")
    dra_path = await new_class(source={"dra": {"deviceClassName": "vfio.gpu.nvidia.com"}})
    other = {"source": {"dra": {"deviceClassName": "other.example.com"}}}
    await s.refused(admin.merge_patch(dra_path, {"spec": other}), "changing spec.source.dra of GPUClass")


@pytest.mark.parametrize("change", ["vendor", "memory", "maxCount set"])
async def test_the_write_that_drops_the_finalizer_cannot_change_the_offer(
    admin: Client, new_class: NewClass, change: str,
) -> None:
    before, patch, fields = OFFER_CHANGES[change]
    path = await new_class(**before)
    await s.refused(admin.merge_patch(path, {"metadata": {"finalizers": None}, "spec": patch}),
                    f"changing {', '.join(fields)}", "the check reads the stored class")
    assert (await admin.get(path))["metadata"]["finalizers"] == [FINALIZER]


@pytest.mark.parametrize("patch", [
    {"resourceName": "nvidia.com/GH100_H100_SXM5_80GB_SHARED"},
    {"nodeSelector": {"matchLabels": {"gpu.example.com/pool": "b"}}},
    {"onCordon": "Stay"},
], ids=["resourceName", "nodeSelector", "onCordon"])
async def test_what_the_host_layer_owns_stays_open_on_a_finalized_class(
    admin: Client, new_class: NewClass, patch: dict[str, Any],
) -> None:
    path = await new_class()
    updated = await admin.merge_patch(path, {"spec": patch})
    for key, value in patch.items():
        assert updated["spec"][key] == value


async def test_a_class_without_the_finalizer_can_change_its_offer(
    admin: Client, new_class: NewClass,
) -> None:
    """The finalizer is what freezes the offer: the controller sets it on every class."""
    path = await new_class(finalized=False)
    await admin.merge_patch(path, {"spec": {"vendor": "AMD", "memory": "40Gi"}})


async def test_once_the_finalizer_is_gone_the_offer_can_change(admin: Client, new_class: NewClass) -> None:
    path = await new_class()
    await admin.merge_patch(path, {"metadata": {"finalizers": None}})
    await admin.merge_patch(path, {"spec": {"vendor": "AMD"}})


async def test_a_new_device_of_a_deleting_class_is_refused(
    admin: Client, callers: Callers, tenant_ns: str, new_class: NewClass, cleanup: Callable[[str], None],
) -> None:
    deleting = await new_class()
    other = await new_class()
    deleting_name, other_name = deleting.rsplit("/", 1)[1], other.rsplit("/", 1)[1]
    await callers.tenant.create(s.devices(tenant_ns), s.gpu_device("held", class_name=deleting_name))
    cleanup(f"{s.devices(tenant_ns)}/held")
    await admin.delete(deleting)
    # The API server reads the class (the binding's parameter) from its own informer, which sees the deletion a
    # moment later: until then a dry run is let through, nothing stored.
    await s.in_force(lambda: callers.tenant.create(s.devices(tenant_ns), s.gpu_device("late", class_name=deleting_name),
                                                   dry_run=True),
                     what="the policy refusing orders of the deleting class", says="being deleted")
    await s.refused(callers.tenant.create(s.devices(tenant_ns), s.gpu_device("late", class_name=deleting_name)),
                    f"GPUDevice {tenant_ns}/late is refused", f"it orders GPUClass {deleting_name}",
                    "being deleted and takes no new orders")
    # Orders of other classes, and the devices that already hold the deleting one, are untouched.
    await callers.tenant.create(s.devices(tenant_ns), s.gpu_device("fine", class_name=other_name))
    cleanup(f"{s.devices(tenant_ns)}/fine")
    await callers.tenant.merge_patch(f"{s.devices(tenant_ns)}/held", {"metadata": {"labels": {"team": "ml"}}})
