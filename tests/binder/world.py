"""A small GPU world in the real API server for the binder's tests, and a binder running over a real cache.

Every test gets its own resource name and class (``World.make``), so the
nodes and classes other tests leave in the shared plane never serve it; a
node here is a plain Node made Ready by a status write (the fast plane runs
no node controller) plus its GPUNode report, unless the test brings kwok
nodes of the full plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
from prometheus_client import CollectorRegistry

from cozygpu import keys
from cozygpu.base.clock import LoopClock
from cozygpu.binder.assumed import StaleWrites
from cozygpu.binder.binder import VERIFY, Binder, BinderConfig
from cozygpu.binder.loop import binder_driver
from cozygpu.binder.metrics import BinderMetrics
from cozygpu.cache.cache import Cache
from cozygpu.cache.kinds import KindSpec
from cozygpu.kube import Client, resource_path
from cozygpu.passes.driver import Progress
from cozygpu.passes.writes import Writes
from tests.binder.support import class_path, device_path

NODES = resource_path("", "v1", "nodes")
GPUNODES = resource_path(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL)


def stamp(when: datetime | None = None) -> str:
    return (when or datetime.now(UTC)).isoformat(timespec="seconds").replace("+00:00", "Z")


@attrs.define
class World:
    admin: Client
    namespace: str
    tag: str
    resource: str
    gpu_class: str

    @classmethod
    async def make(cls, admin: Client, namespace: str, *, on_cordon: str | None = None) -> World:
        tag = uuid.uuid4().hex[:6]
        world = cls(admin, namespace, tag, f"nvidia.com/TEST_{tag}", f"gpu-{tag}")
        spec: dict[str, Any] = {"vendor": "NVIDIA", "model": "H100", "mode": "Passthrough", "memory": "80Gi",
                                "resourceName": world.resource, "source": {"devicePlugin": {}}}
        if on_cordon:
            spec["onCordon"] = on_cordon
        await admin.create(class_path(), {"apiVersion": keys.API_VERSION, "kind": keys.GPUCLASS_KIND,
                                          "metadata": {"name": world.gpu_class}, "spec": spec})
        return world

    def node_name(self, short: str) -> str:
        return f"{short}-{self.tag}"

    async def node(self, short: str, units: int, *, ready: bool = True, create_node: bool = True) -> str:
        """A Ready Node (unless ``create_node`` is False: kwok's) and its GPUNode serving ``units``."""
        name = self.node_name(short)
        if create_node:
            await self.admin.create(NODES, {"metadata": {"name": name}})
            await self.set_ready(short, ready)
        await self.admin.create(GPUNODES, {"apiVersion": keys.API_VERSION, "kind": keys.GPUNODE_KIND,
                                           "metadata": {"name": name}})
        await self.report(short, units)
        return name

    async def set_ready(self, short: str, ready: bool) -> None:
        condition = {"type": "Ready", "status": "True" if ready else "False", "reason": "Test",
                     "lastHeartbeatTime": stamp(), "lastTransitionTime": stamp()}
        await self.admin.merge_patch(f"{NODES}/{self.node_name(short)}/status", {"status": {"conditions": [condition]}})

    async def report(self, short: str, units: int) -> None:
        devices = [{"address": f"0000:{i + 1:02x}:00.0", "resourceName": self.resource, "allocatable": 1,
                    "driver": "vfio-pci"} for i in range(units)]
        await self.admin.merge_patch(f"{GPUNODES}/{self.node_name(short)}/status", {"status": {
            "devices": devices, "resourceNames": [self.resource], "agent": {"lastReport": stamp()}}})

    async def order(self, name: str, count: int = 1, *, status: Mapping[str, Any] | None = None) -> dict[str, Any]:
        body = {"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND, "metadata": {"name": name},
                "spec": {"className": self.gpu_class, "count": count}}
        made: dict[str, Any] = await self.admin.create(device_path(self.namespace), body)
        if status:
            made = await self.admin.merge_patch(device_path(self.namespace, name, status=True),
                                                {"status": dict(status)})
        return made

    def held(self, short: str) -> dict[str, Any]:
        return {"phase": "Bound", "nodeName": self.node_name(short)}

    async def device(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = await self.admin.get(device_path(self.namespace, name))
        return found

    async def cleanup(self) -> None:
        for path in (NODES, GPUNODES):
            listed = await self.admin.list_objects(path)
            for obj in listed["items"]:
                if obj["metadata"]["name"].endswith(f"-{self.tag}"):
                    await self.admin.delete(f"{path}/{obj['metadata']['name']}")


@attrs.define
class RunningBinder:
    """A binder over a running cache; a test calls its passes itself and waits for their writes."""

    binder: Binder
    cache: Cache
    metrics: BinderMetrics

    async def each_lane(self, writes: Writes | None = None, *, seen: bool = True) -> Writes:
        """Each of the binder's lanes, in the driver's order, each once the cache shows the writes before it
        (the assumed ones but to placement, which reads them back itself), and again while it says it stopped
        at a slice's end with more to do (``Progress.MORE``): what the driver does when every lane is due. A
        write refused by placement or claims raises ``StaleWrites`` once all have run. ``seen``: wait at the
        end until the cache shows every write."""
        writes = Writes() if writes is None else writes
        stale = 0
        try:
            for lane, run in self.binder.lanes().items():
                if lane is VERIFY:
                    continue
                progress: Progress | None = Progress.MORE
                while progress is Progress.MORE:
                    if not lane.reads_assumed:
                        for key, version in writes.items(assumed=False):
                            await self.cache.wait_for_resource_version(key, version, timeout=30)
                    try:
                        progress = await run(writes, lambda: False)
                    except StaleWrites as error:
                        stale += error.count
                        progress = None
        finally:
            if seen:
                await self.seen(writes)
                await self.binder.events.flush()  # as the driver's companion sends them, after the pass's writes
        if stale:
            raise StaleWrites(stale)
        return writes

    async def placement_pass(self) -> Writes:
        writes = Writes()
        try:
            await self.binder.placement.run(writes)
        finally:
            await self.seen(writes)
            await self.binder.events.flush()
        return writes

    async def seen(self, writes: Writes) -> None:
        for key, version in writes.items():
            await self.cache.wait_for_resource_version(key, version, timeout=30)

    async def synced(self) -> None:
        """Every kind the binder reads known: its own and the core ones listed, KubeVirt's and Cozystack's
        listed or known not to be served (an earlier test may have installed their CRDs in the shared plane)."""
        await self.cache.wait_synced(*[s for s in self.binder.kinds if s.group in ("", keys.GROUP)], timeout=60)
        for spec in self.binder.kinds:
            informer = self.cache.informer(spec)
            trigger = self.cache.trigger(spec, name="known")  # fires on the first list and on served changes
            try:
                async with asyncio.timeout(60):
                    while not (informer.has_synced or informer.served is False):
                        await trigger.wait()
            finally:
                informer.remove_trigger(trigger)


@contextlib.asynccontextmanager
async def running_binder(admin: Client, *, gpu_enabled: bool = True, through: Client | None = None,
                         **config: Any) -> AsyncIterator[RunningBinder]:
    """``through``: the client the cache and the binder use (say, one through the loopback proxy)."""
    registry = CollectorRegistry()
    client = through or admin
    cache = Cache(client, registry=registry)
    metrics = BinderMetrics.on(registry)
    # Tests run passes by hand, with no driver to answer a report reminder: every report goes out at once
    # unless the test asks for report_every itself.
    config.setdefault("report_every", timedelta(0))
    binder = Binder(cache, client, BinderConfig(identity="test-binder", gpu_enabled=gpu_enabled, **config),
                    clock=LoopClock(), metrics=metrics)
    async with cache.running():
        running = RunningBinder(binder, cache, metrics)
        await running.synced()
        with binder.term():  # the works follow the cache's events, as in a leader term
            yield running


async def seen_by(running: RunningBinder, spec_key: str, obj: Mapping[str, Any]) -> None:
    """Wait until the binder's cache holds ``obj`` at its resourceVersion (or later)."""
    await running.cache.wait_for_resource_version(spec_key, str(obj["metadata"]["resourceVersion"]), timeout=30)


async def cache_until(running: RunningBinder, spec: KindSpec, predicate: Callable[[], bool],
                      timeout: float = 30.0) -> None:
    """Wait, on the kind's trigger, until ``predicate`` holds for the binder's cache."""
    trigger = running.cache.trigger(spec, name="test")
    try:
        async with asyncio.timeout(timeout):
            while not predicate():
                await trigger.wait()
    finally:
        running.cache.informer(spec).remove_trigger(trigger)


@contextlib.asynccontextmanager
async def driven_binder(admin: Client, grace: timedelta) -> AsyncIterator[Binder]:
    """A binder over a running cache on its own pass driver, as the leader runs it (passes start by themselves)."""
    registry = CollectorRegistry()
    cache = Cache(admin, registry=registry)
    binder = Binder(cache, admin, BinderConfig(identity="driven", gpu_enabled=True, launcher_grace=grace,
                                               report_every=timedelta(0)),
                    clock=LoopClock(), metrics=BinderMetrics.on(registry))
    driver = binder_driver(binder, cache, registry=registry)
    try:
        async with cache.running(), asyncio.TaskGroup() as tasks:
            runner = tasks.create_task(driver.run())
            try:
                yield binder
            finally:
                runner.cancel()
    finally:
        binder.close()
