"""The settings ConfigMap publisher against the real API server (R-BIND-10), and its DRA key fed by hand."""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

from prometheus_client import CollectorRegistry

from cozygpu import keys
from cozygpu.cache.cache import Cache
from cozygpu.kube import Client, errors, resource_path
from cozygpu.kube.client import Obj
from cozygpu.runtime import kinds
from cozygpu.runtime.metrics import SettingsMetrics
from cozygpu.runtime.settings import PUBLISH, SettingsPublisher, settings_data
from cozygpu.views import specs
from tests.cache.fakes import FakeApi
from tests.support.crds import FIXTURE_CRDS, install_fixture_crd, uninstall_fixture_crd
from tests.support.waiting import eventually

CLASSES = resource_path(keys.GROUP, keys.VERSION, keys.GPUCLASS_PLURAL)
NODES = resource_path(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL)
KUBEVIRT_CRD = "kubevirts.kubevirt.io"


def settings_path(namespace: str) -> str:
    return resource_path("", "v1", "configmaps", namespace=namespace, name=keys.SETTINGS_CONFIGMAP)


def gpu_class(name: str, resource_name: str) -> Obj:
    return {
        "apiVersion": keys.API_VERSION, "kind": keys.GPUCLASS_KIND, "metadata": {"name": name},
        "spec": {"vendor": "NVIDIA", "model": "H100", "mode": "Passthrough", "memory": "80Gi",
                 "resourceName": resource_name, "source": {"devicePlugin": {}}},
    }


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@asynccontextmanager
async def publishing(client: Any, admin: Client, namespace: str, *, gpu: bool = True,
                     hoster: tuple[str, ...] = ("example.com/hoster-gpu",),
                     metrics: SettingsMetrics | None = None) -> AsyncIterator[SettingsPublisher]:
    cache = Cache(admin, registry=CollectorRegistry())
    for spec in (*kinds.webhook_kinds(enable_gpu=gpu, namespace=namespace), *kinds.lazy_kinds(enable_gpu=gpu)):
        cache.add(spec)
    async with cache.running():
        await cache.wait_synced(*kinds.webhook_kinds(enable_gpu=gpu, namespace=namespace), timeout=30)
        publisher = SettingsPublisher(client, cache, namespace=namespace, hoster_names=hoster,
                                      raw_names=keys.RAW_NAMES_FORBID, gpu_enabled=gpu, resync=300,
                                      metrics=metrics)
        task = asyncio.create_task(publisher.run())
        try:
            yield publisher
        finally:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task


async def settled(admin: Client, namespace: str, accept: Callable[[dict[str, str]], bool],
                  *, timeout: float = 20) -> dict[str, str]:
    async with asyncio.timeout(timeout):
        while True:
            current = await admin.get_or_none(settings_path(namespace))
            data = (current or {}).get("data") or {}
            if accept(data):
                return dict(data)
            await asyncio.sleep(0.1)


def names(data: dict[str, str]) -> list[str]:
    value: list[str] = json.loads(data.get(keys.SETTINGS_RESOURCE_NAMES, "[]"))
    return value


async def test_the_leader_publishes_the_hosters_the_classes_and_the_nodes_names_sorted(
    admin: Client, namespace: str
) -> None:
    class_name, resource_name = unique_name("pub"), f"nvidia.com/CLASS_{uuid.uuid4().hex[:6]}"
    node_name, node_resource = unique_name("node"), f"nvidia.com/NODE_{uuid.uuid4().hex[:6]}"
    await admin.create(CLASSES, gpu_class(class_name, resource_name))
    await admin.create(NODES, {"apiVersion": keys.API_VERSION, "kind": keys.GPUNODE_KIND,
                               "metadata": {"name": node_name}})
    await admin.merge_patch(f"{NODES}/{node_name}/status", {"status": {"resourceNames": [node_resource]}})
    async with publishing(admin, admin, namespace):
        data = await settled(admin, namespace, lambda d: node_resource in names(d))
    assert {"example.com/hoster-gpu", resource_name, node_resource} <= set(names(data))
    assert names(data) == sorted(names(data))
    # The sold DeviceClasses' key is there, a sorted JSON list.
    sold = json.loads(data[keys.SETTINGS_DEVICE_CLASS_NAMES])
    assert sold == sorted(sold)
    assert data[keys.SETTINGS_RAW_NAMES] == "forbid"
    assert data[keys.SETTINGS_GPU_ENABLED] == "true"


