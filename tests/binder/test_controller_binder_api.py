"""The binder as the controller runs it: on the pass driver, in the leader term, over the process's cache."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from cozygpu.devcluster import pki
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client
from cozygpu.runtime.controller import Controller
from tests.binder.support import device_path
from tests.binder.world import World, stamp
from tests.runtime.test_controller_readiness import options, running
from tests.support.crds import install_fixture_crd


async def eventually(check: Callable[[], Awaitable[Any]], *, timeout: float = 60.0) -> Any:
    async with asyncio.timeout(timeout):
        while True:
            if result := await check():
                return result
            await asyncio.sleep(0.1)


def serving_cert(plane: ControlPlane, directory: Path) -> None:
    pair = pki.issue(pki.KeyPair(plane.pki_dir / "serving-ca.crt", plane.pki_dir / "serving-ca.key"), directory,
                     "webhook", common_name="cozygpu-webhook", hosts=("127.0.0.1",), server=True)
    pair.cert.rename(directory / "tls.crt")
    pair.key.rename(directory / "tls.key")


async def test_the_leader_binds_an_order_and_answers_a_bind_request_on_its_own(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    await install_fixture_crd(admin, "virtualmachineinstances.kubevirt.io")
    world = await World.make(admin, namespace)
    try:
        await world.node("n1", 4)
        serving_cert(plane, tmp_path)
        controller = Controller(options(f"ctl-{uuid.uuid4().hex[:6]}", "--enable-gpu", "--cert-dir",
                                        str(tmp_path)), admin)
        await admin.create("/api/v1/namespaces", {"metadata": {"name": controller.options.namespace}})
        async with running(controller):
            await world.order("order", 2)

            async def bound() -> dict[str, Any] | None:
                status = (await world.device("order")).get("status") or {}
                return status if status.get("phase") == "Bound" else None

            status = await eventually(bound)
            assert status["nodeName"] == world.node_name("n1")

            # A webhook's request on the held device: the answer lane answers it.
            await admin.merge_patch(device_path(namespace, "order", status=True), {"status": {
                "attachment": {"vmi": "vm", "attachedAt": stamp()}, "bindRequest": {"id": "r-1", "vmi": "vm"}}})

            async def answered() -> dict[str, Any] | None:
                answer = ((await world.device("order")).get("status") or {}).get("bindAnswer") or {}
                return answer if answer.get("id") == "r-1" else None

            answer = await eventually(answered)
            assert (answer["result"], answer["node"]) == ("Succeeded", world.node_name("n1"))
    finally:
        await world.cleanup()
