"""The controller runs under the chart's own least-privilege RBAC, as its ServiceAccount would.

An empty control plane of its own (the chart's fail-closed policies must not
land on the session's shared one): install the chart with GPU on, take a
token of the chart's controller ServiceAccount, and run the controller with
it. It must become ready (every webhook cache listed and watched), publish the
settings ConfigMap, take the Lease, join KubeVirt's VMIs once they are
served, and serve ``/metrics`` (with the webhook's certificate, as the values
allow) to the scraper the chart binds and to no one else — with nothing but
what the chart grants.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from cozygpu import keys
from cozygpu.devcluster import apply, chart
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import resource_path
from cozygpu.runtime import flags
from cozygpu.runtime.controller import Controller
from cozygpu.views import specs
from tests.support.crds import install_fixture_crd
from tests.support.planes import start_plane

NAMESPACE = chart.DEFAULT_NAMESPACE


@pytest.fixture
async def empty_plane() -> AsyncIterator[ControlPlane]:
    plane = await asyncio.to_thread(start_plane)
    yield plane
    await asyncio.to_thread(plane.stop)


async def ready(url: str) -> bool:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status == 200


async def scrape(url: str, token: str, trust: ssl.SSLContext) -> int:
    """The status of a scrape that verifies the webhook's certificate by the webhook Service's name."""
    server = f"cozygpu-controller-webhook.{NAMESPACE}.svc"
    async with aiohttp.ClientSession() as session, session.get(
            url, headers={"Authorization": f"Bearer {token}"}, ssl=trust, server_hostname=server) as resp:
        return resp.status


async def test_the_controller_does_its_work_with_only_the_charts_rbac(empty_plane: ControlPlane,
                                                                      tmp_path: Path) -> None:
    values = {"gpu": {"enabled": True}, "controller": {"metrics": {"certSecret": "cozygpu-webhook-tls"}},
              "monitoring": {"metricsReaders": [{"namespace": NAMESPACE, "name": "prometheus"}]}}
    async with empty_plane.client() as admin:
        await admin.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        rendered: list[dict[str, object]] = []
        for _ in range(2):  # install, then the upgrade that sees the chart's own CRDs
            served = await chart.served_api_versions(admin)
            rendered = await asyncio.to_thread(chart.render, values, api_versions=served, include_crds=True)
            await apply.apply_objects(admin, rendered, namespace=NAMESPACE)
        secret = next(o for o in rendered if o["kind"] == "Secret")
        data = secret["data"]
        assert isinstance(data, dict)
        for name in ("tls.crt", "tls.key"):
            (tmp_path / name).write_bytes(base64.b64decode(data[name]))
        token = await empty_plane.service_account_token(admin, namespace=NAMESPACE,
                                                        service_account="cozygpu-controller")
        identity = f"chart-rbac-{uuid.uuid4().hex[:6]}"
        options = flags.parse(["--enable-gpu", "--namespace", NAMESPACE, "--cert-dir", str(tmp_path),
                               "--health-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0",
                               "--metrics-cert-dir", str(tmp_path),
                               "--webhook-addr", "127.0.0.1:0", "--gpu-resource-names", "nvidia.com/H100",
                               "--lease-duration", "4s", "--renew-deadline", "3s", "--retry-period", "500ms",
                               "--identity", identity], env={})
        async with empty_plane.token_client(token) as client:
            controller = Controller(options, client)
            task = asyncio.create_task(controller.run())
            try:
                async with asyncio.timeout(60):
                    while not {"health", "metrics"} <= controller.bound.keys():
                        assert not task.done(), controller.supervisor.failures
                        await asyncio.sleep(0.1)
                    url = f"http://127.0.0.1:{controller.bound['health'].port}/readyz"
                    while not await ready(url):
                        assert not task.done(), controller.supervisor.failures
                        await asyncio.sleep(0.2)
                    settings_path = resource_path("", "v1", "configmaps", namespace=NAMESPACE,
                                                  name=keys.SETTINGS_CONFIGMAP)
                    settings = await admin.get_or_none(settings_path)
                    while settings is None:  # written by the controller's leader: poll
                        await asyncio.sleep(0.2)
                        settings = await admin.get_or_none(settings_path)
                    lease = await admin.get(resource_path("coordination.k8s.io", "v1", "leases",
                                                          namespace=NAMESPACE, name=keys.LEADER_LEASE))
                    assert lease["spec"]["holderIdentity"] == identity
                    assert json.loads(settings["data"][keys.SETTINGS_RESOURCE_NAMES]) == ["nvidia.com/H100"]
                    assert settings["data"][keys.SETTINGS_GPU_ENABLED] == "true"

                    trust = ssl.create_default_context(cadata=base64.b64decode(data["ca.crt"]).decode())
                    metrics = f"https://127.0.0.1:{controller.bound['metrics'].port}/metrics"
                    for account, status in (("prometheus", 200), ("stranger", 403)):
                        scraper = await empty_plane.service_account_token(admin, namespace=NAMESPACE,
                                                                          service_account=account)
                        assert await scrape(metrics, scraper, trust) == status, account

                    await install_fixture_crd(admin, "virtualmachineinstances.kubevirt.io")
                    while not controller.cache.has_synced(specs.VMIS):
                        assert not task.done(), controller.supervisor.failures
                        await asyncio.sleep(0.2)
            finally:
                controller.stop("test over")
                async with asyncio.timeout(30):
                    clean = await task
            assert clean, controller.supervisor.failures
