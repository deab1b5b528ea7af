"""The reflector lists, watches from the list's resourceVersion, and relists only when it must."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from cozygpu.cache.decoders import DecodedPage, decode_pod_page
from cozygpu.cache.informer import Informer
from cozygpu.cache.kinds import KindSpec
from cozygpu.cache.metrics import CacheMetrics
from cozygpu.cache.reflector import Reflector, ReflectorSettings
from cozygpu.cache.store import Event, index_field
from cozygpu.cache.transforms import slim_pod
from cozygpu.kube import errors
from tests.cache.fakes import FakeApi, FakeClock, until
from tests.support.clock import settle

SPEC = KindSpec("gpu.cozystack.io", "v1alpha1", "gpudevices", "GPUDevice", True,
                indexers={"node": index_field("status", "nodeName")})
PATH = SPEC.path


def device(name: str, namespace: str = "tenant-a", node: str | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUDevice",
                           "metadata": {"name": name, "namespace": namespace}, "spec": {"count": 1}}
    if node:
        obj["status"] = {"nodeName": node}
    return obj


class Running:
    def __init__(self, api: FakeApi, clock: FakeClock, registry: CollectorRegistry,
                 settings: ReflectorSettings) -> None:
        self.api = api
        self.clock = clock
        self.registry = registry
        self.informer = Informer(SPEC)
        self.events: list[Event] = []
        self.informer.subscribe(self.events.append)
        self.reflector = Reflector(api, SPEC, self.informer.begin_cycle(), clock=clock,
                                   metrics=CacheMetrics(registry), settings=settings, rng=random.Random(7))
        self.task: asyncio.Task[None] | None = None

    def state(self) -> dict[tuple[str, str], str]:
        return {(o["metadata"]["namespace"], o["metadata"]["name"]): o["metadata"]["resourceVersion"]
                for o in self.informer.store.list()}

    async def converged(self) -> None:
        await until(lambda: self.informer.has_synced and self.state() == self.api.state(PATH)
                    and len(self.api.open_watches) == 1)

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, {"kind": SPEC.key, **labels}) or 0.0


@pytest.fixture
async def running(api: FakeApi, clock: FakeClock, registry: CollectorRegistry) -> AsyncIterator[Running]:
    run = Running(api, clock, registry, ReflectorSettings(page_size=2, inactivity_timeout=100.0))
    run.task = asyncio.create_task(run.reflector.run())
    yield run
    run.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run.task


async def test_it_lists_in_pages_then_watches_from_the_lists_resource_version(api: FakeApi,
                                                                              clock: FakeClock,
                                                                              registry: CollectorRegistry) -> None:
    for i in range(5):
        api.put(PATH, device(f"d{i}"))
    run = Running(api, clock, registry, ReflectorSettings(page_size=2))
    task = asyncio.create_task(run.reflector.run())
    try:
        await until(lambda: len(api.open_watches) == 1)
        assert [params.get("continue") for _, params in api.list_calls] == [None, "105:2", "105:4"]
        assert all(params["limit"] == 2 for _, params in api.list_calls)
        assert all(headers == {"Accept-Encoding": "identity"} for headers in api.list_headers)
        _, watch = api.watch_calls[0]
        assert watch["resourceVersion"] == "105"
        assert watch["allowWatchBookmarks"] is True
        assert 300 <= watch["timeoutSeconds"] <= 600
        assert run.informer.has_synced
        assert len(run.informer.store) == 5
        assert [e.type for e in run.events] == ["ADDED"] * 5
        assert run.metric("cozygpu_cache_relists_total", reason="initial") == 1
    finally:
        task.cancel()


async def test_objects_from_a_list_look_like_objects_from_a_watch(running: Running) -> None:
    running.api.put(PATH, device("listed"))
    await running.converged()
    running.api.put(PATH, device("watched"))
    await running.converged()
    listed = running.informer.store.get("tenant-a", "listed")
    watched = running.informer.store.get("tenant-a", "watched")
    assert listed is not None
    assert watched is not None
    assert (listed["apiVersion"], listed["kind"]) == (watched["apiVersion"], watched["kind"])
    assert listed["kind"] == "GPUDevice"


async def test_watch_events_reach_the_store_and_handlers_in_order(running: Running) -> None:
    await running.converged()
    api = running.api
    api.put(PATH, device("d1", node="n1"))
    api.put(PATH, device("d1", node="n2"))
    api.put(PATH, device("d2", node="n2"))
    api.remove(PATH, "tenant-a", "d1")
    await running.converged()
    assert [(e.type, e.obj["metadata"]["name"]) for e in running.events] == [
        ("ADDED", "d1"), ("MODIFIED", "d1"), ("ADDED", "d2"), ("DELETED", "d1")]
    assert [o["metadata"]["name"] for o in running.informer.store.by_index("node", "n2")] == ["d2"]
    assert running.informer.resource_version == str(api.rv)
    assert running.metric("cozygpu_cache_events_total", type="ADDED") == 2


async def test_bookmarks_advance_the_resource_version_without_reaching_handlers(running: Running) -> None:
    await running.converged()
    running.api.bookmark()
    await until(lambda: running.informer.resource_version == str(running.api.rv))
    assert running.events == []
    assert running.metric("cozygpu_cache_events_total", type="BOOKMARK") == 1


async def test_a_cut_watch_backs_off_then_watches_again_from_the_last_resource_version(running: Running) -> None:
    api, clock = running.api, running.clock
    api.put(PATH, device("d1"))
    await running.converged()
    api.put(PATH, device("d2"))
    await running.converged()
    seen_rv = running.informer.resource_version
    api.cut()
    await until(lambda: len(clock.sleeps) == 1)
    assert 0.8 <= clock.sleeps[0] <= 1.6
    api.put(PATH, device("d3"))  # written while disconnected
    clock.advance(clock.sleeps[0])
    await running.converged()
    assert len(api.list_calls) == 1, "a cut connection must not cost a relist"
    assert api.watch_calls[-1][1]["resourceVersion"] == seen_rv
    assert running.metric("cozygpu_cache_watch_restarts_total", reason="error") == 1


async def test_a_410_relists_without_lost_or_phantom_objects(running: Running) -> None:
    api, clock = running.api, running.clock
    for name in ("kept", "changed", "deleted"):
        api.put(PATH, device(name))
    await running.converged()
    running.events.clear()
    api.cut()
    await until(lambda: len(clock.sleeps) == 1)
    api.put(PATH, device("changed", node="n9"))
    api.remove(PATH, "tenant-a", "deleted")
    api.put(PATH, device("added"))
    api.compact(PATH)
    clock.advance(clock.sleeps[-1])
    await until(lambda: len(clock.sleeps) == 2)  # the 410's short backoff
    assert clock.sleeps[1] <= 0.2
    clock.advance(clock.sleeps[-1])
    await running.converged()
    assert [params.get("continue") for _, params in api.list_calls] == [None, None, "106:2"]
    assert {(e.type, e.obj["metadata"]["name"]) for e in running.events} == {
        ("MODIFIED", "changed"), ("DELETED", "deleted"), ("ADDED", "added")}
    assert [o["metadata"]["name"] for o in running.informer.store.by_index("node", "n9")] == ["changed"]
    assert running.metric("cozygpu_cache_relists_total", reason="expired") == 1


async def test_an_error_event_410_on_an_open_watch_relists(running: Running) -> None:
    await running.converged()
    running.api.expire_watches()
    await until(lambda: len(running.clock.sleeps) == 1)
    running.clock.advance(running.clock.sleeps[0])
    await until(lambda: len(running.api.list_calls) == 2)
    await running.converged()
    assert running.metric("cozygpu_cache_watch_restarts_total", reason="expired") == 1


async def test_an_expired_continue_token_starts_the_list_over(api: FakeApi, clock: FakeClock,
                                                              registry: CollectorRegistry) -> None:
    for i in range(4):
        api.put(PATH, device(f"d{i}"))
    api.compacted[PATH] = 10_000  # every continue token is too old
    run = Running(api, clock, registry, ReflectorSettings(page_size=2))
    task = asyncio.create_task(run.reflector.run())
    try:
        await until(lambda: len(clock.sleeps) == 1)
        assert not run.informer.has_synced, "a partial list must never be stored"
        api.compacted[PATH] = 0
        clock.advance(clock.sleeps[0])
        await run.converged()
        assert [params.get("continue") for _, params in api.list_calls] == [None, "104:2", None, "104:2"]
    finally:
        task.cancel()


async def test_a_silent_watch_is_dropped_and_watched_again(running: Running) -> None:
    await running.converged()
    assert len(running.api.watch_calls) == 1
    running.clock.advance(60.0)
    running.api.bookmark()  # activity pushes the deadline back
    await until(lambda: running.informer.resource_version == str(running.api.rv))
    running.clock.advance(60.0)  # 120 s since the watch began, 60 s since the bookmark
    await settle()  # every task that can run without time passing runs: a restart would be seen
    assert len(running.api.watch_calls) == 1, "the bookmark pushed the inactivity deadline back"
    running.clock.advance(40.0)  # 100 s since the bookmark
    await until(lambda: len(running.api.watch_calls) == 2)
    assert running.api.watch_calls[1][1]["resourceVersion"] == str(running.api.rv)
    assert running.clock.sleeps == [], "an inactive watch restarts at once"
    assert running.metric("cozygpu_cache_watch_restarts_total", reason="inactive") == 1
    await until(lambda: len(running.api.open_watches) == 1)  # the silent stream closed, a new one open


async def test_a_watch_the_server_ends_is_watched_again_at_once(running: Running) -> None:
    running.api.put(PATH, device("d1"))
    await running.converged()
    running.clock.advance(2.0)
    running.api.end_watches()  # the server's timeoutSeconds passed
    await until(lambda: len(running.api.watch_calls) == 2)
    assert running.clock.sleeps == []
    assert len(running.api.list_calls) == 1
    assert running.metric("cozygpu_cache_watch_restarts_total", reason="closed") == 1


async def test_a_server_that_ends_watches_at_once_is_backed_off_from(running: Running) -> None:
    await running.converged()
    running.api.end_watches()
    await until(lambda: len(running.clock.sleeps) == 1)
    assert len(running.api.watch_calls) == 1


async def test_failing_lists_back_off_exponentially_until_one_succeeds(api: FakeApi, clock: FakeClock,
                                                                      registry: CollectorRegistry) -> None:
    api.put(PATH, device("d1"))
    api.fail_lists = [errors.Unavailable("refused"), errors.ServerError(503, {}), errors.Forbidden(403, {})]
    run = Running(api, clock, registry, ReflectorSettings())
    task = asyncio.create_task(run.reflector.run())
    try:
        for n in (1, 2, 3):
            await until(lambda n=n: len(clock.sleeps) == n)  # type: ignore[misc]
            assert not run.informer.has_synced
            clock.advance(clock.sleeps[-1])
        await run.converged()
        base = [0.8, 1.6, 3.2]
        assert all(b <= s <= 2 * b for b, s in zip(base, clock.sleeps, strict=True)), clock.sleeps
    finally:
        task.cancel()


async def test_an_unexpected_error_is_retried_not_raised(api: FakeApi, clock: FakeClock,
                                                         registry: CollectorRegistry) -> None:
    api.fail_lists = [RuntimeError("a bug somewhere below")]
    run = Running(api, clock, registry, ReflectorSettings())
    task = asyncio.create_task(run.reflector.run())
    try:
        await until(lambda: len(clock.sleeps) == 1)
        clock.advance(clock.sleeps[0])
        await run.converged()
        assert not task.done()
    finally:
        task.cancel()


async def test_a_transform_that_fails_on_one_object_holds_the_kind_back_loudly(api: FakeApi, clock: FakeClock,
                                                                               registry: CollectorRegistry) -> None:
    def transform(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["metadata"]["name"] == "bad":
            raise ValueError("cannot shrink this one")
        return obj

    spec = KindSpec("gpu.cozystack.io", "v1alpha1", "gpudevices", "GPUDevice", True, transform=transform)
    api.put(PATH, device("bad"))
    informer = Informer(spec)
    reflector = Reflector(api, spec, informer.begin_cycle(), clock=clock, metrics=CacheMetrics(registry))
    task = asyncio.create_task(reflector.run())
    try:
        await until(lambda: len(clock.sleeps) == 1)
        assert not informer.has_synced
        api.remove(PATH, "tenant-a", "bad")
        clock.advance(clock.sleeps[0])
        await until(lambda: informer.has_synced)
    finally:
        task.cancel()


async def test_cancelling_the_reflector_closes_its_watch(running: Running) -> None:
    await running.converged()
    assert len(running.api.open_watches) == 1
    assert running.task is not None
    running.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running.task
    assert running.api.open_watches == []


async def test_a_kind_with_a_page_decoder_stores_the_decoded_pages_and_shares_what_did_not_change(
        api: FakeApi, clock: FakeClock, registry: CollectorRegistry) -> None:
    pages: list[int] = []

    def decoder(raw: bytes) -> DecodedPage:
        pages.append(len(raw))
        return decode_pod_page(raw)

    pods = KindSpec("", "v1", "pods", "Pod", True, transform=slim_pod, page_decoder=decoder)
    for i in range(3):
        api.put(pods.path, {"metadata": {"name": f"p{i}", "namespace": "t", "managedFields": [{"manager": "m"}]},
                            "spec": {"nodeName": "n1", "volumes": [{"name": "v"}]}, "status": {"phase": "Running"}})
    informer = Informer(pods)
    reflector = Reflector(api, pods, informer.begin_cycle(), clock=clock, metrics=CacheMetrics(registry),
                          settings=ReflectorSettings(page_size=2))
    task = asyncio.create_task(reflector.run())
    try:
        await until(lambda: informer.has_synced and len(api.open_watches) == 1)
        assert len(pages) == 2, "both pages went through the decoder"
        listed = informer.store.get("t", "p0")
        assert listed == {"metadata": {"name": "p0", "namespace": "t", "resourceVersion": "101"},
                          "spec": {"nodeName": "n1"}, "status": {"phase": "Running"},
                          "apiVersion": "v1", "kind": "Pod"}
        api.put(pods.path, {"metadata": {"name": "p1", "namespace": "t"}, "spec": {"nodeName": "n2", "volumes": []}})
        await until(lambda: informer.resource_version == str(api.rv))
        watched = informer.store.get("t", "p1")
        assert watched == {"metadata": {"name": "p1", "namespace": "t", "resourceVersion": str(api.rv)},
                           "spec": {"nodeName": "n2"}, "apiVersion": "v1", "kind": "Pod"}, "a watch event slims alike"

        api.expire_watches()
        await until(lambda: len(clock.sleeps) == 1)
        clock.advance(clock.sleeps[0])
        await until(lambda: len(pages) == 4 and len(api.open_watches) == 1)
        assert informer.store.get("t", "p0") is listed, "an unchanged object is kept, not replaced by a copy"
        assert informer.store.get("t", "p1") is watched
    finally:
        task.cancel()


async def test_a_burst_of_buffered_watch_events_lets_the_loop_go_between_slices(running: Running) -> None:
    """Events already buffered come without a suspension; folding a thousand of them must not hold every other
    task of the replica (a webhook, a lease renewal) until the last is folded."""
    await running.converged()
    folded_at_ticks: list[int] = []
    running.informer.subscribe(lambda _event: running.clock.advance(0.001))  # each event's fold takes a ms

    async def ticker() -> None:
        while True:
            folded_at_ticks.append(len(running.events))
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        for i in range(100):  # queued on the open watch before the reflector reads any of them
            running.api.put(PATH, device(f"burst-{i}"))
        await until(lambda: len(running.events) == 100)
    finally:
        task.cancel()
    during = sorted({n for n in folded_at_ticks if 0 < n < 100})
    assert len(during) >= 100 * 0.001 / 0.004 - 2, f"the loop ran at {during} events folded of 100"
