"""Two controller replicas: the API server calls the one that does not lead, which answers from its own cache."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

from cozygpu import keys
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, resource_path
from cozygpu.runtime.controller import Controller
from tests.admission.harness import VMIS, answers, register, unregister, vmi_body, wait_called
from tests.binder.support import VMI_CRD
from tests.binder.test_controller_binder_api import serving_cert
from tests.binder.world import World
from tests.runtime.test_controller_readiness import options, running
from tests.support.crds import install_fixture_crd


async def test_the_replica_that_does_not_lead_admits_a_start_the_leaders_binder_answers(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    await install_fixture_crd(admin, VMI_CRD)
    world = await World.make(admin, namespace)
    names: list[str] = []
    try:
        await world.node("n1", 2)
        serving_cert(plane, tmp_path)
        home = f"ctl-{uuid.uuid4().hex[:6]}"
        await admin.create("/api/v1/namespaces", {"metadata": {"name": home}})
        replicas = [Controller(options(home, "--enable-gpu", "--cert-dir", str(tmp_path), "--bind-wait", "5s"),
                               admin) for _ in range(2)]
        async with contextlib.AsyncExitStack() as stack:
            for replica in replicas:
                await stack.enter_async_context(running(replica))
            lease = resource_path("coordination.k8s.io", "v1", "leases", namespace=home, name=keys.LEADER_LEASE)
            async with asyncio.timeout(30):
                while True:  # until one leads and both serve their webhooks
                    holder = ((await admin.get_or_none(lease)) or {}).get("spec", {}).get("holderIdentity")
                    if holder in {r.options.identity for r in replicas} and all("webhooks" in r.bound
                                                                                for r in replicas):
                        break
                    await asyncio.sleep(0.2)
            follower = next(r for r in replicas if r.options.identity != holder)
            url = f"https://127.0.0.1:{follower.bound['webhooks'].port}"
            names = await register(admin, plane, url, namespace, timeout_seconds=10)
            await wait_called(admin, namespace)
            refs = [{"template": "gpu", "class": world.gpu_class, "count": 2}]
            made = await admin.create(VMIS.format(namespace), vmi_body("vm", refs))
            assert [e["deviceName"] for e in made["spec"]["domain"]["devices"]["gpus"]] == [world.resource] * 2
            assert answers(follower.registry, "vmi", "allowed") == 1
            leader = next(r for r in replicas if r.options.identity == holder)
            assert answers(leader.registry, "vmi", "allowed") == 0
    finally:
        await unregister(admin, names)
        await world.cleanup()
