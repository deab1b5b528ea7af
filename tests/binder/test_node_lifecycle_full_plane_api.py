"""The binder follows nodes the real components change (R-BIND-5), on the full plane.

A kwok node whose heartbeats stop is marked NotReady and tainted unreachable by
the real node-lifecycle controller of kube-controller-manager — nothing here
writes its status — and the binder moves the set it held to a healthy node;
a node tainted by its operator loses its set the same way. The binder runs
over a real cache; its passes run on the driver, triggered by the Node events.
"""

from __future__ import annotations

import asyncio
import uuid

from prometheus_client import CollectorRegistry

from cozygpu.base.clock import LoopClock
from cozygpu.binder.binder import Binder, BinderConfig
from cozygpu.binder.loop import binder_driver
from cozygpu.binder.metrics import BinderMetrics
from cozygpu.cache.cache import Cache
from cozygpu.devcluster import nodes
from cozygpu.kube import Client
from tests.binder.world import World
from tests.support.planes import Fleet
from tests.support.waiting import eventually

NAMESPACES = "/api/v1/namespaces"


async def test_sets_leave_a_node_the_node_controller_finds_dead_and_a_node_its_operator_taints(
        full_admin: Client, fleet: Fleet) -> None:
    admin = full_admin
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    await admin.create(NAMESPACES, {"metadata": {"name": tenant}})
    world = await World.make(admin, tenant)
    names = {short: world.node_name(short) for short in ("dead", "tainted", "spare")}
    await fleet(*(nodes.SimNode(name, gpus={world.resource: 2}) for name in names.values()))
    for short in names:
        await world.node(short, 2, create_node=False)
    await world.order("on-dead", 2, status=world.held("dead"))
    await world.order("on-tainted", 2, status=world.held("tainted"))

    registry = CollectorRegistry()
    cache = Cache(admin, registry=registry)
    binder = Binder(cache, admin, BinderConfig(identity="lifecycle", gpu_enabled=True), clock=LoopClock(),
                    metrics=BinderMetrics.on(registry))
    driver = binder_driver(binder, cache, registry=registry)
    try:
        async with cache.running(), asyncio.TaskGroup() as tasks:
            runner = tasks.create_task(driver.run())

            async def where(name: str) -> tuple[str | None, str | None]:
                status = (await world.device(name)).get("status") or {}
                return status.get("phase"), status.get("nodeName")

            await nodes.stop_heartbeats(admin, names["dead"])

            async def left_dead() -> bool:
                return await where("on-dead") == ("Bound", names["spare"])

            await eventually(left_dead, timeout=120, what="the set stayed on the node the controller found dead")
            dead = await admin.get(f"{nodes.NODES}/{names['dead']}")
            assert not nodes.is_ready(dead), "it moved before the node controller said the node was NotReady"
            condition = next(c for c in (await world.device("on-dead"))["status"]["conditions"]
                             if c["type"] == "Bound")
            assert condition["reason"] == "Moved"
            assert names["dead"] in condition["message"]

            # No room left anywhere healthy: the tainted node's set goes Lost, and says why.
            await admin.merge_patch(f"{nodes.NODES}/{names['tainted']}", {"spec": {"taints": [
                {"key": "maintenance", "value": "true", "effect": "NoSchedule"}]}})

            async def lost() -> bool:
                return (await where("on-tainted"))[0] == "Lost"

            await eventually(lost, timeout=60, what="the set stayed on a node whose taint it does not tolerate")
            condition = next(c for c in (await world.device("on-tainted"))["status"]["conditions"]
                             if c["type"] == "Bound")
            assert "maintenance" in condition["message"]
            runner.cancel()
    finally:
        await nodes.resume_heartbeats(admin, names["dead"])
        await world.cleanup()
