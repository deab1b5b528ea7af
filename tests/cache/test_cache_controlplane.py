"""The cache against the real API server: cut connections, a real 410, a CRD that arrives late.

Every test reads through its own ``Cache`` over kinds scoped to a fresh
namespace (or a CRD made for the test), so nothing another test writes can
change what is compared. Waiting is on the cache's own triggers under a
timeout, never a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import pytest
from prometheus_client import CollectorRegistry

from cozygpu import keys
from cozygpu.cache import Cache, Event, KindNotServed, KindSpec, ReflectorSettings
from cozygpu.cache.transforms import slim_pod
from cozygpu.devcluster.plane import ADMIN_GROUPS, ADMIN_USER, ControlPlane
from cozygpu.kube import Client, errors, resource_path
from cozygpu.views import specs as known
from tests.cache import shapes
from tests.support.proxy import Proxy

#: Short backoffs, so reconnects in a test take tenths of a second.
FAST = ReflectorSettings(backoff_initial=0.1, backoff_cap=1.0, gone_backoff_initial=0.05, page_size=7)
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"

State = dict[str, str]


def configmaps(namespace: str) -> KindSpec:
    return KindSpec("", "v1", "configmaps", "ConfigMap", True, namespace=namespace)


async def server_state(admin: Client, spec: KindSpec) -> State:
    """name -> resourceVersion, as a consistent list from the API server says."""
    answer = await admin.list_objects(spec.path, params=spec.selector_params())
    return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in answer["items"]}


def cached_state(cache: Cache, spec: KindSpec) -> State | None:
    informer = cache.informer(spec)
    if not informer.has_synced:
        return None
    return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in informer.store.list()}


async def converge(cache: Cache, spec: KindSpec, expected: State, *, timeout: float = 30.0) -> None:
    """Wait, on the informer's trigger, until the store holds exactly ``expected``."""
    trigger = cache.trigger(spec, name="test")
    try:
        async with asyncio.timeout(timeout):
            while cached_state(cache, spec) != expected:
                await trigger.wait()
    except TimeoutError:
        raise AssertionError(f"cache {cached_state(cache, spec)} never became {expected}") from None
    finally:
        cache.informer(spec).remove_trigger(trigger)


async def wait_for(cache: Cache, spec: KindSpec, predicate: Callable[[], bool], *, timeout: float = 30.0) -> None:
    trigger = cache.trigger(spec, name="test")
    try:
        async with asyncio.timeout(timeout):
            while not predicate():
                await trigger.wait()
    finally:
        cache.informer(spec).remove_trigger(trigger)


class Replay:
    """Rebuilds a kind from the events handlers saw, refusing any event that contradicts the ones before."""

    def __init__(self) -> None:
        self.state: State = {}
        self.events: list[tuple[str, str]] = []

    def __call__(self, event: Event) -> None:
        name = event.obj["metadata"]["name"]
        self.events.append((event.type, name))
        if event.type == "ADDED":
            assert name not in self.state, f"ADDED twice: {name}"
        else:
            assert name in self.state, f"{event.type} of an object never added: {name}"
        if event.type == "DELETED":
            del self.state[name]
        else:
            self.state[name] = event.obj["metadata"]["resourceVersion"]


@pytest.fixture
async def proxy(plane: ControlPlane) -> AsyncIterator[Proxy]:
    async with Proxy(plane.host, plane.ssl_context(plane.identity(ADMIN_USER, ADMIN_GROUPS))) as proxy:
        yield proxy


@pytest.fixture
async def through_proxy(proxy: Proxy) -> AsyncIterator[Client]:
    async with Client(proxy.url, ssl_context=None, default_timeout=10.0) as client:
        yield client


def crd_body(group: str, plural: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
    }


