"""Readiness, probes, metrics and the webhook slot of one controller, run in the test's loop against the real API.

The controller acts as a user of its own whose RBAC the test controls, so a
cache can be kept from syncing (no permission to list its kind) and then let
go, and KubeVirt's kinds can be made unreadable whether or not their CRDs are
installed.
"""

from __future__ import annotations

import asyncio
import ssl
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import aiohttp

from cozygpu import keys
from cozygpu.devcluster import pki
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, resource_path
from cozygpu.runtime import flags
from cozygpu.runtime.controller import Controller
from cozygpu.views import specs
from tests.runtime.scraping import metrics_reader_token, scrape

RBAC = "rbac.authorization.k8s.io"
CLUSTER_ROLES = resource_path(RBAC, "v1", "clusterroles")
CLUSTER_ROLE_BINDINGS = resource_path(RBAC, "v1", "clusterrolebindings")
READ = ["get", "list", "watch"]

#: What a controller needs without GPU, except GPUDevices (granted separately).
BASE_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": READ},
    {"apiGroups": [keys.GROUP], "resources": [keys.GPUCLASS_PLURAL], "verbs": READ},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": [*READ, "create", "update"]},
]
DEVICE_RULES: list[dict[str, Any]] = [{"apiGroups": [keys.GROUP], "resources": [keys.GPUDEVICE_PLURAL], "verbs": READ}]
#: What the webhooks read with GPU enabled; KubeVirt's kinds are left out on purpose.
GPU_RULES: list[dict[str, Any]] = [
    {"apiGroups": [keys.GROUP], "resources": [keys.GPUNODE_PLURAL], "verbs": READ},
    {"apiGroups": [""], "resources": ["nodes", "namespaces", "resourcequotas", "pods"], "verbs": READ},
]


async def grant(admin: Client, user: str, name: str, rules: list[dict[str, Any]]) -> None:
    role = f"{user}-{name}"
    await admin.create(CLUSTER_ROLES, {"metadata": {"name": role}, "rules": rules})
    await admin.create(CLUSTER_ROLE_BINDINGS, {
        "metadata": {"name": role},
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": RBAC, "kind": "User", "name": user}],
    })


def options(namespace: str, *extra: str) -> flags.Options:
    return flags.parse(["--namespace", namespace, "--health-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0",
                        "--webhook-addr", "127.0.0.1:0", "--lease-duration", "4s", "--renew-deadline", "3s",
                        "--retry-period", "500ms", "--identity", f"test-{uuid.uuid4().hex[:6]}", *extra], env={})


@asynccontextmanager
async def running(controller: Controller) -> AsyncIterator[str]:
    """Run the controller; yields the base URL of its probe server once it and the metrics server listen."""
    task = asyncio.create_task(controller.run())
    try:
        async with asyncio.timeout(30):
            while not {"health", "metrics"} <= controller.bound.keys():
                assert not task.done(), task
                await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{controller.bound['health'].port}"
    finally:
        controller.stop("test over")
        async with asyncio.timeout(30):
            clean = await task
        assert clean, controller.supervisor.failures


async def get(url: str, *, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url, ssl=context if context else False) as resp:
        return resp.status, await resp.text()


async def eventually(probe: Callable[[], Any], *, timeout: float, every: float = 0.2) -> None:
    async with asyncio.timeout(timeout):
        while True:
            if await probe():
                return
            await asyncio.sleep(every)


