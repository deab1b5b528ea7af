"""R-BIND-2 with a late watch: no pass decides from a view older than the last pass's own writes.

The binder's cache reads through the loopback proxy, which holds the GPUDevice
watch events back while the binder writes. The world is built so that a pass
deciding from the stale view books the same units twice *without* any write
conflicting: the class's nodeSelector narrows to zone b, so device A moves from
n1 to n2 (order B still has no room, so B is not written); the selector then
widens to both zones, so a stale view keeps A on n1, sees n2 free and binds B
there. B's resourceVersion is current, its write would succeed, and n2 would
hold four units of its two. (From the true view B goes to n1.) A housekeeping
pass waits for the binder's own writes until the watch catches up; the wait
times out (counted) and starts over, never deciding. A placement pass does
not wait: it reads its own placement writes back (assume) and decides from
the true view at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import attrs
from prometheus_client import CollectorRegistry

from cozygpu import keys
from cozygpu.base.clock import LoopClock
from cozygpu.binder.binder import PLACEMENT, REPORTS, Binder, BinderConfig
from cozygpu.binder.loop import binder_driver
from cozygpu.binder.metrics import BinderMetrics
from cozygpu.cache.cache import Cache
from cozygpu.devcluster.plane import ADMIN_GROUPS, ADMIN_USER, ControlPlane
from cozygpu.kube import Client, resource_path
from cozygpu.passes.driver import DriverConfig, Lane, PassDriver
from cozygpu.views import specs
from tests.binder.support import class_path, device_path
from tests.binder.world import NODES, World
from tests.support.proxy import Proxy
from tests.support.waiting import eventually

DEVICES_WATCH = resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL)


async def zone(world: World, short: str, name: str) -> None:
    await world.admin.merge_patch(f"{NODES}/{world.node_name(short)}", {"metadata": {"labels": {"zone": name}}})


async def select_zones(world: World, *zones: str) -> None:
    selector = {"matchExpressions": [{"key": "zone", "operator": "In", "values": list(zones)}]}
    await world.admin.merge_patch(class_path(world.gpu_class), {"spec": {"nodeSelector": selector}})


def passes(registry: CollectorRegistry, lane: Lane = PLACEMENT) -> float:
    return counted(registry, "cozygpu_passes_total", loop="binder", lane=lane.value, outcome="ok")


async def quiet(world: World, driver: PassDriver[Lane, Lane], registry: CollectorRegistry) -> None:
    """Placement passes until one writes no device, so nothing is unseen when the watch is held."""
    while True:
        before = [(await world.device(n))["metadata"]["resourceVersion"] for n in ("a", "b")]
        done = passes(registry)
        driver.request(PLACEMENT, "test")

        async def ran(done: float = done) -> bool:
            return passes(registry) > done

        await eventually(ran, interval=0.05, what="the requested placement pass did not run")
        if [(await world.device(n))["metadata"]["resourceVersion"] for n in ("a", "b")] == before:
            return


def counted(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def bound_units(world: World) -> dict[str, int]:
    units: dict[str, int] = {}
    for device in (await world.admin.list_objects(device_path(world.namespace)))["items"]:
        status = device.get("status") or {}
        if status.get("phase") == "Bound":
            units[status["nodeName"]] = units.get(status["nodeName"], 0) + int(device["spec"]["count"])
    return units


@attrs.frozen
class Rig:
    proxy: Proxy
    cache: Cache
    driver: PassDriver[Lane, Lane]
    registry: CollectorRegistry


@contextlib.asynccontextmanager
async def moved_behind_a_held_watch(plane: ControlPlane, world: World) -> AsyncIterator[Rig]:
    """The world of both tests, up to the move: a binder through the proxy has settled it (a held on n1 of
    zone a, b waiting for room), then holds the device watch and narrows the class to zone b, so a moves
    to n2 and b still has no room. The watch stays held when this yields."""
    await world.node("n1", 2)
    await world.node("n2", 2)
    await zone(world, "n1", "a")
    await zone(world, "n2", "b")
    await select_zones(world, "a")
    await world.order("a", 2, status=world.held("n1"))
    await world.order("b", 2)

    registry = CollectorRegistry()
    identity = plane.ssl_context(plane.identity(ADMIN_USER, ADMIN_GROUPS))
    async with Proxy(plane.host, identity) as proxy, Client(proxy.url, ssl_context=None) as through:
        cache = Cache(through, registry=registry)
        binder = Binder(cache, through, BinderConfig(identity="rbind2", gpu_enabled=True), clock=LoopClock(),
                        metrics=BinderMetrics.on(registry))
        driver = binder_driver(binder, cache, registry=registry, config=DriverConfig(sync_timeout=0.5))
        async with cache.running(), asyncio.TaskGroup() as tasks:
            await cache.wait_synced(*[k for k in binder.kinds if k.group in ("", keys.GROUP)], timeout=60)
            runner = tasks.create_task(driver.run())

            async def settled() -> bool:
                a, b = await world.device("a"), await world.device("b")
                conditions = (b.get("status") or {}).get("conditions") or []
                waits = any(c["type"] == "Bound" and c["status"] == "False" for c in conditions)
                guarded = all(keys.DEVICE_FINALIZER in d["metadata"].get("finalizers", ()) for d in (a, b))
                return waits and guarded

            await eventually(settled, interval=0.05,
                             what="order b never got its not-accepted condition, or a finalizer is missing")
            await quiet(world, driver, registry)

            proxy.hold_watch_events(DEVICES_WATCH)
            await select_zones(world, "b")

            async def moved() -> bool:
                return ((await world.device("a")).get("status") or {}).get("nodeName") == world.node_name("n2")

            await eventually(moved, interval=0.05, what="a was not moved off n1, which its class no longer selects")
            seen: Mapping[str, Any] = cache.store(specs.GPU_DEVICES).get(world.namespace, "a") or {}
            assert (seen.get("status") or {}).get("nodeName") == world.node_name("n1"), "the watch is held"
            yield Rig(proxy=proxy, cache=cache, driver=driver, registry=registry)
            runner.cancel()


async def test_housekeeping_waits_for_the_placement_writes_behind_a_late_watch_and_placement_does_not(
        plane: ControlPlane, world: World) -> None:
    """Read-your-writes per work: the move of a is unseen while the watch is held. The housekeeping works
    (attachments, reports, ...) wait for the cache to show it before they decide — their waits time out,
    counted, again and again — while placement, asked by the same event, reads its own write back and
    decides at once: b binds on n1, which a left, and no unit is booked twice."""
    async with moved_behind_a_held_watch(plane, world) as rig:
        timeouts = counted(rig.registry, "cozygpu_pass_write_sync_timeouts_total", loop="binder")
        reports = passes(rig.registry, REPORTS)

        await select_zones(world, "a", "b")  # a reason for every work's pass

        async def decided() -> bool:
            return ((await world.device("b")).get("status") or {}).get("phase") == "Bound"

        await eventually(decided, interval=0.05, what="placement waited behind the housekeeping works' wait")

        async def waited() -> bool:
            return counted(rig.registry, "cozygpu_pass_write_sync_timeouts_total", loop="binder") >= timeouts + 2

        await eventually(waited, interval=0.05, what="no housekeeping pass waited for the unseen move")
        assert passes(rig.registry, REPORTS) == reports, "a report pass decided from a view missing the move"
        units = await bound_units(world)
        assert all(held <= 2 for held in units.values()), f"units booked twice from a stale view: {units}"

        rig.proxy.release_watch_events(DEVICES_WATCH)

        async def caught_up() -> bool:
            return passes(rig.registry, REPORTS) > reports

        await eventually(caught_up, interval=0.05, what="no report pass ran once the watch caught up")

    # From the true view: a stays on n2, b takes n1; no node holds more than its two units.
    units = await bound_units(world)
    assert units == {world.node_name("n1"): 2, world.node_name("n2"): 2}, units
    assert (await world.device("b"))["status"]["nodeName"] == world.node_name("n1")


async def test_an_answer_pass_reads_its_own_placement_writes_back_behind_a_late_watch(
        plane: ControlPlane, world: World) -> None:
    """Assume (R-BIND-2): the next placement cycle decides behind a held watch, from the binder's own writes.

    The same world, up to the move; then the class widens to both zones and the answer lane is asked
    for. The placement pass does not wait for the watch to echo the move: it reads its own write back
    (``binder.Assumed``) and, from the true view, binds b on n1. Without the assumption it would wait for
    the watch (no decision until it is released), and deciding from the cache alone it books n2 twice.
    """
    async with moved_behind_a_held_watch(plane, world) as rig:
        widened = await world.admin.merge_patch(class_path(world.gpu_class), {"spec": {"nodeSelector": {
            "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}}})
        await rig.cache.wait_for_resource_version(specs.GPU_CLASSES.key, widened["metadata"]["resourceVersion"])
        rig.driver.request(PLACEMENT, "test")

        async def decided() -> bool:
            return ((await world.device("b")).get("status") or {}).get("phase") == "Bound"

        await eventually(decided, interval=0.05, what="the placement pass did not decide behind the held watch")
        units = await bound_units(world)
        assert all(held <= 2 for held in units.values()), f"units booked twice from a stale view: {units}"
        assert (await world.device("b"))["status"]["nodeName"] == world.node_name("n1")
        stale: Mapping[str, Any] = rig.cache.store(specs.GPU_DEVICES).get(world.namespace, "a") or {}
        assert (stale.get("status") or {}).get("nodeName") == world.node_name("n1"), "decided behind the watch"
        rig.proxy.release_watch_events(DEVICES_WATCH)