async def create_when_served(admin: Client, path: str, body: dict[str, Any], *, timeout: float = 30.0) -> None:
    """Create ``body``; a CRD's endpoint answers 404 for a moment after it is Established."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                await admin.create(path, body)
                return
            except errors.NotFound:
                await asyncio.sleep(0.1)  # polling the server, not waiting for the code under test


async def fresh_crd_kind(admin: Client, namespace: str, kind: str) -> KindSpec:
    """A kind no one has seen before: its own CRD, created now, so its watch cache starts now."""
    group = f"g{uuid.uuid4().hex[:8]}.cache.test"
    plural = kind.lower() + "s"
    await admin.create(CRD_PATH, crd_body(group, plural, kind))
    return KindSpec(group, "v1", plural, kind, True, namespace=namespace)


async def patch_if_there(admin: Client, path: str, patch: dict[str, Any]) -> None:
    with contextlib.suppress(errors.NotFound):
        await admin.merge_patch(path, patch)


async def test_an_informer_whose_watch_connections_are_cut_ends_with_exactly_the_servers_objects(
        admin: Client, namespace: str, proxy: Proxy, through_proxy: Client) -> None:
    spec = configmaps(namespace)
    for i in range(20):
        await admin.create(spec.path, {"metadata": {"name": f"cm-{i}"}, "data": {"v": "0"}})
    registry = CollectorRegistry()
    cache = Cache(through_proxy, registry=registry, settings=FAST)
    replay = Replay()
    cache.add(spec).subscribe(replay)
    serial = 20
    async with cache.running():
        await cache.wait_synced(spec, timeout=30)
        for round_ in range(3):
            for i in range(0, 20, 4):
                await patch_if_there(admin, f"{spec.path}/cm-{i}", {"data": {"v": f"{round_}"}})
            await converge(cache, spec, await server_state(admin, spec))  # so its watch is open again
            assert proxy.cut() >= 1, "the informer had a watch open"
            for i in range(round_, 20, 6):  # while it reconnects
                with contextlib.suppress(errors.NotFound):
                    await admin.delete(f"{spec.path}/cm-{i}")
            await admin.create(spec.path, {"metadata": {"name": f"cm-{serial}"}})
            serial += 1
            await proxy.block()  # reconnects refused for a while
            for i in range(1, 20, 5):
                await patch_if_there(admin, f"{spec.path}/cm-{i}", {"data": {"v": f"blocked-{round_}"}})
            await admin.create(spec.path, {"metadata": {"name": f"cm-{serial}"}})
            serial += 1
            await proxy.unblock()
        expected = await server_state(admin, spec)
        await converge(cache, spec, expected)
        assert replay.state == expected
    restarts = registry.get_sample_value("cozygpu_cache_watch_restarts_total", {"kind": spec.key, "reason": "error"})
    assert restarts is not None
    assert restarts >= 3
    assert len(proxy.lists(spec.path)) == 1, "a cut connection is resumed from the last resourceVersion, not relisted"


async def test_a_watch_answered_with_410_relists_without_lost_or_phantom_objects(
        admin: Client, namespace: str, proxy: Proxy, through_proxy: Client) -> None:
    spec = await fresh_crd_kind(admin, namespace, "Widget")
    for i in range(10):
        await create_when_served(admin, spec.path, {"apiVersion": spec.api_version, "kind": "Widget",
                                                    "metadata": {"name": f"w-{i}"}, "spec": {"n": i}})
    registry = CollectorRegistry()
    cache = Cache(through_proxy, registry=registry, settings=FAST)
    replay = Replay()
    cache.add(spec).subscribe(replay)
    async with cache.running():
        await cache.wait_synced(spec, timeout=60)
        await proxy.block()
        for i in range(3):
            await admin.delete(f"{spec.path}/w-{i}")
        for i in range(3, 6):
            await admin.merge_patch(f"{spec.path}/w-{i}", {"spec": {"n": 100 + i}})
        for i in range(10, 13):
            await admin.create(spec.path, {"apiVersion": spec.api_version, "kind": "Widget",
                                           "metadata": {"name": f"w-{i}"}})
        replay.events.clear()
        proxy.expire_next_watches(spec.path)  # the API server itself answers the resumed watch with 410
        await proxy.unblock()
        expected = await server_state(admin, spec)
        await converge(cache, spec, expected)
        assert replay.state == expected
    relists = registry.get_sample_value("cozygpu_cache_relists_total", {"kind": spec.key, "reason": "expired"})
    assert relists == 1
    assert len(proxy.lists(spec.path)) == 2
    assert sorted(replay.events) == sorted(
        [("DELETED", f"w-{i}") for i in range(3)] + [("MODIFIED", f"w-{i}") for i in range(3, 6)]
        + [("ADDED", f"w-{i}") for i in range(10, 13)]
    ), "the relist reports exactly what changed while the watch was gone"
    await admin.delete(f"{CRD_PATH}/{spec.crd_name}")


async def test_a_crd_installed_after_start_joins_the_cache_and_readiness_never_waited_for_it(
        plane: ControlPlane, admin: Client, namespace: str) -> None:
    group = f"g{uuid.uuid4().hex[:8]}.cache.test"
    gizmos = KindSpec(group, "v1", "gizmos", "Gizmo", True, namespace=namespace)
    ready_kinds = [configmaps(namespace), known.GPU_CLASSES]
    async with plane.client() as client:
        cache = Cache(client, registry=CollectorRegistry(), settings=FAST)
        for spec in (*ready_kinds, gizmos):
            cache.add(spec)
        async with cache.running():
            await cache.wait_synced(*ready_kinds, timeout=30)
            await wait_for(cache, gizmos, lambda: cache.informer(gizmos).served is False)
            assert cache.has_synced(*ready_kinds), "ready while the gizmo kind does not exist"
            with pytest.raises(KindNotServed, match=gizmos.crd_name.replace(".", r"\.")):
                cache.store(gizmos)

            await admin.create(CRD_PATH, crd_body(group, "gizmos", "Gizmo"))
            await create_when_served(admin, gizmos.path, {"apiVersion": gizmos.api_version, "kind": "Gizmo",
                                                          "metadata": {"name": "g1"}})
            await cache.wait_synced(gizmos, timeout=60)
            await converge(cache, gizmos, await server_state(admin, gizmos))
            assert cache.is_served(gizmos)
            assert cache.has_synced(*ready_kinds)

            await admin.delete(f"{CRD_PATH}/{gizmos.crd_name}")
            await wait_for(cache, gizmos, lambda: not cache.is_served(gizmos))
            with pytest.raises(KindNotServed):
                cache.store(gizmos)


async def test_the_settings_cache_holds_only_the_settings_configmap(plane: ControlPlane, admin: Client,
                                                                    namespace: str) -> None:
    spec = known.settings_configmap(namespace)
    path = configmaps(namespace).path
    await admin.create(path, {"metadata": {"name": "other"}, "data": {"x": "1"}})
    async with plane.client() as client:
        cache = Cache(client, registry=CollectorRegistry(), settings=FAST)
        cache.add(spec)
        async with cache.running():
            await cache.wait_synced(spec, timeout=30)
            assert cache.store(spec).list() == []
            written = await admin.create(path, {"metadata": {"name": keys.SETTINGS_CONFIGMAP},
                                                "data": {keys.SETTINGS_RAW_NAMES: keys.RAW_NAMES_FORBID}})
            await admin.create(path, {"metadata": {"name": "another"}})
            store = await cache.wait_for_resource_version(spec, written["metadata"]["resourceVersion"], timeout=30)
            settings = store.get(namespace, keys.SETTINGS_CONFIGMAP)
            assert settings is not None
            assert settings["data"] == {keys.SETTINGS_RAW_NAMES: keys.RAW_NAMES_FORBID}
            assert [o["metadata"]["name"] for o in store.list()] == [keys.SETTINGS_CONFIGMAP]


@pytest.mark.both_minors
async def test_pods_listed_through_the_page_decoder_are_what_slim_pod_makes_of_the_servers_pods(
        plane: ControlPlane, admin: Client, namespace: str) -> None:
    spec = attrs.evolve(known.PODS, namespace=namespace)
    path = resource_path("", "v1", "pods", namespace=namespace)
    for i in range(5):
        pod = shapes.launcher_pod(namespace, f"vm-{i}", node="node-1")
        created = await admin.create(path, pod)
        await admin.merge_patch(f"{path}/{created['metadata']['name']}/status", shapes.launcher_pod_status(created))
    served = (await admin.list_objects(path))["items"]
    expected = {}
    for item in served:
        slim = slim_pod(item)
        expected[item["metadata"]["name"]] = {**slim, "apiVersion": "v1", "kind": "Pod"}
    async with plane.client() as client:
        cache = Cache(client, registry=CollectorRegistry(), settings=FAST)  # pages of 7: one page
        cache.add(spec)
        async with cache.running():
            await cache.wait_synced(spec, timeout=30)
            stored = {o["metadata"]["name"]: o for o in cache.store(spec).list()}
    assert stored == expected
    one = next(iter(stored.values()))
    assert "managedFields" not in one["metadata"]
    assert one["status"] == {"phase": "Running"}
    assert one["spec"]["containers"][0]["resources"]["limits"]
