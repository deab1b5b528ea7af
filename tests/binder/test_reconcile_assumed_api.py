"""The always-on reconcilers read the binder's own placement writes back, as placement does (R-BIND-2, R-BIND-9).

A new order has no finalizer yet; the pass that binds it writes its status and then, in the
same pass, the finalizer reconciler adds the finalizer. The status write moved the order's
resourceVersion; if the reconciler read the order from the cache, which the held watch keeps
at the old version, its patch would be refused (409) and the whole pass would run again.
"""

from __future__ import annotations

from cozygpu import keys
from cozygpu.devcluster.plane import ADMIN_GROUPS, ADMIN_USER, ControlPlane
from cozygpu.kube import Client, resource_path
from cozygpu.passes.writes import Writes
from cozygpu.views import specs
from tests.binder.world import World, running_binder, seen_by
from tests.support.proxy import Proxy

DEVICES_WATCH = resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL)


async def test_the_finalizer_of_a_new_order_is_added_on_the_version_its_placement_wrote(
        plane: ControlPlane, world: World) -> None:
    await world.node("n1", 2)
    identity = plane.ssl_context(plane.identity(ADMIN_USER, ADMIN_GROUPS))
    async with (Proxy(plane.host, identity) as proxy, Client(proxy.url, ssl_context=None) as through,
                running_binder(world.admin, through=through) as running):
        for _ in range(10):  # what earlier tests left in the shared plane settles first
            if not (await running.each_lane()).pending():
                break
        order = await world.order("new", 1)
        await seen_by(running, specs.GPU_DEVICES.key, order)
        proxy.hold_watch_events(DEVICES_WATCH)
        try:
            await running.each_lane(writes := Writes(), seen=False)
        finally:
            proxy.release_watch_events(DEVICES_WATCH)
        await running.seen(writes)

    written = await world.device("new")
    assert written["status"]["phase"] == "Bound", written.get("status")
    assert keys.DEVICE_FINALIZER in written["metadata"].get("finalizers", ()), written["metadata"]