async def test_a_new_class_reaches_the_configmap_without_a_resync(admin: Client, namespace: str) -> None:
    async with publishing(admin, admin, namespace):
        await settled(admin, namespace, lambda d: "example.com/hoster-gpu" in names(d))
        resource_name = f"nvidia.com/LATE_{uuid.uuid4().hex[:6]}"
        await admin.create(CLASSES, gpu_class(unique_name("late"), resource_name))
        await settled(admin, namespace, lambda d: resource_name in names(d), timeout=10)


async def test_an_edited_configmap_is_put_back_and_keeps_what_others_added(admin: Client, namespace: str) -> None:
    async with publishing(admin, admin, namespace):
        published = await settled(admin, namespace, lambda d: bool(names(d)))
        current = await admin.get(settings_path(namespace))
        current["data"][keys.SETTINGS_RESOURCE_NAMES] = "[]"
        current["data"]["note"] = "kept"
        current["metadata"].setdefault("labels", {})["team"] = "platform"
        await admin.replace(settings_path(namespace), current)
        await settled(admin, namespace, lambda d: names(d) == names(published) and d.get("note") == "kept",
                      timeout=10)
    assert (await admin.get(settings_path(namespace)))["metadata"]["labels"]["team"] == "platform"


class RacingClient:
    """Forwards to the admin client, but writes the ConfigMap itself just before the publisher's first replace."""

    def __init__(self, admin: Client) -> None:
        self.admin = admin
        self.replaces = 0
        self.conflicts = 0

    async def get_or_none(self, path: str, **kw: Any) -> Obj | None:
        return await self.admin.get_or_none(path, **kw)

    async def create(self, path: str, body: Obj, **kw: Any) -> Obj:
        return await self.admin.create(path, body, **kw)

    async def replace(self, path: str, body: Obj, **kw: Any) -> Obj:
        self.replaces += 1
        if self.replaces == 1:
            await self.admin.merge_patch(path, {"metadata": {"annotations": {"raced": "yes"}}})
        try:
            return await self.admin.replace(path, body, **kw)
        except errors.Conflict:
            self.conflicts += 1
            raise


async def test_a_write_that_raced_another_is_refused_and_redone_from_a_fresh_read(
    admin: Client, namespace: str
) -> None:
    await admin.create(resource_path("", "v1", "configmaps", namespace=namespace), {
        "metadata": {"name": keys.SETTINGS_CONFIGMAP, "namespace": namespace}, "data": {"stale": "yes"}})
    racing = RacingClient(admin)
    async with publishing(racing, admin, namespace):
        data = await settled(admin, namespace, lambda d: keys.SETTINGS_RAW_NAMES in d)
    assert racing.conflicts == 1, "the first replace carried the resourceVersion it read and was refused"
    assert data["stale"] == "yes"
    assert (await admin.get(settings_path(namespace)))["metadata"]["annotations"]["raced"] == "yes"


async def test_the_pass_after_a_write_starts_once_the_cache_has_seen_that_write(
    admin: Client, namespace: str
) -> None:
    registry = CollectorRegistry()
    loop = {"loop": SettingsPublisher.name}

    def sample(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, {**loop, **labels}) or 0.0

    async with publishing(admin, admin, namespace, metrics=SettingsMetrics.on(registry)) as publisher:
        await settled(admin, namespace, lambda d: keys.SETTINGS_RAW_NAMES in d)
        # The write's own watch event asks for the next pass, which first waits for the cache to hold the write.
        async with asyncio.timeout(20):
            while True:
                if sample("cozygpu_passes_total", lane="publish", outcome="ok") >= 2:
                    break
                await asyncio.sleep(0.05)
        assert publisher.driver.unseen_writes == {}
    writes = registry.get_sample_value("cozygpu_settings_writes_total")
    assert writes == 1, "the second pass found the ConfigMap as written"
    assert sample("cozygpu_pass_write_sync_seconds_count") >= 1
    assert sample("cozygpu_pass_write_sync_timeouts_total") == 0


