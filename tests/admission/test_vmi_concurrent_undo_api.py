"""A start's writes run concurrently; when one of them fails, the undo takes back every other one.

A test webhook (``Gate``) stands in the API server's path of the start's
writes: it refuses one of them and holds the others until that refusal was
sent, so the others are in flight when the start learns of the failure and
are applied after it. An undo that forgot a write in flight (one whose answer
came after the failure) leaves a template device or an attachment behind; the
test waits until each held write has been applied before it looks.
No binder runs: the starts fail before they would wait for one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from cozygpu import keys
from cozygpu.cache.store import Event
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, errors
from cozygpu.model.naming import template_device_name
from cozygpu.views import specs
from tests.admission.harness import VALIDATING, VMIS, admission, ca_bundle, scope, unregister, vmi_body
from tests.admission.test_vmi_webhook_api import devices, status, until
from tests.binder.support import VMI_CRD, device_path
from tests.binder.world import World
from tests.support.crds import install_fixture_crd

#: How long the held writes wait after the refusal was sent (ordering only, never asserted).
AFTER_REFUSAL = 0.3
#: A device name the gate always refuses: the test's probe that the API server calls the gate.
PROBE = "gate-probe"
#: How long the refused write waits for the held ones to arrive, and they for it.
ARRIVAL = 8.0


class Gate:
    """Refuses ``refuse``'s write once and holds back the writes of ``held`` until that refusal is out."""

    def __init__(self, *, operation: str, subresource: str, refuse: str, held: set[str]) -> None:
        self.operation, self.subresource = operation, subresource
        self.refuse, self.held = refuse, held
        self.armed = False
        self.arrived: set[str] = set()
        self.concurrent: set[str] = set()
        self._all_arrived = asyncio.Event()
        self._refused = asyncio.Event()

    def ours(self, request: Mapping[str, Any]) -> bool:
        obj = request.get("object") or {}
        if (request.get("operation"), request.get("subResource") or "") != (self.operation, self.subresource):
            return False
        if self.subresource == "status":  # the attachment writes, not the undo's clearing ones
            return ((obj.get("status") or {}).get("attachment") or {}).get("vmi") == "vm"
        return keys.TEMPLATE_DEVICE_LABEL in ((obj.get("metadata") or {}).get("labels") or {})

    async def handler(self, http: web.Request) -> web.Response:
        review = await http.json()
        request = review["request"]
        name = str(request.get("name") or (request.get("object") or {}).get("metadata", {}).get("name"))
        answer: dict[str, Any] = {"uid": request["uid"], "allowed": True}
        if name == PROBE:
            answer = {"uid": request["uid"], "allowed": False,
                      "status": {"code": 403, "message": f"the gate refuses {PROBE}"}}
        elif self.armed and self.ours(request) and name == self.refuse and not self._refused.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_arrived.wait(), ARRIVAL)
            self.concurrent = set(self.arrived)
            self._refused.set()
            answer = {"uid": request["uid"], "allowed": False,
                      "status": {"code": 403, "message": f"the gate refuses {name}"}}
        elif self.armed and self.ours(request) and name in self.held:
            self.arrived.add(name)
            if self.arrived >= self.held:
                self._all_arrived.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._refused.wait(), ARRIVAL)
            await asyncio.sleep(AFTER_REFUSAL)
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "response": answer})


async def register_gate(admin: Client, plane: ControlPlane, url: str, namespace: str, name: str) -> None:
    hook = {"name": "gate.test.example", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Fail", "timeoutSeconds": 15, "namespaceSelector": scope(namespace),
            "clientConfig": {"url": f"{url}/gate", "caBundle": ca_bundle(plane)},
            "rules": [{"apiGroups": [keys.GROUP], "apiVersions": [keys.VERSION], "operations": ["CREATE", "UPDATE"],
                       "resources": [keys.GPUDEVICE_PLURAL, f"{keys.GPUDEVICE_PLURAL}/status"]}]}
    await admin.create(VALIDATING, {"apiVersion": "admissionregistration.k8s.io/v1",
                                    "kind": "ValidatingWebhookConfiguration", "metadata": {"name": name},
                                    "webhooks": [hook]})


@pytest.fixture
async def vmi_kind(admin: Client) -> None:
    await install_fixture_crd(admin, VMI_CRD)


TEMPLATES = [template_device_name("vm", f"t{i}") for i in range(3)]


@pytest.mark.usefixtures("vmi_kind")
@pytest.mark.parametrize("phase", ["template creates", "attachments"])
async def test_one_failing_write_among_concurrent_ones_leaves_nothing_behind(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path, phase: str) -> None:
    held_names = ["h0", "h1", "h2"]
    if phase == "template creates":
        gate = Gate(operation="CREATE", subresource="", refuse=TEMPLATES[1], held={TEMPLATES[0], TEMPLATES[2]})
    else:
        gate = Gate(operation="UPDATE", subresource="status", refuse="h1", held={"h0", "h2", *TEMPLATES})
    world = await World.make(admin, namespace)
    gate_name = f"zz-gate-{world.tag}"
    try:
        await world.node("n1", 8)
        async with admission(plane, admin, namespace, tmp_path, extra_routes={"/gate": gate.handler}) as served:
            for name in held_names:
                await world.order(name, 1, status=world.held("n1"))
            await until(served.cache, lambda: all(status(served.cache, namespace, n).get("phase") == "Bound"
                                                  for n in held_names))
            await register_gate(admin, plane, served.url, namespace, gate_name)
            probe = {"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND, "metadata": {"name": PROBE},
                     "spec": {"className": world.gpu_class, "count": 1}}
            async with asyncio.timeout(30):  # until the API server calls the gate
                while True:
                    try:
                        await admin.create(device_path(namespace), probe, dry_run=True)
                    except errors.ApiError as error:
                        if f"the gate refuses {PROBE}" in error.message:
                            break
                        raise
                    await asyncio.sleep(0.1)
            before = await devices(admin, namespace)

            landed: set[str] = set()

            def record(event: Event) -> None:  # a held write applied by the API server
                name = event.obj["metadata"]["name"]
                attached = ((event.obj.get("status") or {}).get("attachment") or {}).get("vmi") == "vm"
                if name in gate.held and (event.type == "ADDED" if gate.operation == "CREATE" else attached):
                    landed.add(name)

            unsubscribe = served.cache.informer(specs.GPU_DEVICES).subscribe(record)
            try:
                gate.armed = True
                refs: list[dict[str, Any]] = [*({"device": n} for n in held_names),
                        *({"template": f"t{i}", "class": world.gpu_class, "count": 1} for i in range(3))]
                with pytest.raises(errors.ApiError) as caught:
                    await admin.create(VMIS.format(namespace), vmi_body("vm", refs))
                gate.armed = False
                # The held writes were applied (before the answer, or after it if the start forgot them).
                await until(served.cache, lambda: landed >= gate.held)
            finally:
                unsubscribe()

            assert f"the gate refuses {gate.refuse}" in caught.value.message
            assert gate.concurrent == gate.held, "the other writes were not in flight beside the failing one"
            assert gate.arrived == gate.held
            after = await devices(admin, namespace)
            assert set(after) == set(held_names), "a template device of the refused start was left behind"
            for name in held_names:
                assert after[name][1] == before[name][1], f"{name}'s attachment or bind request was left behind"
    finally:
        await unregister(admin, [gate_name])
        await world.cleanup()


