"""The cache starts informers as their kinds become served, and refuses reads it cannot answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from cozygpu.cache import Cache, KindNotServed, KindSpec, NotSynced, UnknownKind
from cozygpu.cache.kinds import CRDS, crd_serves
from cozygpu.kube import errors
from cozygpu.views.specs import GPU_DEVICES
from tests.cache.fakes import FakeApi, FakeClock, until

PODS = KindSpec("", "v1", "pods", "Pod", True)
VMIS = KindSpec("kubevirt.io", "v1", "virtualmachineinstances", "VirtualMachineInstance", True)
SETTINGS = KindSpec("", "v1", "configmaps", "ConfigMap", True, namespace="cozy-gpu",
                    field_selector="metadata.name=cozygpu-settings", name="settings")


def crd(spec: KindSpec, *, established: bool = True, versions: tuple[str, ...] | None = None,
        scope: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": spec.crd_name},
        "spec": {"group": spec.group, "scope": scope or ("Namespaced" if spec.namespaced else "Cluster"),
                 "names": {"plural": spec.plural, "kind": spec.kind},
                 "versions": [{"name": v, "served": True, "storage": True, "schema": {}}
                              for v in (versions or (spec.version,))]},
        "status": {"conditions": [{"type": "Established", "status": "True" if established else "False"}]},
    }


def vmi(name: str) -> dict[str, Any]:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": "tenant-a"}}


@pytest.fixture
def core_api(api: FakeApi) -> FakeApi:
    api.discovery["/api/v1"] = {"resources": [{"name": "pods", "namespaced": True},
                                              {"name": "configmaps", "namespaced": True}]}
    return api


@pytest.fixture
async def cache(core_api: FakeApi, clock: FakeClock, registry: CollectorRegistry) -> AsyncIterator[Cache]:
    cache = Cache(core_api, registry=registry, clock=clock)
    cache.add(PODS)
    cache.add(VMIS)
    async with cache.running():
        yield cache


async def test_readiness_needs_no_crd_kind_and_a_kind_whose_crd_appears_later_joins(cache: Cache,
                                                                                    core_api: FakeApi) -> None:
    await until(lambda: cache.has_synced(PODS))
    assert cache.has_synced(PODS), "readiness over the kinds that need no KubeVirt"
    assert not cache.is_served(VMIS)
    with pytest.raises(KindNotServed, match=r"no CustomResourceDefinition virtualmachineinstances\.kubevirt\.io"):
        cache.store(VMIS)

    core_api.put(CRDS.path, crd(VMIS))
    core_api.put(VMIS.path, vmi("vm1"))
    await until(lambda: cache.has_synced(VMIS))
    assert cache.is_served(VMIS)
    assert [o["metadata"]["name"] for o in cache.store(VMIS).list()] == ["vm1"]


async def test_a_kind_whose_crd_goes_is_unserved_until_it_comes_back(cache: Cache, core_api: FakeApi) -> None:
    core_api.put(CRDS.path, crd(VMIS))
    core_api.put(VMIS.path, vmi("vm1"))
    await until(lambda: cache.has_synced(VMIS) and len(core_api.open_watches) == 3)

    core_api.remove(CRDS.path, None, VMIS.crd_name)
    await until(lambda: not cache.is_served(VMIS))
    with pytest.raises(KindNotServed):
        cache.store(VMIS)
    await until(lambda: len(core_api.open_watches) == 2)  # its watch was closed

    core_api.put(CRDS.path, crd(VMIS))
    await until(lambda: cache.has_synced(VMIS))
    assert [o["metadata"]["name"] for o in cache.store(VMIS).list()] == ["vm1"]


@pytest.mark.parametrize(("definition", "reason"), [
    (None, "no CustomResourceDefinition"),
    (crd(VMIS, established=False), "not established"),
    (crd(VMIS, versions=("v1alpha3",)), "does not serve version v1"),
    (crd(VMIS, scope="Cluster"), "has scope Cluster"),
    ({**crd(VMIS), "metadata": {"name": VMIS.crd_name, "deletionTimestamp": "2026-12-01T00:00:00Z"}},
     "being deleted"),
])
def test_a_crd_serves_a_kind_only_when_established_at_its_version_and_scope(definition: dict[str, Any] | None,
                                                                            reason: str) -> None:
    assert reason in (crd_serves(definition, VMIS) or "")
    assert crd_serves(crd(VMIS), VMIS) is None


async def test_a_crd_kind_is_not_synced_rather_than_unserved_until_the_crd_list_is_stored(
        core_api: FakeApi, clock: FakeClock, registry: CollectorRegistry) -> None:
    core_api.fail_lists = [errors.Unavailable("refused")]
    cache = Cache(core_api, registry=registry, clock=clock)
    cache.add(VMIS)
    async with cache.running():
        await until(lambda: len(clock.sleeps) == 1)
        with pytest.raises(NotSynced, match="discovery"):
            cache.store(VMIS)
        clock.advance(clock.sleeps[0])
        await until(lambda: cache.informer(VMIS).served is False)


async def test_a_built_in_kind_missing_from_discovery_is_unserved_and_checked_again(
        api: FakeApi, clock: FakeClock, registry: CollectorRegistry) -> None:
    leases = KindSpec("coordination.k8s.io", "v1", "leases", "Lease", True)
    cache = Cache(api, registry=registry, clock=clock)
    cache.add(leases)
    async with cache.running():
        await until(lambda: cache.informer(leases).served is False)
        with pytest.raises(KindNotServed, match=r"does not serve coordination\.k8s\.io/v1"):
            cache.store(leases)
        api.discovery["/apis/coordination.k8s.io/v1"] = {"resources": [{"name": "leases", "namespaced": True}]}
        clock.advance(max(clock.sleeps))
        await until(lambda: cache.has_synced(leases))


async def test_the_settings_informer_lists_and_watches_only_its_one_object(cache: Cache, core_api: FakeApi) -> None:
    cache.add(SETTINGS)
    await until(lambda: cache.has_synced(SETTINGS))
    await until(lambda: any(path == SETTINGS.path for path, _ in core_api.watch_calls))
    assert SETTINGS.path == "/api/v1/namespaces/cozy-gpu/configmaps"
    for calls in (core_api.list_calls, core_api.watch_calls):
        params = [p for path, p in calls if path == SETTINGS.path]
        assert params
        assert all(p["fieldSelector"] == "metadata.name=cozygpu-settings" for p in params)
    assert cache.store("settings") is cache.store(SETTINGS)


async def test_one_trigger_over_several_kinds_wakes_once_for_a_burst(cache: Cache, core_api: FakeApi) -> None:
    core_api.put(CRDS.path, crd(VMIS))
    await until(lambda: cache.has_synced(PODS, VMIS))
    trigger = cache.trigger(PODS, VMIS)
    for i in range(50):
        core_api.put(PODS.path, {"metadata": {"name": f"p{i}", "namespace": "tenant-a"}})
        core_api.put(VMIS.path, vmi(f"vm{i}"))
    await until(lambda: len(cache.store(PODS)) == 50 and len(cache.store(VMIS)) == 50)
    assert await trigger.wait() == {PODS.key, VMIS.key}
    assert trigger.poll() is None


async def test_a_writer_can_wait_until_the_cache_has_seen_its_write(cache: Cache, core_api: FakeApi) -> None:
    await until(lambda: cache.has_synced(PODS) and len(core_api.open_watches) == 1)
    core_api.put(PODS.path, {"metadata": {"name": "p0", "namespace": "tenant-a"}})
    await until(lambda: len(cache.store(PODS)) == 1)
    coming = str(core_api.rv + 1)  # the resourceVersion the next write will get
    waiter = asyncio.create_task(cache.wait_for_resource_version(PODS, coming, timeout=60))
    with pytest.raises(AssertionError, match="not reached"):
        await until(waiter.done, turns=200)  # the cache has seen p0, not the write still to come

    written = core_api.put(PODS.path, {"metadata": {"name": "p1", "namespace": "tenant-a"}, "spec": {"v": 1}})
    assert written["metadata"]["resourceVersion"] == coming
    store = await waiter
    seen = store.get("tenant-a", "p1")
    assert seen is not None, "the wait returned before the store held the write"
    assert seen["metadata"]["resourceVersion"] == coming
    assert seen["spec"] == {"v": 1}
    assert store is cache.store(PODS)


def test_kinds_are_found_by_spec_or_key_and_an_unknown_key_is_refused(core_api: FakeApi,
                                                                      registry: CollectorRegistry) -> None:
    cache = Cache(core_api, registry=registry)
    with pytest.raises(UnknownKind, match=r"pods\.v1"):
        cache.store("pods.v1")
    with pytest.raises(NotSynced):
        cache.store(PODS)  # a spec is added on first use
    assert cache.informer("pods.v1") is cache.informer(PODS)
    with pytest.raises(ValueError, match="another spec"):
        cache.add(KindSpec("", "v1", "pods", "Pod", True, transform=lambda o: o))


def test_a_spec_with_other_indexes_under_a_registered_key_is_refused(core_api: FakeApi,
                                                                    registry: CollectorRegistry) -> None:
    # A reader asking for devices by node must never get an informer that has no such index.
    cache = Cache(core_api, registry=registry)
    bare = KindSpec(GPU_DEVICES.group, GPU_DEVICES.version, GPU_DEVICES.plural, GPU_DEVICES.kind, True)
    cache.add(bare)
    with pytest.raises(ValueError, match="another spec"):
        cache.add(GPU_DEVICES)
    assert cache.add(bare).spec is bare


async def test_stopping_the_cache_stops_every_informer_and_closes_every_watch(
        core_api: FakeApi, clock: FakeClock, registry: CollectorRegistry) -> None:
    core_api.put(CRDS.path, crd(VMIS))
    cache = Cache(core_api, registry=registry, clock=clock)
    cache.add(PODS)
    cache.add(VMIS)
    async with cache.running():
        await until(lambda: cache.has_synced(PODS, VMIS, CRDS.key) and len(core_api.open_watches) == 3)
        assert [t for t in asyncio.all_tasks() if t.get_name().startswith("cache")]
    assert core_api.open_watches == []
    assert [t for t in asyncio.all_tasks() if t.get_name().startswith("cache")] == []
    with pytest.raises(NotSynced):
        cache.store(PODS)


async def test_metrics_report_sizes_sync_served_state_and_lists(cache: Cache, core_api: FakeApi,
                                                                registry: CollectorRegistry) -> None:
    core_api.put(PODS.path, {"metadata": {"name": "p1", "namespace": "tenant-a"}})
    await until(lambda: cache.has_synced(PODS) and cache.informer(VMIS).served is False)
    await until(lambda: len(cache.store(PODS)) == 1)

    def sample(name: str, kind: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"kind": kind, **labels})

    assert sample("cozygpu_cache_objects", PODS.key) == 1
    assert sample("cozygpu_cache_synced", PODS.key) == 1
    assert sample("cozygpu_cache_served", PODS.key) == 1
    assert sample("cozygpu_cache_served", VMIS.key) == 0
    assert sample("cozygpu_cache_relists_total", PODS.key, reason="initial") == 1
    assert sample("cozygpu_cache_list_seconds_count", PODS.key) == 1
