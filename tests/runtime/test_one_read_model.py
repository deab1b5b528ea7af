"""One read model per process: the webhooks and the binder of a controller decide on the same object.

Two live models (one per reader) decoded every event twice and rebuilt twice; a process now keeps one
(``cozygpu.views.readmodel``), and a controller without GPU keeps none that follows the cache.
"""

from __future__ import annotations

import uuid

from cozygpu.kube import Client
from cozygpu.runtime import flags
from cozygpu.runtime.controller import Controller
from cozygpu.views import specs


def options(*extra: str) -> flags.Options:
    return flags.parse(["--namespace", "cozygpu-system", "--identity", f"test-{uuid.uuid4().hex[:6]}", *extra],
                       env={})


async def test_the_webhooks_and_the_binder_of_a_process_read_one_model_subscribed_once() -> None:
    controller = Controller(options("--enable-gpu", "--cert-dir", "/nonexistent"),
                            Client("https://127.0.0.1:9", ssl_context=None))
    assert controller.admission is not None
    model = controller.model
    assert model is not None
    assert controller.binder.model is model
    assert controller.admission.source.model is model
    # The model follows each kind it reads once: one handler of the model's on each such informer, however
    # many readers it has (the binder's works subscribe their own in a term only).
    for spec in (specs.NODES, specs.PODS, specs.TENANT_QUOTAS):
        assert controller.cache.informer(spec).handler_count == 1, spec.key


async def test_a_controller_without_gpu_follows_no_kind_for_a_model() -> None:
    controller = Controller(options(), Client("https://127.0.0.1:9", ssl_context=None))
    assert controller.model is None
    assert controller.admission is None
    for spec in (specs.NODES, specs.PODS):
        assert spec.key not in {informer.key for informer in controller.cache.informers}, spec.key
