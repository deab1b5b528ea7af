"""The GPUDevice webhook called by the real API server: each refusal of R-ADM-1 with its numbers."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from cozygpu import keys
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, errors, resource_path
from tests.admission.harness import admission
from tests.binder.support import class_path, device_path
from tests.binder.world import World

ORDER = {"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND}


async def refused(admin: Client, namespace: str, class_name: str, count: int) -> str:
    body: dict[str, Any] = {**ORDER, "metadata": {"name": f"o-{uuid.uuid4().hex[:6]}"},
                            "spec": {"className": class_name, "count": count}}
    with pytest.raises(errors.ApiError) as caught:
        await admin.create(device_path(namespace), body)
    assert caught.value.status == 403, caught.value
    listed = await admin.list_objects(device_path(namespace))
    assert body["metadata"]["name"] not in {d["metadata"]["name"] for d in listed["items"]}
    return caught.value.message


async def accepted(admin: Client, namespace: str, class_name: str, count: int) -> dict[str, Any]:
    body: dict[str, Any] = {**ORDER, "metadata": {"name": f"o-{uuid.uuid4().hex[:6]}"},
                            "spec": {"className": class_name, "count": count}}
    made: dict[str, Any] = await admin.create(device_path(namespace), body)
    return made


async def a_class(admin: Client, world: World, name: str, **spec: Any) -> str:
    body = {"vendor": "NVIDIA", "model": "H100", "mode": "Passthrough", "memory": "80Gi",
            "resourceName": world.resource, "source": {"devicePlugin": {}}, **spec}
    await admin.create(class_path(), {"apiVersion": keys.API_VERSION, "kind": keys.GPUCLASS_KIND,
                                      "metadata": {"name": name}, "spec": body})
    return name


async def test_an_order_of_an_unknown_class_or_beyond_max_count_is_refused_with_the_limit(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    world = await World.make(admin, namespace)
    try:
        await world.node("n1", 8)
        capped = await a_class(admin, world, f"capped-{world.tag}", maxCount=2)
        async with admission(plane, admin, namespace, tmp_path):
            assert "class nope-" in await refused(admin, namespace, f"nope-{world.tag}", 1)
            message = await refused(admin, namespace, capped, 3)
            assert f"class {capped}: maxCount 2 per device, order of 3 exceeds it by 1" in message
            made = await accepted(admin, namespace, capped, 2)
            # The finalizer comes with the order: no binder runs here to add it.
            assert made["metadata"]["finalizers"] == [keys.DEVICE_FINALIZER]
            theirs = {**ORDER, "metadata": {"name": f"o-{uuid.uuid4().hex[:6]}", "finalizers": ["example.com/keep"]},
                      "spec": {"className": capped, "count": 1}}
            made = await admin.create(device_path(namespace), theirs)
            assert made["metadata"]["finalizers"] == ["example.com/keep", keys.DEVICE_FINALIZER]
            await admin.merge_patch(device_path(namespace, made["metadata"]["name"]),
                                    {"metadata": {"finalizers": []}})
    finally:
        await world.cleanup()


async def test_an_order_beyond_the_free_units_of_the_cluster_or_of_one_node_is_refused_with_the_numbers(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    world = await World.make(admin, namespace)
    try:
        await world.node("n1", 2)
        await world.node("n2", 2)
        async with admission(plane, admin, namespace, tmp_path):
            message = await refused(admin, namespace, world.gpu_class, 5)
            assert f"class {world.gpu_class}: 4 units free in the cluster, order of 5 exceeds it by 1" in message
            message = await refused(admin, namespace, world.gpu_class, 3)
            assert f"class {world.gpu_class}: at most 2 units free on one node" in message
            assert "order of 3 exceeds it by 1" in message
            await accepted(admin, namespace, world.gpu_class, 2)
    finally:
        await world.cleanup()


async def tenant(admin: Client, hard: dict[str, str], labels: dict[str, str] | None = None) -> str:
    name = f"tenant-{uuid.uuid4().hex[:8]}"
    await admin.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": name,
                                                                            "labels": labels or {}}})
    if hard:
        await admin.create(resource_path("", "v1", "resourcequotas", namespace=name),
                           {"metadata": {"name": keys.TENANT_QUOTA_NAME}, "spec": {"hard": hard}})
    return name


async def test_a_budget_counts_the_tenants_orders_not_yet_accepted(
        plane: ControlPlane, admin: Client, tmp_path: Path) -> None:
    world = await World.make(admin, "default")
    try:
        await world.node("n1", 8)
        namespace = await tenant(admin, {f"requests.{keys.class_quota_key(world.gpu_class)}": "3"})
        async with admission(plane, admin, namespace, tmp_path):
            await accepted(admin, namespace, world.gpu_class, 2)  # Pending: no binder runs here
            message = await refused(admin, namespace, world.gpu_class, 2)
            assert (f"budget {keys.class_quota_key(world.gpu_class)} of {namespace}: 3 allowed, 2 in use, "
                    "order of 2 exceeds it by 1") in message
            await accepted(admin, namespace, world.gpu_class, 1)
    finally:
        await world.cleanup()


async def test_a_raw_key_without_a_gpu_key_blocks_the_class_and_an_unreadable_budget_refuses(
        plane: ControlPlane, admin: Client, tmp_path: Path) -> None:
    world = await World.make(admin, "default")
    try:
        await world.node("n1", 8)
        blocked = await tenant(admin, {f"requests.{world.resource}": "4"})
        async with admission(plane, admin, blocked, tmp_path):
            message = await refused(admin, blocked, world.gpu_class, 1)
            assert f"raw quota key requests.{world.resource} of {blocked} blocks class {world.gpu_class}" in message
    finally:
        await world.cleanup()


async def test_a_vgpu_class_needs_the_entitlement_and_a_deleting_class_takes_no_orders(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    world = await World.make(admin, namespace)
    try:
        await world.node("n1", 8)
        vgpu = await a_class(admin, world, f"vgpu-{world.tag}", mode="VGPU", profile="H100-1-10C")
        going = await a_class(admin, world, f"going-{world.tag}")
        await admin.merge_patch(class_path(going), {"metadata": {"finalizers": ["test.example/hold"]}})
        await admin.delete(class_path(going))
        entitled = await tenant(admin, {}, {keys.VGPU_ENTITLED_LABEL: keys.VGPU_ENTITLED_VALUE})
        async with admission(plane, admin, namespace, tmp_path):
            message = await refused(admin, namespace, vgpu, 1)
            assert f"class {vgpu} is a VGPU class and {namespace} is not entitled to it" in message
            message = await refused(admin, namespace, going, 1)
            assert f"class {going} is being deleted and takes no new orders" in message
        async with admission(plane, admin, entitled, tmp_path / "e"):
            await accepted(admin, entitled, vgpu, 1)
    finally:
        await admin.merge_patch(class_path(f"going-{world.tag}"), {"metadata": {"finalizers": None}})
        await world.cleanup()
