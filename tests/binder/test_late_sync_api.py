"""A binder kind that syncs late holds the first pass until it is listed: no pass waits, fails or backs off.

The binder's cache reads the real API server through a client that holds the
first list of tenant ResourceQuotas back until the test lets it go (an API
server slow to answer one list, as at a controller's start under load). Every
other kind lists at once. The driver must not start a pass before the cache
knows every kind the binder reads: before, the start pass raised
``NotSynced``, was counted ``waiting`` and held the lane on the failure
backoff (1 s doubling to 30 s, grown by every event that woke it meanwhile).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from cozygpu import keys
from cozygpu.base.clock import LoopClock
from cozygpu.binder.binder import LANES, PLACEMENT, Binder, BinderConfig
from cozygpu.binder.loop import binder_driver
from cozygpu.binder.metrics import BinderMetrics
from cozygpu.cache.cache import Cache
from cozygpu.kube import Client
from cozygpu.passes.driver import Lane
from cozygpu.views import specs
from tests.binder.world import World
from tests.support.waiting import eventually


class LateList:
    """The cache's client: the real one, except that lists of ``path`` wait until ``release()``."""

    def __init__(self, client: Client, path: str) -> None:
        self._client = client
        self._path = path
        self._released = asyncio.Event()
        self.held = 0

    def release(self) -> None:
        self._released.set()

    async def _gate(self, path: str) -> None:
        if path == self._path and not self._released.is_set():
            self.held += 1
            await self._released.wait()

    async def list_objects(self, path: str, *, params: Mapping[str, str | int | bool] | None = None,
                           **kw: Any) -> dict[str, Any]:
        await self._gate(path)
        return await self._client.list_objects(path, params=params, **kw)

    async def list_bytes(self, path: str, *, params: Mapping[str, str | int | bool] | None = None,
                         **kw: Any) -> bytes:
        await self._gate(path)
        return await self._client.list_bytes(path, params=params, **kw)

    def watch(self, path: str, *, params: Mapping[str, str | int | bool] | None = None, read_timeout: float = 300.0,
              connect_timeout: float = 10.0) -> AsyncIterator[dict[str, Any]]:
        return self._client.watch(path, params=params, read_timeout=read_timeout, connect_timeout=connect_timeout)

    async def get(self, path: str, **kw: Any) -> dict[str, Any]:
        return await self._client.get(path, **kw)


def passes(registry: CollectorRegistry, lane: Lane, outcome: str) -> float:
    return registry.get_sample_value("cozygpu_passes_total", {"loop": "binder", "lane": lane.value,
                                                              "outcome": outcome}) or 0.0


async def test_a_kind_that_syncs_late_holds_the_first_pass_until_listed_and_no_pass_waits_or_fails(
        admin: Client, world: World) -> None:
    await world.node("n1", 4)
    await world.order("a", 2)

    registry = CollectorRegistry()
    late = LateList(admin, specs.TENANT_QUOTAS.path)
    cache = Cache(late, registry=registry)
    binder = Binder(cache, admin, BinderConfig(identity="late-sync", gpu_enabled=True), clock=LoopClock(),
                    metrics=BinderMetrics.on(registry))
    driver = binder_driver(binder, cache, registry=registry)
    try:
        async with cache.running(), asyncio.TaskGroup() as tasks:
            runner = tasks.create_task(driver.run())
            others = [k for k in binder.kinds if k.group in ("", keys.GROUP) and k is not specs.TENANT_QUOTAS]
            await cache.wait_synced(*others, timeout=60)

            async def held() -> bool:
                return late.held > 0 and driver.waiting_for(PLACEMENT) == {specs.TENANT_QUOTAS.key}

            await eventually(held, interval=0.05, what="the driver is not waiting for the held ResourceQuota list")
            assert not cache.has_synced(specs.TENANT_QUOTAS)
            ran = {(lane, outcome): passes(registry, lane, outcome) for lane in LANES
                   for outcome in ("ok", "requeued", "waiting", "failed")}
            assert not any(ran.values()), f"a pass ran before every binder kind was listed: {ran}"

            late.release()

            async def bound() -> bool:
                phase = ((await world.device("a")).get("status") or {}).get("phase")
                # The pass is counted when it ends, after its writes.
                return phase == "Bound" and passes(registry, PLACEMENT, "ok") >= 1

            await eventually(bound, interval=0.05, what="the order was not bound once the kind was listed")
            for lane in LANES:
                assert passes(registry, lane, "waiting") == 0, f"a {lane.value} pass waited on the failure backoff"
                assert passes(registry, lane, "failed") == 0
            assert all(driver.waiting_for(lane) == frozenset() for lane in LANES)
            runner.cancel()
    finally:
        binder.close()