async def test_the_gpu_entries_of_kubevirts_permitted_host_devices_are_published(
    admin: Client, namespace: str
) -> None:
    installed_here = await admin.get_or_none(
        f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{KUBEVIRT_CRD}") is None
    assert KUBEVIRT_CRD in FIXTURE_CRDS
    await install_fixture_crd(admin, KUBEVIRT_CRD)
    try:
        suffix = uuid.uuid4().hex[:6]
        await admin.create(resource_path("kubevirt.io", "v1", "kubevirts", namespace=namespace), {
            "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "metadata": {"name": "kubevirt"},
            "spec": {"configuration": {"permittedHostDevices": {
                "pciHostDevices": [
                    {"pciVendorSelector": "10DE:2330", "resourceName": f"nvidia.com/PCI_{suffix}"},
                    {"pciVendorSelector": "15B3:101E", "resourceName": f"mellanox.com/VF_{suffix}"},
                ],
                "mediatedDevices": [
                    {"mdevNameSelector": "NVIDIA H100-4C", "resourceName": f"nvidia.com/MDEV_{suffix}"},
                ],
            }}},
        })
        async with publishing(admin, admin, namespace):
            data = await settled(admin, namespace, lambda d: f"nvidia.com/MDEV_{suffix}" in names(d))
        assert f"nvidia.com/PCI_{suffix}" in names(data)
        assert f"mellanox.com/VF_{suffix}" not in names(data), "a ConnectX VF is not a GPU"
    finally:
        if installed_here:
            await uninstall_fixture_crd(admin, KUBEVIRT_CRD)


def test_settings_data_is_two_sorted_compact_json_lists_and_two_flags() -> None:
    data = settings_data(resource_names=["b.io/y", "a.io/x", "b.io/y"], raw_names="allow", gpu_enabled=False)
    assert data == {"resourceNames": '["a.io/x","b.io/y"]', "deviceClassNames": "[]", "rawNames": "allow",
                    "gpuEnabled": "false"}
    sold = settings_data(resource_names=[], raw_names="forbid", gpu_enabled=True,
                         device_class_names=["vfio.gpu.nvidia.com", "gpu.amd.com", "vfio.gpu.nvidia.com"])
    assert sold[keys.SETTINGS_DEVICE_CLASS_NAMES] == '["gpu.amd.com","vfio.gpu.nvidia.com"]'


# -- DRA-sourced classes: the DeviceClasses they sell ---------------------------------------
#
# The GPUClass schema still refuses source.dra (docs/dra.md), so no such class
# can be stored by the API server yet: these tests feed the publisher's cache by
# hand, as its informer would, and run its pass without a server.

VFIO = "vfio.gpu.nvidia.com"


def dra_class(name: str, device_class: str, *, selectors: tuple[str, ...] = ("true",)) -> Obj:
    """A class selling devices of ``device_class``; its resourceName is that DeviceClass's extended resource name."""
    return {
        "apiVersion": keys.API_VERSION, "kind": keys.GPUCLASS_KIND, "metadata": {"name": name},
        "spec": {"vendor": "NVIDIA", "model": "H100", "mode": "Passthrough", "memory": "80Gi",
                 "resourceName": f"deviceclass.resource.kubernetes.io/{device_class}",
                 "source": {"dra": {"deviceClassName": device_class,
                                    "selectors": [{"cel": {"expression": e}} for e in selectors]}}},
    }


class MemoryConfigMaps:
    """The settings ConfigMap held in memory (the publisher's ``ConfigMapClient``)."""

    def __init__(self, data: dict[str, str] | None = None) -> None:
        self.obj: Obj | None = None if data is None else {
            "apiVersion": "v1", "kind": "ConfigMap", "data": dict(data),
            "metadata": {"name": keys.SETTINGS_CONFIGMAP, "namespace": "cozy-gpu", "resourceVersion": "1"}}

    async def get_or_none(self, path: str, **kw: Any) -> Obj | None:
        return copy.deepcopy(self.obj)

    async def create(self, path: str, body: Obj, **kw: Any) -> Obj:
        self.obj = copy.deepcopy(body)
        return body

    async def replace(self, path: str, body: Obj, **kw: Any) -> Obj:
        self.obj = copy.deepcopy(body)
        return body


class HandFed:
    """A GPU-off publisher (it reads only GPUClasses) whose cache is fed by hand, as its informer would be."""

    def __init__(self, *classes: Obj, configmaps: MemoryConfigMaps | None = None) -> None:
        self.cache = Cache(FakeApi(), registry=CollectorRegistry())
        self.configmaps = configmaps or MemoryConfigMaps()
        self.publisher = SettingsPublisher(self.configmaps, self.cache, namespace="cozy-gpu", hoster_names=(),
                                           raw_names=keys.RAW_NAMES_FORBID, gpu_enabled=False)
        self._feed = self.cache.informer(specs.GPU_CLASSES).begin_cycle()
        self._feed.replace([self._feed.prepare(obj) for obj in classes], "1")
        self.publisher.trigger.poll()  # what the first list fired

    def modified(self, obj: Obj) -> None:
        self._feed.apply("MODIFIED", self._feed.prepare(obj))

    def deleted(self, obj: Obj) -> None:
        self._feed.apply("DELETED", self._feed.prepare(obj))

    def sold(self) -> list[str]:
        value: list[str] = json.loads(self.publisher.desired()[keys.SETTINGS_DEVICE_CLASS_NAMES])
        return value


async def test_the_device_classes_the_classes_sell_are_published_sorted_once_each() -> None:
    fed = HandFed(dra_class("h100", VFIO), dra_class("h100-numa", VFIO), dra_class("mi300", "gpu.amd.com"),
                  gpu_class("plugin", "nvidia.com/GH100"))
    assert fed.sold() == ["gpu.amd.com", VFIO]
    # Raw use by name: a DRA class's resourceName, the DeviceClass's extended resource name, is a GPU name.
    assert f"deviceclass.resource.kubernetes.io/{VFIO}" in names(fed.publisher.desired())


async def test_a_dra_class_the_model_cannot_read_still_publishes_its_device_class() -> None:
    """As an unreadable class still sells its resource name: dropping it would let raw claims of it through."""
    fed = HandFed(dra_class("broken", VFIO, selectors=("",)))
    assert fed.sold() == [VFIO]
    assert f"deviceclass.resource.kubernetes.io/{VFIO}" in names(fed.publisher.desired())


async def test_a_class_whose_device_class_moves_starts_a_pass_and_its_status_writes_do_not() -> None:
    sold = dra_class("h100", VFIO)
    fed = HandFed(sold)
    trigger = fed.publisher.trigger

    reported = {**sold, "status": {"units": 4, "free": 3, "held": 1}}
    fed.modified(reported)
    assert not trigger.is_set(), "a status write that keeps the names started a pass"

    moved = copy.deepcopy(reported)
    moved["spec"]["source"]["dra"]["deviceClassName"] = "gpu.example.com"
    fed.modified(moved)
    assert trigger.poll(), "a class selling another DeviceClass started no pass"
    assert fed.sold() == ["gpu.example.com"]

    fed.deleted(moved)
    assert trigger.poll(), "a deleted class started no pass"
    assert fed.sold() == []


async def test_a_configmap_that_lacks_only_the_device_class_names_is_written_once() -> None:
    """An older controller's ConfigMap holds the three other keys as they should be: a pass writes the fourth,
    keeping the rest, and the next pass writes nothing."""
    current = settings_data(resource_names=[f"deviceclass.resource.kubernetes.io/{VFIO}"],
                            raw_names=keys.RAW_NAMES_FORBID, gpu_enabled=False)
    del current[keys.SETTINGS_DEVICE_CLASS_NAMES]
    fed = HandFed(dra_class("h100", VFIO), configmaps=MemoryConfigMaps({**current, "note": "kept"}))

    write = fed.publisher.plan(await fed.publisher.snapshot(PUBLISH))
    assert write is not None
    assert not write.create
    assert write.body["data"] == {**current, "note": "kept", keys.SETTINGS_DEVICE_CLASS_NAMES: f'["{VFIO}"]'}
    assert write.body["metadata"]["resourceVersion"] == "1", "the replace carries the resourceVersion read"

    await fed.configmaps.replace("", write.body)
    assert fed.publisher.plan(await fed.publisher.snapshot(PUBLISH)) is None


class CountingClient(RacingClient):
    """Forwards to the admin client and counts the publisher's reads of the ConfigMap."""

    def __init__(self, admin: Client) -> None:
        super().__init__(admin)
        self.replaces = 2  # no race of RacingClient's
        self.reads = 0

    async def get_or_none(self, path: str, **kw: Any) -> Obj | None:
        self.reads += 1
        return await self.admin.get_or_none(path, **kw)


async def test_a_pass_that_finds_the_cached_configmap_as_it_should_be_reads_nothing(
    admin: Client, namespace: str
) -> None:
    registry = CollectorRegistry()

    def passes() -> float:
        return registry.get_sample_value(
            "cozygpu_passes_total", {"loop": SettingsPublisher.name, "lane": "publish", "outcome": "ok"}) or 0.0

    async def passed(count: float) -> bool:
        return passes() >= count

    node_name = unique_name("beat")
    await admin.create(NODES, {"apiVersion": keys.API_VERSION, "kind": keys.GPUNODE_KIND,
                               "metadata": {"name": node_name}})
    counting = CountingClient(admin)
    try:
        async with publishing(counting, admin, namespace, metrics=SettingsMetrics.on(registry)):
            await settled(admin, namespace, lambda d: keys.SETTINGS_RAW_NAMES in d)
            await eventually(lambda: passed(2), what="the pass after the publisher's own write")
            reads, before = counting.reads, passes()
            for beat in range(5):  # someone labels the ConfigMap: each one a pass with nothing to write
                await admin.merge_patch(settings_path(namespace), {"metadata": {"labels": {"beat": str(beat)}}})
                wanted = before + beat + 1
                await eventually(lambda: passed(wanted), what=f"the pass after label {beat}")  # noqa: B023
            assert counting.reads == reads, "a pass with nothing to write read the ConfigMap from the API"

            current = await admin.get(settings_path(namespace))  # someone edits it: read fresh, then put back
            current["data"][keys.SETTINGS_RAW_NAMES] = "allow"
            await admin.replace(settings_path(namespace), current)
            await settled(admin, namespace, lambda d: d.get(keys.SETTINGS_RAW_NAMES) == "forbid", timeout=10)
            assert counting.reads > reads
    finally:
        await admin.delete(f"{NODES}/{node_name}")


async def test_reports_and_status_writes_that_keep_the_names_start_no_pass(admin: Client, namespace: str) -> None:
    """The agents' reports and the binder's status writes keep every name: only a names change is a reason.

    The publisher is built but not run, so nothing takes its trigger but this test."""
    node_name, class_name = unique_name("quiet"), unique_name("quiet")
    await admin.create(NODES, {"apiVersion": keys.API_VERSION, "kind": keys.GPUNODE_KIND,
                               "metadata": {"name": node_name}})
    await admin.create(CLASSES, gpu_class(class_name, f"nvidia.com/QUIET_{uuid.uuid4().hex[:6]}"))
    cache = Cache(admin, registry=CollectorRegistry())
    for spec in (*kinds.webhook_kinds(enable_gpu=True, namespace=namespace), *kinds.lazy_kinds(enable_gpu=True)):
        cache.add(spec)
    try:
        async with cache.running():
            await cache.wait_synced(*kinds.webhook_kinds(enable_gpu=True, namespace=namespace), timeout=30)
            publisher = SettingsPublisher(admin, cache, namespace=namespace, hoster_names=(),
                                          raw_names=keys.RAW_NAMES_FORBID, gpu_enabled=True)
            publisher.trigger.poll()  # what the first lists fired
            for spec, path, body in ((specs.GPU_NODES, f"{NODES}/{node_name}/status",
                                      {"status": {"agent": {"lastReport": "2026-12-03T12:00:00Z"}}}),
                                     (specs.GPU_CLASSES, f"{CLASSES}/{class_name}/status",
                                      {"status": {"units": 0, "free": 0, "held": 0}})):
                written = await admin.merge_patch(path, body)
                assert written["status"], f"{path}: the status write was pruned to nothing"
                await cache.wait_for_resource_version(spec.key, written["metadata"]["resourceVersion"], timeout=30)
                assert not publisher.trigger.is_set(), f"{path}: a write that keeps the names started a pass"
            named = await admin.merge_patch(f"{NODES}/{node_name}/status",
                                            {"status": {"resourceNames": ["nvidia.com/NEW"]}})
            await cache.wait_for_resource_version(specs.GPU_NODES.key, named["metadata"]["resourceVersion"],
                                                  timeout=30)
            assert publisher.trigger.is_set(), "a GPUNode's new resource name started no pass"
    finally:
        await admin.delete(f"{NODES}/{node_name}")
        await admin.delete(f"{CLASSES}/{class_name}")


async def test_a_gpunode_that_reports_a_new_name_has_it_published_and_a_deleted_one_takes_its_away(
        admin: Client, namespace: str) -> None:
    """The names come from the GPUNodes' events while the term runs (no pass decodes every GPUNode)."""
    node_name, first, second = unique_name("grow"), f"nvidia.com/A_{uuid.uuid4().hex[:6]}", \
        f"nvidia.com/B_{uuid.uuid4().hex[:6]}"
    await admin.create(NODES, {"apiVersion": keys.API_VERSION, "kind": keys.GPUNODE_KIND,
                               "metadata": {"name": node_name}})
    await admin.merge_patch(f"{NODES}/{node_name}/status", {"status": {"resourceNames": [first]}})
    try:
        async with publishing(admin, admin, namespace):
            await settled(admin, namespace, lambda d: first in names(d))
            await admin.merge_patch(f"{NODES}/{node_name}/status", {"status": {"resourceNames": [second]}})
            data = await settled(admin, namespace, lambda d: second in names(d))
            assert first not in names(data), "the name the node no longer reports is still published"
            await admin.delete(f"{NODES}/{node_name}")
            await settled(admin, namespace, lambda d: second not in names(d))
    finally:
        with suppress(errors.NotFound):
            await admin.delete(f"{NODES}/{node_name}")
