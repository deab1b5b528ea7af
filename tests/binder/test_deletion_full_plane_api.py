"""Namespace and class deletion complete with GPU enabled and disabled (R-BIND-9), on the full plane.

The real namespace controller of kube-controller-manager deletes the tenant's
objects; it can only finish once the controller has released the device
finalizer, and the class deletion only once no device holds the class. Run
with ``--enable-gpu`` and without: the finalizers and the usage records are
always on, so turning GPU off never leaves a namespace stuck in Terminating.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from cozygpu import keys
from cozygpu.binder.usage import monitor_path, workload_path
from cozygpu.devcluster import nodes
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client
from cozygpu.runtime.controller import Controller
from tests.binder.support import VMI_CRD, class_path, device_path
from tests.binder.test_controller_binder_api import eventually, serving_cert
from tests.binder.world import World
from tests.runtime.test_controller_readiness import options, running
from tests.support.crds import install_fixture_crd
from tests.support.planes import Fleet

NAMESPACES = "/api/v1/namespaces"


@pytest.mark.parametrize("gpu_enabled", [True, False], ids=["gpu-on", "gpu-off"])
async def test_namespace_and_class_deletion_complete_with_gpu_on_and_off(
        full_plane: ControlPlane, full_admin: Client, fleet: Fleet, tmp_path: Path, gpu_enabled: bool) -> None:
    admin = full_admin
    for crd in (VMI_CRD, "workloadmonitors.cozystack.io", "workloads.cozystack.io"):
        await install_fixture_crd(admin, crd)
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    await admin.create(NAMESPACES, {"metadata": {"name": tenant}})
    world = await World.make(admin, tenant)
    node = world.node_name("n1")
    await fleet(nodes.SimNode(node, gpus={world.resource: 4}))
    await world.node("n1", 4, create_node=False)

    serving_cert(full_plane, tmp_path)
    extra = ("--enable-gpu", "--cert-dir", str(tmp_path)) if gpu_enabled else ()
    controller = Controller(options(f"ctl-{uuid.uuid4().hex[:6]}", *extra), admin)
    await admin.create(NAMESPACES, {"metadata": {"name": controller.options.namespace}})
    try:
        async with running(controller):
            if gpu_enabled:
                await world.order("d", 2)
            else:  # held from a time GPU was on: the binder does not place now, the reconcilers still run
                await world.order("d", 2, status=world.held("n1"))

            async def held_and_recorded() -> dict[str, Any] | None:
                device = await world.device("d")
                records = (await admin.list_objects(workload_path(tenant)))["items"]
                ready = ((device.get("status") or {}).get("phase") == "Bound"
                         and keys.DEVICE_FINALIZER in device["metadata"].get("finalizers", ())
                         and records)
                return device if ready else None

            device = await eventually(held_and_recorded)
            assert device["status"]["nodeName"] == node
            gpu_class = await admin.get(class_path(world.gpu_class))
            assert keys.CLASS_FINALIZER in gpu_class["metadata"]["finalizers"]

            await admin.delete(f"{NAMESPACES}/{tenant}")

            async def namespace_gone() -> bool:
                return await admin.get_or_none(f"{NAMESPACES}/{tenant}") is None

            await eventually(namespace_gone, timeout=90)
            assert await admin.get_or_none(device_path(tenant, "d")) is None
            assert (await admin.list_objects(monitor_path(tenant)))["items"] == []

            await admin.delete(class_path(world.gpu_class))

            async def class_gone() -> bool:
                return await admin.get_or_none(class_path(world.gpu_class)) is None

            await eventually(class_gone)
    finally:
        await world.cleanup()