async def test_readiness_stays_false_until_the_webhook_caches_have_synced(
    plane: ControlPlane, admin: Client, namespace: str
) -> None:
    user = f"controller-{uuid.uuid4().hex[:8]}"
    await grant(admin, user, "base", BASE_RULES)
    async with plane.client(user, ()) as client:
        controller = Controller(options(namespace), client)
        async with running(controller) as base:
            async def classes_synced() -> bool:
                return controller.cache.has_synced(specs.GPU_CLASSES)

            await eventually(classes_synced, timeout=30)
            for _ in range(15):  # three seconds of asking: never ready while GPUDevices cannot be listed
                status, body = await get(f"{base}/readyz")
                assert status == 503
                assert f"[-]caches failed: not synced: {specs.GPU_DEVICES.key}\n" in body
                await asyncio.sleep(0.2)
            assert (await get(f"{base}/healthz"))[0] == 200
            assert not controller.elector.leading, "leader election starts only after the caches"

            await grant(admin, user, "devices", DEVICE_RULES)

            async def ready() -> bool:
                return (await get(f"{base}/readyz"))[0] == 200

            await eventually(ready, timeout=60)
            status, body = await get(f"{base}/readyz")
            assert "[+]caches ok" in body


async def test_with_gpu_enabled_readiness_never_waits_for_kubevirt_and_the_webhook_server_serves_the_webhooks(
    plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path
) -> None:
    user = f"controller-{uuid.uuid4().hex[:8]}"
    for name, rules in (("base", BASE_RULES), ("devices", DEVICE_RULES), ("gpu", GPU_RULES)):
        await grant(admin, user, name, rules)
    serving = pki.issue(pki.KeyPair(plane.pki_dir / "serving-ca.crt", plane.pki_dir / "serving-ca.key"), tmp_path,
                        "webhook", common_name="cozygpu-webhook", hosts=("127.0.0.1",), server=True)
    serving.cert.rename(tmp_path / "tls.crt")
    serving.key.rename(tmp_path / "tls.key")
    async with plane.client(user, ()) as client:
        controller = Controller(options(namespace, "--enable-gpu", "--cert-dir", str(tmp_path)), client)
        async with running(controller) as base:
            async def ready() -> bool:
                return (await get(f"{base}/readyz"))[0] == 200

            await eventually(ready, timeout=60)
            # The controller cannot read VMIs or KubeVirt CRs at all, installed or not: still ready.
            assert not controller.cache.has_synced(specs.VMIS)
            assert not controller.cache.has_synced(specs.KUBEVIRTS)
            status, body = await get(f"{base}/readyz")
            assert "[+]webhooks ok" in body
            webhook = controller.bound["webhooks"]
            context = ssl.create_default_context(cafile=str(plane.ca_file))
            status, body = await get(f"https://127.0.0.1:{webhook.port}/validate-gpudevice", context=context)
            assert (status, "POSTed") == (400, "POSTed" if "POSTed" in body else body)
            status, _ = await get(f"https://127.0.0.1:{webhook.port}/no-such-webhook", context=context)
            assert status == 404


async def test_metrics_report_cache_and_lease_state(plane: ControlPlane, admin: Client, namespace: str) -> None:
    controller = Controller(options(namespace), admin)
    token = await metrics_reader_token(plane, admin, namespace)
    async with running(controller) as base:
        async def leading() -> bool:
            return controller.elector.leading

        await eventually(leading, timeout=30)
        assert (await get(f"{base}/readyz"))[0] == 200
        status, text = await scrape(controller, token)
        assert status == 200
        assert "cozygpu_leader_is_leader 1.0" in text
        assert 'cozygpu_cache_synced{kind="gpuclasses.v1alpha1.gpu.cozystack.io"} 1.0' in text
        assert 'cozygpu_cache_relists_total{kind="gpuclasses.v1alpha1.gpu.cozystack.io",reason="initial"}' in text
        assert "cozygpu_ready 1.0" in text
        assert "cozygpu_settings_writes_total" in text


async def test_stopping_reports_not_ready_before_anything_else_stops(
    plane: ControlPlane, admin: Client, namespace: str
) -> None:
    controller = Controller(options(namespace), admin)
    task = asyncio.create_task(controller.run())
    try:
        async def bound() -> bool:
            return "health" in controller.bound and controller.readiness.ready()

        await eventually(bound, timeout=30)
        controller.stop("test")
        results = dict(controller.readiness.results())
        assert results["shutdown"] == "the process is stopping"
        assert await task
    finally:
        with suppress(asyncio.CancelledError):
            task.cancel()
            await task
