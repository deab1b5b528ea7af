"""Bounded admission through the real API server: extreme orders and starts are refused with their numbers.

The webhooks run in the test's process as in ``harness.admission``. A VMI
whose template asks for 3,000,000 GPUs, one with 5,000 ``gpus`` entries, and a
GPUDevice order of 2^31-1 are refused with the limit and the number, and a
one-unit order sent beside each is answered (no time is asserted beyond a
guard against a hang: the figures are ``bench/bench_admission.py --extreme``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from cozygpu.admission import bounds
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, errors, resource_path
from tests.admission.harness import VMIS, admission, vmi_body
from tests.binder.world import World
from tests.support.crds import install_fixture_crd

#: Only against a hang: an answer that never comes.
HANG = 10.0


async def _refused(call: Any) -> str:
    async with asyncio.timeout(HANG):
        with pytest.raises(errors.ApiError) as caught:
            await call
    return caught.value.message


async def test_extreme_orders_and_starts_are_refused_with_their_numbers_and_an_order_beside_them_is_answered(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    await install_fixture_crd(admin, "virtualmachineinstances.kubevirt.io")
    world = await World.make(admin, namespace)
    await world.node("n1", 8)
    devices = resource_path("gpu.cozystack.io", "v1alpha1", "gpudevices", namespace=namespace)

    def order(name: str, count: int) -> dict[str, Any]:
        return {"apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUDevice", "metadata": {"name": name},
                "spec": {"className": world.gpu_class, "count": count}}

    huge_template = vmi_body("huge", [{"template": "gpu", "class": world.gpu_class, "count": 3_000_000}])
    many_gpus = vmi_body("many", [{"template": "gpu", "class": world.gpu_class, "count": 1}], devices={
        "gpus": [{"name": f"g{i}", "deviceName": world.resource} for i in range(5_000)]})
    async with admission(plane, admin, namespace, tmp_path):
        for extreme, expected in (
                (admin.create(VMIS.format(namespace), huge_template, dry_run=True),
                 ["order of 3000000 exceeds it by 2999992"]),
                (admin.create(VMIS.format(namespace), huge_template), ["order of 3000000 exceeds it by 2999992"]),
                (admin.create(VMIS.format(namespace), many_gpus, dry_run=True),
                 ["spec.domain.devices.gpus: 5000 entries", f"at most {bounds.MAX_LIST}"]),
                (admin.create(devices, order("big", 2**31 - 1)), [f"order of {2**31 - 1} exceeds it by"])):
            beside = asyncio.ensure_future(admin.create(devices, order("one", 1), dry_run=True))
            message = await _refused(extreme)
            for part in expected:
                assert part in message, message
            async with asyncio.timeout(HANG):
                answered = await beside
            assert answered["spec"]["count"] == 1
        listed = await admin.list_objects(devices)
        assert listed["items"] == []
