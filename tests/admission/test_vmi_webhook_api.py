"""The VMI webhook called by the real API server, with a binder answering its bind requests (R-ADM-2, R-ADM-3)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from cozygpu import keys
from cozygpu.api import meta
from cozygpu.cache.cache import Cache
from cozygpu.cache.store import Event
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, errors
from cozygpu.model.naming import template_device_name
from cozygpu.views import specs
from tests.admission.harness import (
    MUTATING,
    VMIS,
    admission,
    ca_bundle,
    scope,
    unregister,
    vmi_body,
    with_binder,
)
from tests.binder.support import VMI_CRD, device_path
from tests.binder.world import World
from tests.support.crds import install_fixture_crd


async def until(cache: Cache, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    trigger = cache.trigger(specs.GPU_DEVICES, name="test")
    try:
        async with asyncio.timeout(timeout):
            while not predicate():
                await trigger.wait()
    finally:
        cache.informer(specs.GPU_DEVICES).remove_trigger(trigger)


def status(cache: Cache, namespace: str, name: str) -> dict[str, Any]:
    obj = cache.store(specs.GPU_DEVICES).get(namespace, name)
    return dict((obj.get("status") if obj is not None else None) or {})


async def devices(admin: Client, namespace: str) -> dict[str, tuple[str, Any]]:
    """Every GPUDevice of the namespace: name -> (resourceVersion, status)."""
    listed = await admin.list_objects(device_path(namespace))
    return {d["metadata"]["name"]: (d["metadata"]["resourceVersion"], d.get("status")) for d in listed["items"]}


async def held(admin: Client, cache: Cache, world: World, name: str, count: int = 1) -> None:
    await world.order(name, count)
    await until(cache, lambda: status(cache, world.namespace, name).get("phase") == "Bound")


def gpus(vmi: dict[str, Any]) -> list[dict[str, Any]]:
    return list(vmi["spec"]["domain"]["devices"].get("gpus") or [])


@pytest.fixture
async def vmi_kind(admin: Client) -> None:
    await install_fixture_crd(admin, VMI_CRD)


@pytest.mark.usefixtures("vmi_kind")
async def test_a_start_creates_its_template_device_attaches_the_set_and_gets_one_gpus_entry_per_gpu(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    world = await World.make(admin, namespace)
    try:
        await world.node("n1", 4)
        async with admission(plane, admin, namespace, tmp_path) as served, with_binder(admin, served.cache):
            await held(admin, served.cache, world, "mine", 1)
            refs: list[dict[str, Any]] = [{"device": "mine"}, {"template": "extra", "class": world.gpu_class,
                                                               "count": 2}]
            made = await admin.create(VMIS.format(namespace), vmi_body("vm", refs))
            assert gpus(made) == [{"name": f"cozygpu-gpu{i}", "deviceName": world.resource} for i in range(3)]
            assert "resources" not in made["spec"]["domain"]
            template = await world.device(template_device_name("vm", "extra"))
            assert template["metadata"]["labels"][keys.TEMPLATE_DEVICE_LABEL] == "true"
            assert "ownerReferences" not in template["metadata"]
            for device in (template, await world.device("mine")):
                assert device["status"]["attachment"]["vmi"] == "vm"
                assert (device["status"]["phase"], device["status"]["nodeName"]) == ("Bound", world.node_name("n1"))
                assert device["status"]["bindAnswer"]["id"] == device["status"]["bindRequest"]["id"]
    finally:
        await world.cleanup()


@pytest.mark.usefixtures("vmi_kind")
async def test_a_refused_start_and_a_dry_run_leave_no_trace(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    world = await World.make(admin, namespace)
    try:
        await world.node("n1", 2)
        # A hold released after sitting idle (R-LEDGER-2): a start naming it is told so, not that it does not exist.
        await world.order("expired", 1, status={"phase": "Released"})
        async with admission(plane, admin, namespace, tmp_path) as served, with_binder(admin, served.cache):
            await held(admin, served.cache, world, "mine", 1)
            await held(admin, served.cache, world, "theirs", 1)
            other = await admin.create(VMIS.format(namespace), vmi_body("other", [{"device": "theirs"}]))
            assert len(gpus(other)) == 1
            # The binder records the VMI's UID on the attachment once the VMI exists: a write of its own.
            await until(served.cache, lambda: bool(status(served.cache, namespace, "theirs")
                                                   .get("attachment", {}).get("uid")))
            # The binder's finalizer on it: nothing more writes it below.
            await until(served.cache, lambda: keys.DEVICE_FINALIZER in meta.finalizers(
                served.cache.store(specs.GPU_DEVICES).get(namespace, "expired")))
            before = await devices(admin, namespace)
            cases: dict[str, list[dict[str, Any]]] = {
                "GPUDevice {ns}/nope does not exist": [{"device": "mine"}, {"device": "nope"}],
                f"GPUDevice {{ns}}/expired was released after sitting idle past class {world.gpu_class}'s "
                "idleHoldLimit and holds no GPUs": [{"device": "expired"}],
                "is attached to VMI {ns}/other": [{"device": "theirs"}],
                "0 units free in the cluster, order of 1 exceeds it by 1": [
                    {"device": "mine"}, {"template": "more", "class": world.gpu_class, "count": 1}],
                "entry 1: count must be a whole number of at least 1": [
                    {"device": "mine"}, {"template": "t", "class": world.gpu_class, "count": 0}],
            }
            for expected, refs in cases.items():
                with pytest.raises(errors.ApiError) as caught:
                    await admin.create(VMIS.format(namespace), vmi_body("vm", refs))
                assert expected.format(ns=namespace) in caught.value.message
            with pytest.raises(errors.ApiError) as caught:
                await admin.create(VMIS.format(namespace), vmi_body("vm", None, annotation="[{\"device\": 7}]"))
            assert "entry 0: 'device' must be a non-empty string, not 7" in caught.value.message
            dry = await admin.create(VMIS.format(namespace), vmi_body("dry", [{"device": "mine"}]), dry_run=True)
            assert gpus(dry) == [{"name": "cozygpu-gpu0", "deviceName": world.resource}]
            assert await devices(admin, namespace) == before
            assert await admin.get_or_none(f"{VMIS.format(namespace)}/dry") is None
    finally:
        await world.cleanup()


@pytest.mark.usefixtures("vmi_kind")
async def test_two_vmis_racing_for_one_held_device_exactly_one_starts(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    world = await World.make(admin, namespace)
    try:
        await world.node("n1", 2)
        async with admission(plane, admin, namespace, tmp_path) as served, with_binder(admin, served.cache):
            await held(admin, served.cache, world, "one", 1)
            results = await asyncio.gather(
                *(admin.create(VMIS.format(namespace), vmi_body(f"vm{i}", [{"device": "one"}])) for i in range(2)),
                return_exceptions=True)
            started = [r for r in results if isinstance(r, dict)]
            refused = [r for r in results if isinstance(r, errors.ApiError)]
            assert (len(started), len(refused)) == (1, 1), results
            device = await world.device("one")
            assert device["status"]["attachment"]["vmi"] == started[0]["metadata"]["name"]
    finally:
        await world.cleanup()


@pytest.mark.usefixtures("vmi_kind")
async def test_with_no_binder_a_start_is_refused_within_the_bind_wait_and_every_write_undone(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    world = await World.make(admin, namespace)
    try:
        await world.node("n1", 4)
        async with admission(plane, admin, namespace, tmp_path, bind_wait=2) as served:
            await world.order("mine", 1, status=world.held("n1"))
            await until(served.cache, lambda: status(served.cache, namespace, "mine").get("phase") == "Bound")
            before = await devices(admin, namespace)
            refs: list[dict[str, Any]] = [{"device": "mine"}, {"template": "extra", "class": world.gpu_class,
                                                               "count": 1}]
            start = asyncio.create_task(admin.create(VMIS.format(namespace), vmi_body("vm", refs)))
            extra = template_device_name("vm", "extra")
            await until(served.cache, lambda: bool(status(served.cache, namespace, extra).get("bindRequest")))
            made: Mapping[str, Any] = served.cache.store(specs.GPU_DEVICES).get(namespace, extra) or {}
            assert keys.DEVICE_FINALIZER in made["metadata"].get("finalizers", ()), "created with its finalizer"
            with pytest.raises(errors.ApiError) as caught:
                await start
            assert "no answer from the binder within 2 s" in caught.value.message
            assert "no replica holds Lease" in caught.value.message or "Lease" in caught.value.message
            after = await devices(admin, namespace)
            assert set(after) == {"mine"}  # the template device is deleted again
            assert after["mine"][1] == before["mine"][1]  # attachment and request cleared
    finally:
        await world.cleanup()


def _touch(request_counter: list[int]) -> Callable[[web.Request], Any]:
    async def handler(http: web.Request) -> web.Response:
        review = await http.json()
        request_counter.append(1)
        labels = review["request"]["object"]["metadata"].get("labels")
        patch = [{"op": "add", "path": "/metadata/labels/touched", "value": "yes"} if labels else
                 {"op": "add", "path": "/metadata/labels", "value": {"touched": "yes"}}]
        response = {"uid": review["request"]["uid"], "allowed": True, "patchType": "JSONPatch",
                    "patch": base64.b64encode(orjson.dumps(patch)).decode()}
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "response": response})

    return handler


@pytest.mark.usefixtures("vmi_kind")
async def test_a_reinvocation_takes_the_answered_request_as_its_own_and_writes_nothing_twice(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    world = await World.make(admin, namespace)
    touched: list[int] = []
    names = []
    try:
        await world.node("n1", 4)
        async with admission(plane, admin, namespace, tmp_path, extra_routes={"/touch": _touch(touched)}) as served, \
                with_binder(admin, served.cache):
            # A later mutating webhook (virt-api's stand-in) changes the VMI after ours: ours is called again.
            hook = {"name": "touch.test.example", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                    "failurePolicy": "Fail", "namespaceSelector": scope(namespace),
                    "clientConfig": {"url": f"{served.url}/touch", "caBundle": ca_bundle(plane)},
                    "rules": [{"apiGroups": ["kubevirt.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
                               "resources": ["virtualmachineinstances"]}]}
            names.append(f"zz-touch-{world.tag}")
            await admin.create(MUTATING, {"apiVersion": "admissionregistration.k8s.io/v1",
                                          "kind": "MutatingWebhookConfiguration", "metadata": {"name": names[0]},
                                          "webhooks": [hook]})
            writes: list[tuple[str, str]] = []

            def record(event: Event) -> None:
                request = ((event.obj.get("status") or {}).get("bindRequest") or {}).get("id")
                before = event.old.get("status") if event.old is not None else None
                old = ((before or {}).get("bindRequest") or {}).get("id")
                if event.type == "ADDED" or (request and request != old):
                    writes.append((event.type, str(request)))

            unsubscribe = served.cache.informer(specs.GPU_DEVICES).subscribe(record)
            try:
                async with asyncio.timeout(30):
                    while True:  # until the API server has loaded the touch hook
                        probe = await admin.create(VMIS.format(namespace), vmi_body("probe", None, labelled=False),
                                                   dry_run=True)
                        if (probe["metadata"].get("labels") or {}).get("touched"):
                            break
                        await asyncio.sleep(0.1)
                calls = served.answers("vmi", "allowed")
                refs = [{"template": "t", "class": world.gpu_class, "count": 1}]
                made = await admin.create(VMIS.format(namespace), vmi_body("vm", refs))
                await until(served.cache, lambda: bool(writes))
            finally:
                unsubscribe()
            assert made["metadata"]["labels"]["touched"] == "yes"
            assert len(gpus(made)) == 1
            assert served.answers("vmi", "allowed") - calls == 2  # called twice, answered twice
            name = template_device_name("vm", "t")
            assert [w[0] for w in writes if w[0] == "ADDED"] == ["ADDED"]
            assert len({w[1] for w in writes if w[1] != "None"}) == 1, writes
            assert (await world.device(name))["status"]["attachment"]["vmi"] == "vm"
    finally:
        await unregister(admin, names)
        await world.cleanup()


@pytest.mark.usefixtures("vmi_kind")
async def test_with_raw_names_forbidden_a_vmis_own_gpu_entry_beside_its_references_is_refused(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    world = await World.make(admin, namespace)
    try:
        await world.node("n1", 4)
        async with admission(plane, admin, namespace, tmp_path, raw_names=keys.RAW_NAMES_FORBID) as served, \
                with_binder(admin, served.cache):
            await held(admin, served.cache, world, "mine", 1)
            own = {"hostDevices": [{"name": "raw", "deviceName": world.resource}],
                   "interfaces": [{"name": "vf", "sriov": {}}]}
            with pytest.raises(errors.ApiError) as caught:
                await admin.create(VMIS.format(namespace), vmi_body("vm", [{"device": "mine"}], devices=own))
            assert f"hostDevices entry 'raw' ({world.resource})" in caught.value.message
            nic = {"hostDevices": [{"name": "vf", "deviceName": "mellanox.com/MT2892_VF"}]}
            made = await admin.create(VMIS.format(namespace), vmi_body("vm", [{"device": "mine"}], devices=nic))
            assert [e["deviceName"] for e in gpus(made)] == [world.resource]
    finally:
        await world.cleanup()


@pytest.mark.usefixtures("vmi_kind")
async def test_with_the_webhook_unreachable_a_labelled_start_is_refused_and_other_vmis_and_orders_are_not(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    from cozygpu.admission.webhooks import configurations
    from cozygpu.devcluster.plane import free_port

    _validating, mutating = configurations(f"https://127.0.0.1:{free_port()}", ca_bundle(plane),
                                           timeout_seconds=5, namespace_selector=scope(namespace),
                                           name=f"cozygpu-down-{namespace}")
    await admin.create(MUTATING, mutating)
    try:
        message = ""
        async with asyncio.timeout(30):
            while not message:  # until the API server has loaded it
                try:
                    await admin.create(VMIS.format(namespace), vmi_body("vm", [{"device": "x"}]), dry_run=True)
                except errors.ApiError as error:
                    message = error.message
                await asyncio.sleep(0.1)
        assert "failed calling webhook" in message
        plain = await admin.create(VMIS.format(namespace), vmi_body("plain", None, labelled=False))
        assert plain["metadata"]["name"] == "plain"
        assert await admin.get_or_none(f"{VMIS.format(namespace)}/vm") is None
        # The finalizer hook is down too, and fails open: an order is admitted, without the finalizer (the
        # binder's finalizer work adds it).
        order = await admin.create(device_path(namespace), {
            "apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND, "metadata": {"name": "order"},
            "spec": {"className": "any", "count": 1}})
        assert keys.DEVICE_FINALIZER not in order["metadata"].get("finalizers", ())
    finally:
        await unregister(admin, [f"cozygpu-down-{namespace}"])

