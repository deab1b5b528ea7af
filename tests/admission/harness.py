"""The webhooks served on loopback HTTPS and registered with the real API server, scoped to one test's namespace.

``admission(...)`` runs a cache and ``AdmissionWebhooks`` over the admin client,
serves them with a certificate from the plane's serving CA, registers the
webhook configurations (``cozygpu.admission.webhooks.configurations``, the
same the local cluster uses) for the test's namespace only, waits until the
API server calls them, and removes everything afterwards. ``with_binder``
runs a binder on its pass driver over the same cache, as the leader does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
from aiohttp import web
from prometheus_client import CollectorRegistry

from cozygpu import keys
from cozygpu.admission.view import OPTIONAL, REQUIRED
from cozygpu.admission.webhooks import AdmissionConfig, AdmissionWebhooks, configurations
from cozygpu.base.clock import LoopClock
from cozygpu.binder.binder import Binder, BinderConfig
from cozygpu.binder.loop import binder_driver
from cozygpu.binder.metrics import BinderMetrics
from cozygpu.cache.cache import Cache
from cozygpu.devcluster import pki
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, errors, resource_path
from cozygpu.runtime.webhook import webhook_app
from cozygpu.views import specs

VALIDATING = resource_path("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations")
MUTATING = resource_path("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations")
VMIS = "/apis/kubevirt.io/v1/namespaces/{}/virtualmachineinstances"
#: The leader Lease's namespace of the webhooks under test (nobody holds it unless a test says so).
CONTROLLER_NAMESPACE = "cozygpu-admission-tests"


def server_context(plane: ControlPlane, directory: Path) -> ssl.SSLContext:
    directory.mkdir(parents=True, exist_ok=True)
    pair = pki.issue(pki.KeyPair(plane.pki_dir / "serving-ca.crt", plane.pki_dir / "serving-ca.key"), directory,
                     "webhook", common_name="cozygpu-webhook", hosts=("127.0.0.1",), server=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pair.cert, pair.key)
    return context


def ca_bundle(plane: ControlPlane) -> str:
    return base64.b64encode(plane.ca_file.read_bytes()).decode()


def scope(namespace: str) -> dict[str, Any]:
    return {"matchLabels": {"kubernetes.io/metadata.name": namespace}}


@attrs.define
class Served:
    webhooks: AdmissionWebhooks
    cache: Cache
    registry: CollectorRegistry
    url: str
    names: list[str]

    def answers(self, webhook: str, outcome: str) -> float:
        """Answers of ``webhook`` with ``outcome``, whatever their reason."""
        return answers(self.registry, webhook, outcome)


def answers(registry: CollectorRegistry, webhook: str, outcome: str) -> float:
    total = 0.0
    for family in registry.collect():
        for sample in family.samples:
            if (sample.name == "cozygpu_admission_answers_total" and sample.labels.get("webhook") == webhook
                    and sample.labels.get("outcome") == outcome):
                total += sample.value
    return total


async def register(admin: Client, plane: ControlPlane, url: str, namespace: str, *, timeout_seconds: int
                   ) -> list[str]:
    name = f"cozygpu-test-{uuid.uuid4().hex[:8]}"
    validating, mutating = configurations(url, ca_bundle(plane), timeout_seconds=timeout_seconds,
                                          namespace_selector=scope(namespace), name=name)
    await admin.create(VALIDATING, validating)
    await admin.create(MUTATING, mutating)
    return [name]


async def unregister(admin: Client, names: list[str]) -> None:
    for name in names:
        for path in (VALIDATING, MUTATING):
            with contextlib.suppress(errors.NotFound):
                await admin.delete(f"{path}/{name}")


async def wait_called(admin: Client, namespace: str) -> None:
    """Until the API server calls the GPUDevice webhook for ``namespace`` (it loads configurations asynchronously)."""
    body = {"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND, "metadata": {"name": "probe"},
            "spec": {"className": "no-such-class-probe", "count": 1}}
    path = resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, namespace=namespace)
    async with asyncio.timeout(30):
        while True:
            try:
                await admin.create(path, body, dry_run=True)
            except errors.ApiError as error:
                if "no-such-class-probe does not exist" in error.message:
                    return
                raise
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def admission(plane: ControlPlane, admin: Client, namespace: str, directory: Path, *,
                    bind_wait: float = 5.0, timeout_seconds: int = 10, raw_names: str = keys.RAW_NAMES_ALLOW,
                    register_hooks: bool = True, extra_routes: Mapping[str, Callable[[web.Request],
                                                                                  Awaitable[web.StreamResponse]]]
                    | None = None) -> AsyncIterator[Served]:
    registry = CollectorRegistry()
    cache = Cache(admin, registry=registry)
    webhooks = AdmissionWebhooks(cache, admin, AdmissionConfig(
        namespace=CONTROLLER_NAMESPACE, bind_wait=bind_wait, timeout=timeout_seconds, raw_names=raw_names),
        registry=registry)
    app = webhook_app()
    webhooks.install(app)
    for path, handler in (extra_routes or {}).items():
        app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context(plane, directory))
    await site.start()
    port = runner.addresses[0][1]
    url = f"https://127.0.0.1:{port}"
    names: list[str] = []
    try:
        async with cache.running():
            await cache.wait_synced(*REQUIRED, timeout=60)
            if cache.is_served(specs.VMIS) or (await _served(admin)):
                await cache.wait_synced(OPTIONAL[0], timeout=60)
            if register_hooks:
                names = await register(admin, plane, url, namespace, timeout_seconds=timeout_seconds)
                await wait_called(admin, namespace)
            yield Served(webhooks, cache, registry, url, names)
    finally:
        await unregister(admin, names)
        await runner.cleanup()


async def _served(admin: Client) -> bool:
    found = await admin.get_or_none("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                    "virtualmachineinstances.kubevirt.io")
    return found is not None


@contextlib.asynccontextmanager
async def with_binder(admin: Client, cache: Cache | None = None) -> AsyncIterator[Binder]:
    """A binder on its pass driver over ``cache`` (its own when None), as the leader runs it."""
    registry = CollectorRegistry()
    own = cache is None
    use = cache if cache is not None else Cache(admin, registry=registry)
    binder = Binder(use, admin, BinderConfig(identity="test-binder"), clock=LoopClock(),
                    metrics=BinderMetrics.on(registry))
    driver = binder_driver(binder, use, registry=registry)
    async with contextlib.AsyncExitStack() as stack:
        if own:
            await stack.enter_async_context(use.running())
        await use.wait_synced(*[s for s in binder.kinds if s.group in ("", keys.GROUP)], timeout=60)
        task = asyncio.create_task(driver.run(), name="test binder")
        try:
            yield binder
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            binder.close()


def vmi_body(name: str, refs: list[dict[str, Any]] | None, *, labelled: bool = True,
             devices: Mapping[str, Any] | None = None, annotation: str | None = None) -> dict[str, Any]:
    import json

    meta: dict[str, Any] = {"name": name}
    if labelled:
        meta["labels"] = {keys.DEVICE_REFS_LABEL: "true"}
    if refs is not None or annotation is not None:
        meta["annotations"] = {keys.DEVICE_REFS_ANNOTATION: annotation if annotation is not None
                               else json.dumps(refs)}
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": meta,
            "spec": {"domain": {"devices": dict(devices or {}), "memory": {"guest": "1Gi"}}}}
