"""A real `helm install` on an empty control plane: the GPU-kind protections refuse right after it.

With ``policies.kinds.gpu: auto`` the agent node restriction, the device
protection and the class protection render on a first install, beside the
CRDs this chart creates (Helm applies CRDs before policies); before this they
appeared only with the next upgrade. The test runs the helm binary itself, so
its install order and its ``.Capabilities`` are Helm's, not an imitation.

No controller runs on this plane, so the GPUDevice webhooks (fail closed) could
only refuse; their configurations are deleted after the install to reach what
is tested here, the policies, which the API server evaluates itself.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cozygpu import keys
from cozygpu.devcluster import apply, binaries, chart
from cozygpu.devcluster.plane import ControlPlane
from tests.policies import support as s
from tests.support.planes import start_plane

MINORS = binaries.MINORS
VAPS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
GPU_KIND_POLICIES = {"cozygpu-agent-own-node", "cozygpu-device-protection", "cozygpu-class-protection",
                     "cozygpu-class-deleting"}
WEBHOOKS = ("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations")


@pytest.fixture(params=MINORS, ids=[f"k8s{m}" for m in MINORS])
async def empty_plane(request: pytest.FixtureRequest) -> AsyncIterator[ControlPlane]:
    plane = await asyncio.to_thread(start_plane, request.param)
    yield plane
    await asyncio.to_thread(plane.stop)


def helm_install(plane: ControlPlane, *settings: str) -> str:
    """``helm install`` of the chart into ``cozy-gpu`` (created by helm); blocking, run it in a thread."""
    helm = binaries.ensure_helm()
    with tempfile.TemporaryDirectory(prefix="cozygpu-helm-") as tmp:
        env = {**os.environ, "HELM_CACHE_HOME": tmp, "HELM_CONFIG_HOME": tmp, "HELM_DATA_HOME": tmp,
               "KUBECONFIG": str(plane.kubeconfig)}
        argv = [str(helm), "install", chart.DEFAULT_RELEASE, str(apply.chart_dir()),
                "--namespace", chart.DEFAULT_NAMESPACE, "--create-namespace", "--timeout", "120s"]
        for setting in settings:
            argv += ["--set", setting]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=env, cwd=Path(tmp))
    assert proc.returncode == 0, f"helm install failed (exit {proc.returncode}): {proc.stderr.strip()}"
    return proc.stdout


async def test_right_after_a_first_install_every_gpu_kind_protection_refuses(empty_plane: ControlPlane) -> None:
    plane = empty_plane
    await asyncio.to_thread(helm_install, plane, "gpu.enabled=true")
    async with plane.client() as admin:
        on_server = {item["metadata"]["name"] for item in (await admin.list_objects(VAPS))["items"]}
        assert on_server >= GPU_KIND_POLICIES, "the first install leaves out GPU-kind policies"
        for webhooks in WEBHOOKS:
            await admin.delete(f"{webhooks}/cozygpu-webhooks")

        # The agent on node A, with the chart's own RBAC (bound on the first install too), token bound to its pod.
        node_a, node_b = s.unique("node-a"), s.unique("node-b")
        token = await plane.service_account_token(admin, namespace=s.RELEASE_NAMESPACE, service_account=s.AGENT_SA,
                                                  node_name=node_a)
        await admin.create(s.NODES, {"apiVersion": keys.API_VERSION, "kind": keys.GPUNODE_KIND,
                                     "metadata": {"name": node_b}})
        async with plane.token_client(token) as agent:
            await s.in_force(lambda: agent.merge_patch(f"{s.NODES}/{node_b}/status", {"status": {"deviceCount": 9}},
                                                       **s.dry_run()),
                             what="the agent node policy", says=node_b)
            await s.refused(agent.merge_patch(f"{s.NODES}/{node_b}/status", {"status": {"deviceCount": 9}}), node_b)
            await agent.create(s.NODES, {"apiVersion": keys.API_VERSION, "kind": keys.GPUNODE_KIND,
                                         "metadata": {"name": node_a}})
        node = await admin.get(f"{s.NODES}/{node_b}")
        assert node.get("status", {}).get("deviceCount") is None, "node A's agent rewrote node B's GPUNode"

        # A tenant dropping the device finalizer.
        tenant_ns = await s.tenant_namespace(admin)
        device_path = f"{s.devices(tenant_ns)}/gpu1"
        await admin.create(s.devices(tenant_ns), s.gpu_device("gpu1", finalizers=[keys.DEVICE_FINALIZER]))
        async with plane.client(s.TENANT_USER, s.TENANT_GROUPS) as tenant:
            drop = {"metadata": {"finalizers": None}}
            await s.in_force(lambda: tenant.merge_patch(device_path, drop, **s.dry_run()),
                             what="the device protection policy", says=keys.DEVICE_FINALIZER)
            await s.refused(tenant.merge_patch(device_path, drop), f"removing the finalizer {keys.DEVICE_FINALIZER}")
        assert (await admin.get(device_path))["metadata"]["finalizers"] == [keys.DEVICE_FINALIZER]

        # The class protection: a finalized class's offer cannot change, for anyone.
        class_path = f"{s.CLASSES}/h100"
        await admin.create(s.CLASSES, s.gpu_class("h100"))
        await s.in_force(lambda: admin.merge_patch(class_path, {"spec": {"vendor": "AMD"}}, **s.dry_run()),
                         what="the class protection policy", says=keys.CLASS_FINALIZER)
        await s.refused(admin.merge_patch(class_path, {"spec": {"vendor": "AMD"}}), "spec.vendor")
        assert (await admin.get(class_path))["spec"]["vendor"] == "NVIDIA"

